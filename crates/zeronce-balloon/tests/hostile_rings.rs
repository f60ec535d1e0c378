//! A hostile guest abusing the rings' structure: available entries naming no descriptor,
//! the statistics token, indirect descriptors, and device writes (bitmaps) landing on
//! memory it promised zero. The classes are listed in RELIABILITY.md.

mod common;

use std::time::Duration;

use common::hostile::held;
use common::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::{DriverBuf, DESC_F_INDIRECT, DESC_F_WRITE};
use zeronce_balloon::mock::RecordingDiscarder;
use zeronce_balloon::{MalformedKind, QueueKind};

/// Class 1: one available-ring entry naming no descriptor (0xFFFF, or exactly the queue
/// size) among good ones. The good chains after it were discarded but never returned,
/// no interrupt was sent, and the batch failed with a VMM error.
#[test]
fn an_invalid_head_does_not_poison_the_batch() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let q = usize::from(rig.index(QueueKind::Reporting));
    let a = rig.submit(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]);
    rig.queues[q].publish(&mem, 0xffff).unwrap();
    rig.queues[q].publish(&mem, 16).unwrap();
    let b = rig.submit(
        QueueKind::Reporting,
        &[DriverBuf::write(8 * MIB + 0x1000, 0x1000)],
    );
    rig.irq.take_used();
    let r = rig.notify(QueueKind::Reporting);
    assert_eq!((r.chains, r.malformed), (4, 2));
    assert_eq!(
        rig.used(QueueKind::Reporting),
        vec![(u32::from(a), 0x1000), (u32::from(b), 0x1000)],
        "every good chain completed; the invalid heads never reach the used ring"
    );
    assert_eq!(rig.irq.take_used(), vec![q as u16], "and signalled");
    let m = rig.dev.metrics();
    assert_eq!(m.malformed_count(MalformedKind::InvalidHead), 2);
}

/// Class 2: the statistics token. An invalid head became the held token (every
/// `request_stats` failed after), and a head published again while held was used twice.
#[test]
fn the_stats_token_is_valid_or_absent_and_returned_once() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let q = usize::from(rig.index(QueueKind::Stats));
    rig.queues[q].publish(&mem, 0xffff).unwrap();
    let r = rig.notify(QueueKind::Stats);
    assert_eq!((r.chains, r.malformed, r.held), (1, 1, 0));
    assert!(
        !rig.dev.request_stats(&mem).unwrap(),
        "no token held: nothing to use"
    );
    // A valid buffer (one entry: tag 4, free memory) is held and applied.
    let mut entry = vec![4u8, 0];
    entry.extend(7u64.to_le_bytes());
    mem.write_slice(&entry, GuestAddress(DATA)).unwrap();
    let head = rig.submit(QueueKind::Stats, &[DriverBuf::read(DATA, 10)]);
    assert_eq!(rig.notify(QueueKind::Stats).held, 1);
    // Published again while held: refused, not used.
    rig.queues[q].publish(&mem, head).unwrap();
    let r = rig.notify(QueueKind::Stats);
    assert_eq!((r.chains, r.malformed, r.held), (1, 1, 0));
    assert_eq!(rig.used(QueueKind::Stats), vec![]);
    assert!(rig.dev.request_stats(&mem).unwrap());
    assert_eq!(rig.used(QueueKind::Stats), vec![(u32::from(head), 0)]);
    assert!(!rig.dev.request_stats(&mem).unwrap(), "used exactly once");
    assert_eq!(rig.used(QueueKind::Stats), vec![]);
    assert_eq!(rig.dev.stats().updates(), 1);
}

/// An inflate request with its PFN array at `arr` and its bitmap at `bitmap`.
fn inflate_at(
    rig: &Rig<'_, RecordingDiscarder>,
    arr: u64,
    pfns: &[u32],
    bitmap: u64,
) -> Vec<DriverBuf> {
    rig.write_pfns(arr, pfns);
    vec![
        DriverBuf::read(arr, 4 * pfns.len() as u32),
        DriverBuf::write(bitmap, pfns.len().div_ceil(8) as u32),
    ]
}

/// Every bit set in the bitmap at `bitmap` of a request for `pfns` vouches for a page
/// that reads zero.
fn promises_hold(mem: &GuestMemoryMmap, pfns: &[u32], bitmap: u64) -> bool {
    let mut bytes = vec![0u8; pfns.len().div_ceil(8)];
    mem.read_slice(&mut bytes, GuestAddress(bitmap)).unwrap();
    pfns.iter().enumerate().all(|(i, pfn)| {
        let promised = bytes[i / 8] & (1 << (i % 8)) != 0;
        let mut page = vec![0u8; 4096];
        mem.read_slice(&mut page, GuestAddress(u64::from(*pfn) << 12))
            .unwrap();
        !promised || page.iter().all(|&b| b == 0)
    })
}

/// Class 3: in one batch, request A inflates page P (bit set: "zero"), and request B's
/// bitmap lies on P: the device wrote B's bitmap into P after promising it zero. Also
/// across queues: a held report (bit 6) and a held inflate whose bitmap lies in the
/// reported block, completed in one tick.
#[test]
fn no_device_write_lands_on_a_page_promised_zero() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let p = DATA + 0x9000;
    let (pa, pb) = ([(p >> 12) as u32], [0x300u32]);
    rig.fill(p, 4096, 0xaa);
    let a = inflate_at(&rig, DATA + 0x100, &pa, DATA + 0x8000);
    let b = inflate_at(&rig, DATA + 0x200, &pb, p + 0x10);
    rig.submit(QueueKind::Inflate, &a);
    rig.submit(QueueKind::Inflate, &b);
    let r = rig.notify(QueueKind::Inflate);
    assert_eq!(r.malformed, 1, "the overlapping request is refused");
    assert_eq!(
        rig.dev
            .metrics()
            .malformed_count(MalformedKind::DiscardOverlap),
        1
    );
    assert!(promises_hold(&mem, &pa, DATA + 0x8000), "A's promise");
    assert!(promises_hold(&mem, &pb, p + 0x10), "B's promise");

    // Across queues, held: a report of region 1's first 2 pages, and an inflate whose
    // bitmap lies in them; whichever arrives second is refused.
    let mut rig = Rig::new(
        &mem,
        held(Duration::from_secs(1)),
        RecordingDiscarder::zeroing(),
        &ALL,
        16,
    );
    rig.fill(8 * MIB, 0x2000, 0xbb);
    let report = rig.submit(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x2000)]);
    assert_eq!(rig.notify(QueueKind::Reporting).held, 1);
    let bitmap = 8 * MIB + 0x1800;
    let c = inflate_at(&rig, DATA + 0x300, &pb, bitmap);
    rig.submit(QueueKind::Inflate, &c);
    let r = rig.notify(QueueKind::Inflate);
    assert_eq!((r.malformed, r.held), (1, 0));
    assert_eq!(
        rig.dev
            .tick(&mem, rig.now + Duration::from_secs(1))
            .unwrap(),
        1
    );
    assert_eq!(
        rig.used(QueueKind::Reporting),
        vec![(u32::from(report), 0x2000)]
    );
    assert_eq!(rig.read(8 * MIB, 0x2000), vec![0; 0x2000], "bit 6 holds");
}

/// Class 6: indirect descriptors were followed though `VIRTIO_F_INDIRECT_DESC` is never
/// offered. Now a named malformed class, on every queue.
#[test]
fn indirect_descriptors_are_refused_on_every_queue() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    // An indirect table of one valid descriptor for each queue's kind.
    let table = DATA + 0x4000;
    rig.write_pfns(DATA, &[0x300]);
    for kind in [
        QueueKind::Inflate,
        QueueKind::Deflate,
        QueueKind::Reporting,
        QueueKind::Stats,
    ] {
        let (addr, len, flags) = match kind {
            QueueKind::Reporting => (8 * MIB, 0x1000, DESC_F_WRITE),
            QueueKind::Stats => (DATA, 0, 0),
            _ => (DATA, 4, 0),
        };
        let mut raw = addr.to_le_bytes().to_vec();
        raw.extend(u32::to_le_bytes(len));
        raw.extend(flags.to_le_bytes());
        raw.extend(0u16.to_le_bytes());
        mem.write_slice(&raw, GuestAddress(table)).unwrap();
        let q = usize::from(rig.index(kind));
        rig.queues[q]
            .write_desc(&mem, 5, table, 16, DESC_F_INDIRECT, 0)
            .unwrap();
        rig.queues[q].publish(&mem, 5).unwrap();
        let calls = rig.calls();
        let r = rig.notify(kind);
        assert_eq!(r.malformed, 1, "{kind:?}");
        assert_eq!(rig.calls(), calls, "{kind:?}: nothing discarded");
    }
    let k = MalformedKind::IndirectDescriptor;
    assert_eq!(rig.dev.metrics().malformed_count(k), 4);
}
