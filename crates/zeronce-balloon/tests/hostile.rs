//! A hostile guest: one test per class of malformed input. Each checks the typed error's
//! counter, that the descriptor comes back with `used_len` 0 (or is held, on statsq),
//! that nothing was discarded (the recording discarder also panics on any discard
//! outside guest RAM), and that the queue keeps serving a well-formed request after.
//! Errors at the device's edges (config space, readiness, features) are in
//! `hostile_device.rs`.

mod common;

use common::hostile::*;
use common::*;
use vm_memory::{Bytes, GuestAddress};
use zeronce_balloon::guest_ring::{DriverBuf, DESC_F_NEXT};
use zeronce_balloon::mock::RecordingDiscarder;
use zeronce_balloon::{Backing, BalloonOptions, MalformedKind, QueueKind};

#[test]
fn pfns_outside_guest_memory_or_in_holes() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    for pfn in [(HOLE >> 12) as u32, ((12 * MIB) >> 12) as u32, u32::MAX] {
        let bufs = rig.inflate_bufs(&[0x300, pfn], Some(1));
        refused(
            &mut rig,
            QueueKind::Inflate,
            &bufs,
            MalformedKind::OutOfGuestMemory,
        );
    }
    let bufs = rig.inflate_bufs(&[(HOLE >> 12) as u32], None);
    refused(
        &mut rig,
        QueueKind::Deflate,
        &bufs,
        MalformedKind::OutOfGuestMemory,
    );
    let hole = [DriverBuf::write(HOLE, 0x1000)];
    refused(
        &mut rig,
        QueueKind::Reporting,
        &hole,
        MalformedKind::OutOfGuestMemory,
    );
    // A PFN array that itself lies in the hole.
    let arr = [DriverBuf::read(HOLE, 4), DriverBuf::write(DATA + 0x8000, 1)];
    refused(
        &mut rig,
        QueueKind::Inflate,
        &arr,
        MalformedKind::OutOfGuestMemory,
    );
}

#[test]
fn addresses_overflowing() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let top = [DriverBuf::write(u64::MAX - 0xfff, 0x2000)];
    refused(
        &mut rig,
        QueueKind::Reporting,
        &top,
        MalformedKind::AddressOverflow,
    );
    let arr = [
        DriverBuf::read(u64::MAX - 1, 4),
        DriverBuf::write(DATA + 0x8000, 1),
    ];
    refused(
        &mut rig,
        QueueKind::Inflate,
        &arr,
        MalformedKind::AddressOverflow,
    );
}

#[test]
fn zero_length_and_gigantic_buffers() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let empty = [DriverBuf::write(8 * MIB, 0)];
    refused(
        &mut rig,
        QueueKind::Reporting,
        &empty,
        MalformedKind::EmptyBuffer,
    );
    let empty = [DriverBuf::read(DATA, 0), DriverBuf::write(DATA + 0x8000, 1)];
    refused(
        &mut rig,
        QueueKind::Inflate,
        &empty,
        MalformedKind::EmptyBuffer,
    );
    let huge = [DriverBuf::write(8 * MIB, 0x8000_0000)];
    refused(
        &mut rig,
        QueueKind::Reporting,
        &huge,
        MalformedKind::BufferTooLarge,
    );
    let huge = [
        DriverBuf::read(DATA, u32::MAX - 3),
        DriverBuf::write(DATA + 0x8000, 1),
    ];
    refused(
        &mut rig,
        QueueKind::Inflate,
        &huge,
        MalformedKind::BufferTooLarge,
    );
}

#[test]
fn wrong_descriptor_direction() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let k = MalformedKind::WrongDirection;
    refused(
        &mut rig,
        QueueKind::Reporting,
        &[DriverBuf::read(8 * MIB, 0x1000)],
        k,
    );
    rig.write_pfns(DATA, &[0x300]);
    refused(
        &mut rig,
        QueueKind::Inflate,
        &[DriverBuf::write(DATA, 4)],
        k,
    );
    let bufs = [DriverBuf::read(DATA, 4), DriverBuf::write(DATA + 0x8000, 1)];
    refused(&mut rig, QueueKind::Deflate, &bufs, k);
    // Readable after writable.
    let bufs = [
        DriverBuf::read(DATA, 4),
        DriverBuf::write(DATA + 0x8000, 1),
        DriverBuf::read(DATA, 4),
    ];
    refused(&mut rig, QueueKind::Inflate, &bufs, k);
    // Without bit 7, a trailing writable buffer is wrong too.
    let mut rig = Rig::mock(&mem, &[]);
    rig.write_pfns(DATA, &[0x300]);
    let bufs = [DriverBuf::read(DATA, 4), DriverBuf::write(DATA + 0x8000, 1)];
    refused(&mut rig, QueueKind::Inflate, &bufs, k);
}

#[test]
fn chains_too_long_looping_or_broken() {
    let mem = mem_with_hole();
    let k = MalformedKind::BadChain;
    let mut rig = Rig::new(
        &mem,
        BalloonOptions::default(),
        RecordingDiscarder::zeroing(),
        &ALL,
        128,
    );
    let long: Vec<DriverBuf> = (0..65)
        .map(|i| DriverBuf::write(8 * MIB + 0x1000 * i, 0x1000))
        .collect();
    refused(&mut rig, QueueKind::Reporting, &long, k);

    for (desc0_next, desc1) in [(1u16, Some(0u16)), (200, None)] {
        let mut rig = Rig::mock(&mem, &ALL);
        let q = usize::from(rig.index(QueueKind::Reporting));
        let dq = &mut rig.queues[q];
        // A loop 0 → 1 → 0, or a `next` past the table.
        dq.write_desc(&mem, 0, 8 * MIB, 0x1000, 2 | DESC_F_NEXT, desc0_next)
            .unwrap();
        if let Some(n) = desc1 {
            dq.write_desc(&mem, 1, 8 * MIB, 0x1000, 2 | DESC_F_NEXT, n)
                .unwrap();
        }
        dq.publish(&mem, 0).unwrap();
        let r = rig.notify(QueueKind::Reporting);
        assert_eq!((r.chains, r.malformed), (1, 1));
        assert_eq!(rig.dev.metrics().malformed_count(k), 1);
        assert_eq!(rig.used(QueueKind::Reporting), vec![(0, 0)]);
        assert_eq!(rig.calls(), 0);
        // The driver's allocator did not see descriptors 0/1 used; skip past them.
        rig.queues[q]
            .add_chain(&mem, &[DriverBuf::write(0, 0)])
            .unwrap();
        rig.queues[q]
            .add_chain(&mem, &[DriverBuf::write(0, 0)])
            .unwrap();
        rig.notify(QueueKind::Reporting);
        rig.used(QueueKind::Reporting);
        still_serves(&mut rig, QueueKind::Reporting);
    }
}

#[test]
fn bitmaps_too_short_or_missing() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let pfns: Vec<u32> = (0x300..0x310).collect();
    let bufs = rig.inflate_bufs(&pfns, Some(1));
    refused(
        &mut rig,
        QueueKind::Inflate,
        &bufs,
        MalformedKind::BitmapTooShort,
    );
    let bufs = rig.inflate_bufs(&pfns, None);
    refused(
        &mut rig,
        QueueKind::Inflate,
        &bufs,
        MalformedKind::BitmapTooShort,
    );
}

#[test]
fn pfn_arrays_of_odd_length() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let bufs = [DriverBuf::read(DATA, 6), DriverBuf::write(DATA + 0x8000, 1)];
    refused(
        &mut rig,
        QueueKind::Inflate,
        &bufs,
        MalformedKind::PfnArrayLength,
    );
}

#[test]
fn reports_not_aligned_to_the_backing_page_size() {
    let mem = mem_with_hole();
    let mut d = RecordingDiscarder::zeroing();
    d.backings
        .insert(0, Backing::Hugetlb { page_size: 2 << 20 });
    let mut rig = Rig::new(&mem, BalloonOptions::default(), d, &ALL, 16);
    let k = MalformedKind::Misaligned;
    refused(
        &mut rig,
        QueueKind::Reporting,
        &[DriverBuf::write(8 * MIB + 0x800, 0x1000)],
        k,
    );
    refused(
        &mut rig,
        QueueKind::Reporting,
        &[DriverBuf::write(8 * MIB, 0x1800)],
        k,
    );
    // 4 KiB report in a 2 MiB hugetlb region: only whole huge pages can be discarded.
    refused(
        &mut rig,
        QueueKind::Reporting,
        &[DriverBuf::write(2 * MIB, 0x1000)],
        k,
    );
    assert_eq!(
        rig.roundtrip(QueueKind::Reporting, &[DriverBuf::write(2 * MIB, 2 << 20)]),
        2 << 20
    );
}

#[test]
fn buffers_crossing_regions() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let across = [DriverBuf::write(4 * MIB - 0x1000, 0x2000)];
    refused(
        &mut rig,
        QueueKind::Reporting,
        &across,
        MalformedKind::CrossesRegion,
    );
}

#[test]
fn stats_buffers_of_odd_length_or_too_many_are_held_not_parsed() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    mem.write_slice(
        &[4, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        GuestAddress(DATA),
    )
    .unwrap();
    let first = rig.submit(QueueKind::Stats, &[DriverBuf::read(DATA, 15)]);
    let r = rig.notify(QueueKind::Stats);
    assert_eq!((r.malformed, r.held), (1, 1));
    assert_eq!(
        rig.dev
            .metrics()
            .malformed_count(MalformedKind::StatsLength),
        1
    );
    assert_eq!(rig.dev.stats().updates(), 0);
    assert!(
        rig.used(QueueKind::Stats).is_empty(),
        "held as the next request token"
    );
    // A second buffer while one is held: the old one is returned, the new one parsed.
    let second = rig.submit(QueueKind::Stats, &[DriverBuf::read(DATA, 10)]);
    rig.notify(QueueKind::Stats);
    assert_eq!(
        rig.dev
            .metrics()
            .malformed_count(MalformedKind::StatsOverflow),
        1
    );
    assert_eq!(rig.used(QueueKind::Stats), vec![(u32::from(first), 0)]);
    assert_eq!(rig.dev.stats().updates(), 1);
    assert!(rig.dev.request_stats(&mem).unwrap());
    assert_eq!(rig.used(QueueKind::Stats), vec![(u32::from(second), 0)]);
    // Writable stats buffer: wrong direction, still held.
    rig.submit(QueueKind::Stats, &[DriverBuf::write(DATA, 10)]);
    assert_eq!(rig.notify(QueueKind::Stats).held, 1);
    assert_eq!(
        rig.dev
            .metrics()
            .malformed_count(MalformedKind::WrongDirection),
        1
    );
    let big = rig.submit(QueueKind::Stats, &[DriverBuf::read(DATA, 5000)]);
    rig.notify(QueueKind::Stats);
    assert_eq!(
        rig.dev
            .metrics()
            .malformed_count(MalformedKind::BufferTooLarge),
        1
    );
    assert!(rig.dev.request_stats(&mem).unwrap());
    assert_eq!(
        rig.used(QueueKind::Stats).last(),
        Some(&(u32::from(big), 0))
    );
}

#[test]
fn a_bogus_available_index_is_survived() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let q = usize::from(rig.index(QueueKind::Reporting));
    rig.queues[q].set_avail_idx(&mem, 1000).unwrap();
    let r = rig.notify(QueueKind::Reporting);
    assert_eq!(
        r.chains, 0,
        "virtio-queue refuses an index jump beyond the ring"
    );
    assert_eq!(rig.calls(), 0);
}

#[test]
fn a_held_descriptor_published_again_is_refused() {
    let mem = mem_with_hole();
    let opts = BalloonOptions {
        policy: zeronce_balloon::DiscardPolicy::Hold(std::time::Duration::from_secs(1)),
        ..BalloonOptions::default()
    };
    let mut rig = Rig::new(&mem, opts, RecordingDiscarder::zeroing(), &ALL, 16);
    let head = rig.submit(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]);
    assert_eq!(rig.notify(QueueKind::Reporting).held, 1);
    let q = usize::from(rig.index(QueueKind::Reporting));
    for _ in 0..3 {
        rig.queues[q].publish(&mem, head).unwrap();
    }
    let r = rig.notify(QueueKind::Reporting);
    assert_eq!((r.chains, r.malformed, r.held), (3, 3, 0));
    assert_eq!(rig.dev.held_requests(), 1, "the held list does not grow");
    let k = MalformedKind::DescriptorInFlight;
    assert_eq!(rig.dev.metrics().malformed_count(k), 3);
    // Not used now: the held request returns the descriptor, exactly once.
    assert_eq!(rig.used(QueueKind::Reporting), vec![]);
    assert_eq!(
        rig.dev
            .tick(&mem, rig.now + std::time::Duration::from_secs(1))
            .unwrap(),
        1
    );
    assert_eq!(
        rig.used(QueueKind::Reporting),
        vec![(u32::from(head), 0x1000)]
    );
}

#[test]
fn held_inflates_are_bounded_in_total_not_per_head() {
    // Hold policy, a 64-entry queue: one 256 KiB array of 64 Ki PFNs published 20 times.
    // A held request keeping its plan (~90 bytes per scattered PFN) would cost ~6 MiB of
    // host memory per descriptor head, ~1.5 GiB for a 256-entry queue, from one guest
    // page of PFNs. At most MAX_HELD_BYTES of work is held in all (4 bytes per PFN); a
    // request beyond that is served at once, with its honest verdict.
    use zeronce_balloon::spec::limits::{MAX_HELD_BYTES, MAX_PFNS_PER_REQUEST};
    let mem = mem_with_hole();
    let delay = std::time::Duration::from_secs(60);
    let opts = BalloonOptions {
        policy: zeronce_balloon::DiscardPolicy::Hold(delay),
        ..BalloonOptions::default()
    };
    let mut rig = Rig::new(&mem, opts, RecordingDiscarder::zeroing(), &[], 64);
    // Every other page of [2 MiB, 4 MiB) of region 0, repeated: nothing merges.
    let pfns: Vec<u32> = (0..MAX_PFNS_PER_REQUEST as u32)
        .map(|i| 0x200 + (i % 256) * 2)
        .collect();
    let bufs = rig.inflate_bufs(&pfns, None);
    let n = 20;
    for _ in 0..n {
        rig.submit(QueueKind::Inflate, &bufs);
    }
    // Served in two calls: one serves 16 such requests (MAX_PAGES_PER_CALL).
    let (mut chains, mut held, mut calls) = (0, 0, 0);
    loop {
        let r = rig.notify(QueueKind::Inflate);
        assert_eq!(r.malformed, 0);
        (chains, held, calls) = (chains + r.chains, held + r.held, calls + 1);
        if !r.more {
            break;
        }
    }
    assert_eq!(calls, 2);
    let fit = MAX_HELD_BYTES / (4 * MAX_PFNS_PER_REQUEST);
    assert!(fit < n, "the test must exceed the bound");
    assert_eq!((chains, held), (n, fit));
    assert_eq!(rig.dev.held_requests(), fit);
    let used = rig.used(QueueKind::Inflate);
    assert_eq!(used.len(), n - fit, "the rest served at once");
    assert!(used.iter().all(|(_, len)| *len == 0));
    assert_eq!(rig.calls(), (n - fit) * 256, "and discarded at once");
    // The held ones complete at their deadline, and the budget is free again.
    assert_eq!(rig.dev.tick(&mem, rig.now + delay).unwrap(), fit);
    assert_eq!(rig.used(QueueKind::Inflate).len(), fit);
    rig.submit(QueueKind::Inflate, &bufs);
    assert_eq!(rig.notify(QueueKind::Inflate).held, 1);
}

#[test]
fn discards_overlapping_the_rings_or_the_bitmap_are_refused() {
    // A report of the reporting queue's own ring page, if discarded, gets the used
    // element written into it right after, and the answer "this block is now zero"
    // (bit 6) would be false. An inflated PFN on a ring page, or one holding the
    // request's own bitmap, the same.
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let k = MalformedKind::DiscardOverlap;
    let ring = 0x4000 * u64::from(rig.index(QueueKind::Reporting));
    refused(
        &mut rig,
        QueueKind::Reporting,
        &[DriverBuf::write(ring, 0x1000)],
        k,
    );
    let ring_pfn = ((0x4000 * u64::from(rig.index(QueueKind::Inflate))) >> 12) as u32;
    let bufs = rig.inflate_bufs(&[0x300, ring_pfn], Some(1));
    refused(&mut rig, QueueKind::Inflate, &bufs, k);
    // Bitmap at DATA + 0x8000: inflating its page.
    let bitmap_pfn = ((DATA + 0x8000) >> 12) as u32;
    let bufs = rig.inflate_bufs(&[0x300, bitmap_pfn], Some(1));
    refused(&mut rig, QueueKind::Inflate, &bufs, k);
    assert_eq!(rig.dev.metrics().malformed_count(k), 3);
}
