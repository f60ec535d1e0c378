//! Every queue path through real split rings in guest memory, with a recording discarder.

mod common;

use std::time::Duration;

use common::*;
use vm_memory::{Bytes, GuestAddress};
use zeronce_balloon::guest_ring::DriverBuf;
use zeronce_balloon::mock::RecordingDiscarder;
use zeronce_balloon::spec::config_layout;
use zeronce_balloon::{
    Backing, BalloonOptions, DiscardOp, DiscardPolicy, Feature, FeatureOffer, QueueKind, StatTag,
};
use Feature::*;

const PFN_2M: u32 = 0x200; // first PFN at 2 MiB: clear of queues and data

#[test]
fn inflate_without_bit7_discards_and_uses_len_0() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &[]);
    rig.fill(2 * MIB, 0x3000, 0xaa);
    let bufs = rig.inflate_bufs(&[PFN_2M, PFN_2M + 1, PFN_2M + 2], None);
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &bufs), 0);
    let calls = &rig.dev.discarder().calls;
    assert_eq!(
        calls.len(),
        1,
        "three contiguous PFNs merge into one discard"
    );
    assert_eq!(
        (calls[0].gpa, calls[0].len),
        (GuestAddress(2 * MIB), 0x3000)
    );
    assert_eq!(calls[0].op, DiscardOp::DontNeed);
    let m = rig.dev.metrics();
    assert_eq!(m.pages_inflated.get(), 3);
    assert_eq!(m.bytes_discarded.get(), 0x3000);
    assert_eq!(m.zero_promises.get(), 0, "no bit 7, no promise");
    assert_eq!(rig.irq.take_used(), vec![0]);
}

#[test]
fn inflate_with_bit7_clears_bitmap_and_sets_zeroed_bits() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &[DeviceInitOnInflate]);
    rig.fill(DATA + 0x8000, 4, 0xff); // stale bitmap: device must clear it
    let pfns: Vec<u32> = (0..10).map(|i| PFN_2M + 2 * i).collect();
    let bufs = rig.inflate_bufs(&pfns, Some(4));
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &bufs), 2, "ceil(10/8)");
    assert_eq!(rig.read(DATA + 0x8000, 4), vec![0xff, 0x03, 0xff, 0xff]);
    assert_eq!(rig.dev.metrics().zero_promises.get(), 10);
    assert!(rig.read(2 * MIB, 0x1000).iter().all(|&b| b == 0));
}

#[test]
fn inflate_bitmap_leaves_failed_and_lazy_pages_unpromised() {
    let mem = mem_with_hole();
    let mut d = RecordingDiscarder::zeroing();
    d.fail_at.insert(2 * MIB + 0x1000);
    let mut rig = Rig::new(
        &mem,
        BalloonOptions::default(),
        d,
        &[DeviceInitOnInflate],
        16,
    );
    // PFNs 0x200 and 0x202 discard fine; 0x201 fails (separate runs: not contiguous).
    let bufs = rig.inflate_bufs(&[PFN_2M, PFN_2M + 0x10, PFN_2M + 1], Some(1));
    // Contiguity: 0x200 and 0x201 merge → the failing address is not a run start, so
    // submit 0x201 alone too.
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &bufs), 1);
    let first = rig.read(DATA + 0x8000, 1)[0];
    assert_eq!(first, 0b111, "merged run starting at 2 MiB succeeded");
    let bufs = rig.inflate_bufs(&[PFN_2M + 1], Some(1));
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &bufs), 1);
    assert_eq!(
        rig.read(DATA + 0x8000, 1)[0],
        0,
        "failed discard: no promise"
    );
    assert_eq!(rig.dev.metrics().discard_errors.get(), 1);

    let lazy = BalloonOptions {
        policy: DiscardPolicy::Lazy,
        ..BalloonOptions::default()
    };
    let mut rig = Rig::new(
        &mem,
        lazy,
        RecordingDiscarder::default(),
        &[DeviceInitOnInflate],
        16,
    );
    let bufs = rig.inflate_bufs(&[PFN_2M], Some(1));
    rig.fill(DATA + 0x8000, 1, 0xff);
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &bufs), 1);
    assert_eq!(
        rig.read(DATA + 0x8000, 1)[0],
        0,
        "MADV_FREE never promises zero"
    );
    assert_eq!(rig.dev.discarder().calls[0].op, DiscardOp::Free);
}

#[test]
fn hugetlb_inflate_discards_only_complete_host_pages() {
    // With MUST_TELL_HOST the guest waits for deflate acks, so sub-pages inflated by
    // earlier requests are still in the balloon: partial host pages carry over.
    let mem = mem_with_hole();
    let mut d = RecordingDiscarder::zeroing();
    d.backings
        .insert(8 * MIB, Backing::Hugetlb { page_size: 2 << 20 });
    let mut rig = Rig::new(
        &mem,
        BalloonOptions::default(),
        d,
        &[DeviceInitOnInflate, MustTellHost],
        16,
    );
    let base = ((8 * MIB) >> 12) as u32;
    let first: Vec<u32> = (base..base + 511).collect();
    let bufs = rig.inflate_bufs(&first, Some(64));
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &bufs), 64);
    assert!(
        rig.read(DATA + 0x8000, 64).iter().all(|&b| b == 0),
        "partial: no promise"
    );
    assert_eq!((rig.calls(), rig.dev.partial_host_pages()), (0, 1));
    let bufs = rig.inflate_bufs(&[base + 511], Some(1));
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &bufs), 1);
    assert_eq!(
        rig.read(DATA + 0x8000, 1)[0],
        1,
        "completing PFN is promised"
    );
    let c = rig.dev.discarder().calls[0];
    assert_eq!(
        (c.gpa.0, c.len, c.op),
        (8 * MIB, 2 * MIB, DiscardOp::PunchHole)
    );
    assert_eq!(rig.dev.partial_host_pages(), 0);
}

#[test]
fn without_must_tell_host_a_huge_page_completes_only_within_one_request() {
    // Without MUST_TELL_HOST a guest may reuse a deflated page before the device has
    // seen the deflate (spec: "deflation advice is merely a courtesy"). Here sub-page 0
    // is deflated and reused while its deflate still waits on the deflateq; the inflate
    // of the last sub-page must not complete the host page from the stale record (that
    // discarded the whole 2 MiB, the guest's reused data with it).
    let mem = mem_with_hole();
    let mut d = RecordingDiscarder::zeroing();
    d.backings
        .insert(8 * MIB, Backing::Hugetlb { page_size: 2 << 20 });
    let mut rig = Rig::new(&mem, BalloonOptions::default(), d, &[], 16);
    let base = ((8 * MIB) >> 12) as u32;
    let first: Vec<u32> = (base..base + 511).collect();
    assert_eq!(
        rig.roundtrip(QueueKind::Inflate, &rig.inflate_bufs(&first, None)),
        0
    );
    rig.write_pfns(DATA + 0x4_0000, &[base]);
    rig.submit(QueueKind::Deflate, &[DriverBuf::read(DATA + 0x4_0000, 4)]);
    rig.fill(8 * MIB, 16, 0x77); // reused before the device saw the deflate
    let last = rig.inflate_bufs(&[base + 511], None);
    assert_eq!(rig.roundtrip(QueueKind::Inflate, &last), 0);
    assert_eq!(rig.calls(), 0, "no host page discarded");
    assert_eq!(rig.read(8 * MIB, 16), vec![0x77; 16]);
    rig.notify(QueueKind::Deflate);
    // A host page inflated whole in one request is discarded.
    let all: Vec<u32> = (base + 512..base + 1024).collect();
    assert_eq!(
        rig.roundtrip(QueueKind::Inflate, &rig.inflate_bufs(&all, None)),
        0
    );
    let c = rig.dev.discarder().calls.clone();
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].gpa.0, c[0].len), (10 * MIB, 2 * MIB));
    assert_eq!(rig.dev.partial_host_pages(), 0, "nothing carried over");
}

#[test]
fn deflate_is_acked_forgets_partials_and_prefaults_when_configured() {
    let mem = mem_with_hole();
    let mut d = RecordingDiscarder::default();
    d.backings
        .insert(8 * MIB, Backing::Hugetlb { page_size: 2 << 20 });
    let opts = BalloonOptions {
        prefault_on_deflate: true,
        ..BalloonOptions::default()
    };
    let mut rig = Rig::new(&mem, opts, d, &[MustTellHost], 16);
    let base = ((8 * MIB) >> 12) as u32;
    let bufs = rig.inflate_bufs(&[base, base + 1], None);
    rig.roundtrip(QueueKind::Inflate, &bufs);
    assert_eq!(rig.dev.partial_host_pages(), 1);
    rig.write_pfns(DATA, &[base, base + 1]);
    let len = rig.roundtrip(QueueKind::Deflate, &[DriverBuf::read(DATA, 8)]);
    assert_eq!(len, 0);
    assert_eq!(rig.dev.partial_host_pages(), 0);
    assert_eq!(rig.dev.metrics().pages_deflated.get(), 2);
    // One prefault for the run of two pages.
    assert_eq!(
        rig.dev.discarder().prefaults,
        vec![(vm_memory::GuestAddress(8 * MIB), 0x2000)]
    );
}

fn report_rig(
    fs: &[Feature],
    backing: Option<Backing>,
    policy: DiscardPolicy,
) -> (u32, u64, Option<DiscardOp>) {
    let mem = mem_with_hole();
    let mut d = RecordingDiscarder::zeroing();
    if let Some(b) = backing {
        d.backings.insert(8 * MIB, b);
    }
    let opts = BalloonOptions {
        policy,
        ..BalloonOptions::default()
    };
    let mut rig = Rig::new(&mem, opts, d, fs, 16);
    rig.fill(8 * MIB, 2 * MIB as usize, 0x5a);
    let len = rig.roundtrip(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 2 << 20)]);
    let promises = rig.dev.metrics().zero_promises.get();
    (
        len,
        promises,
        rig.dev.discarder().calls.first().map(|c| c.op),
    )
}

#[test]
fn reporting_used_len_per_backing_and_bit6() {
    let huge = Backing::Hugetlb { page_size: 2 << 20 };
    let imm = DiscardPolicy::Immediate;
    let with6 = [PageReporting, DeviceInitReported];
    for (backing, op) in [
        (None, DiscardOp::DontNeed),
        (Some(Backing::SharedFile), DiscardOp::PunchHole),
        (Some(huge), DiscardOp::PunchHole),
    ] {
        assert_eq!(
            report_rig(&with6, backing, imm),
            (2 << 20, 1, Some(op)),
            "{backing:?}"
        );
        let (len, promises, called) = report_rig(&[PageReporting], backing, imm);
        assert_eq!((len, promises), (0, 0), "without bit 6 used_len is 0");
        assert_eq!(called, Some(op), "still discarded");
    }
    let (len, _, op) = report_rig(&with6, None, DiscardPolicy::Lazy);
    assert_eq!((len, op), (0, Some(DiscardOp::Free)), "lazy: no promise");
}

#[test]
fn poison_rule_turns_off_promises_and_reporting_discards() {
    let mem = mem_with_hole();
    let fs = [
        PagePoison,
        PageReporting,
        DeviceInitReported,
        DeviceInitOnInflate,
    ];
    let mut rig = Rig::mock(&mem, &fs);
    rig.dev
        .write_config(config_layout::POISON_VAL, &0xaau32.to_le_bytes())
        .unwrap();
    rig.fill(8 * MIB, 0x1000, 0xaa);
    assert_eq!(
        rig.roundtrip(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]),
        0
    );
    assert_eq!(rig.calls(), 0, "discarding would erase the poison");
    assert_eq!(rig.dev.metrics().reports_skipped_poison.get(), 1);
    rig.fill(DATA + 0x8000, 1, 0xff);
    let bufs = rig.inflate_bufs(&[PFN_2M], Some(1));
    assert_eq!(
        rig.roundtrip(QueueKind::Inflate, &bufs),
        1,
        "bitmap still written"
    );
    assert_eq!(rig.read(DATA + 0x8000, 1)[0], 0, "but no bit set");
    // poison_val 0 with PAGE_POISON: zeros are the poison, promises allowed.
    rig.dev
        .write_config(config_layout::POISON_VAL, &[0; 4])
        .unwrap();
    assert_eq!(
        rig.roundtrip(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]),
        0x1000
    );
}

#[test]
fn queue_index_trap_reporting_follows_negotiated_queues() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &[PageReporting, DeviceInitReported]);
    assert_eq!(
        rig.index(QueueKind::Reporting),
        2,
        "no stats: reporting is queue 2"
    );
    assert_eq!(
        rig.roundtrip(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]),
        0x1000
    );
    let e = rig.dev.process_queue(&mem, 4).unwrap_err();
    assert_eq!(e.kind(), Some(zeronce_balloon::MalformedKind::UnknownQueue));

    let mut rig = Rig::mock(&mem, &[StatsVq, PageReporting, DeviceInitReported]);
    assert_eq!(rig.index(QueueKind::Stats), 2);
    assert_eq!(rig.index(QueueKind::Reporting), 3);
    assert_eq!(
        rig.roundtrip(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]),
        0x1000
    );
    assert_eq!(rig.irq.take_used(), vec![3]);
}

fn stats_bytes(entries: &[(u16, u64)]) -> Vec<u8> {
    entries
        .iter()
        .flat_map(|(t, v)| t.to_le_bytes().into_iter().chain(v.to_le_bytes()))
        .collect()
}

#[test]
fn stats_are_parsed_held_and_reposted_on_request() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &[StatsVq]);
    let b = stats_bytes(&[(4, 1000), (99, 7), (15, 3), (5, 4096)]);
    mem.write_slice(&b, GuestAddress(DATA)).unwrap();
    let head = rig.submit(QueueKind::Stats, &[DriverBuf::read(DATA, b.len() as u32)]);
    let r = rig.notify(QueueKind::Stats);
    assert_eq!((r.held, r.malformed), (1, 0));
    assert!(
        rig.used(QueueKind::Stats).is_empty(),
        "buffer held for the next request"
    );
    let s = rig.dev.stats();
    assert_eq!(s.get(StatTag::FreeMemory), Some(1000));
    assert_eq!(s.get(StatTag::DirectReclaims), Some(3));
    assert_eq!(s.get(StatTag::SwapIn), None);
    assert_eq!(
        s.named(),
        vec![
            ("free_memory", 1000),
            ("total_memory", 4096),
            ("direct_reclaims", 3)
        ]
    );

    assert!(rig.dev.request_stats(&mem).unwrap());
    assert_eq!(rig.used(QueueKind::Stats), vec![(u32::from(head), 0)]);
    assert!(
        !rig.dev.request_stats(&mem).unwrap(),
        "nothing held any more"
    );
    let b = stats_bytes(&[(4, 500)]);
    mem.write_slice(&b, GuestAddress(DATA)).unwrap();
    rig.submit(QueueKind::Stats, &[DriverBuf::read(DATA, 10)]);
    rig.notify(QueueKind::Stats);
    assert_eq!(rig.dev.stats().get(StatTag::FreeMemory), Some(500));
    assert_eq!(rig.dev.stats().updates(), 2);
}

#[test]
fn held_policy_uses_descriptors_only_after_discarding_at_deadline() {
    let mem = mem_with_hole();
    let delay = Duration::from_secs(2);
    let opts = BalloonOptions {
        policy: DiscardPolicy::Hold(delay),
        ..BalloonOptions::default()
    };
    let fs = [PageReporting, DeviceInitReported];
    let mut rig = Rig::new(&mem, opts, RecordingDiscarder::zeroing(), &fs, 16);
    rig.fill(8 * MIB, 0x2000, 0x77);
    rig.submit(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x2000)]);
    assert_eq!(rig.notify(QueueKind::Reporting).held, 1);
    assert!(rig.used(QueueKind::Reporting).is_empty());
    assert_eq!((rig.calls(), rig.dev.held_requests()), (0, 1));
    assert_eq!(rig.dev.next_deadline(), Some(rig.now + delay));
    assert_eq!(rig.dev.tick(&mem, rig.now + delay / 2).unwrap(), 0);
    assert_eq!(rig.calls(), 0, "not before the deadline");
    assert_eq!(rig.dev.tick(&mem, rig.now + delay).unwrap(), 1);
    assert_eq!(rig.calls(), 1);
    assert_eq!(rig.used(QueueKind::Reporting), vec![(0, 0x2000)]);
    assert!(rig.read(8 * MIB, 0x2000).iter().all(|&b| b == 0));
    rig.dev.reset();
    assert_eq!(rig.dev.held_requests(), 0);
}

#[test]
fn num_pages_is_settable_with_config_change_notification() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &[]);
    rig.dev.set_num_pages(0x1234);
    assert_eq!(rig.irq.config_changes(), 1);
    let mut b = [0u8; 4];
    rig.dev
        .read_config(config_layout::NUM_PAGES, &mut b)
        .unwrap();
    assert_eq!(u32::from_le_bytes(b), 0x1234);
    rig.dev
        .write_config(config_layout::ACTUAL, &0x1234u32.to_le_bytes())
        .unwrap();
    assert_eq!(rig.dev.config().actual(), 0x1234);
    rig.dev.reset();
    assert_eq!(
        (rig.dev.config().num_pages(), rig.dev.config().actual()),
        (0x1234, 0)
    );
}

#[test]
fn offer_switches_limit_negotiation() {
    let mem = mem_with_hole();
    let opts = BalloonOptions {
        offer: FeatureOffer {
            device_init_reported: false,
            stats_vq: false,
            ..FeatureOffer::default()
        },
        ..BalloonOptions::default()
    };
    let mut rig = Rig::new(
        &mem,
        opts,
        RecordingDiscarder::zeroing(),
        &[PageReporting],
        16,
    );
    assert!(!rig.dev.device_features().contains(DeviceInitReported));
    assert_eq!(rig.dev.max_queues(), 3);
    assert_eq!(
        rig.roundtrip(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]),
        0
    );
}

#[test]
fn virtio_queue_mock_split_queue_drives_the_device_too() {
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    let mem = mem_with_hole();
    let irq = std::sync::Arc::new(zeronce_balloon::mock::RecordingInterrupt::default());
    let options = BalloonOptions {
        offer: zeronce_balloon::FeatureOffer::default().with_zero_hints(),
        ..BalloonOptions::default()
    };
    let mut dev = zeronce_balloon::BalloonDevice::new(options, RecordingDiscarder::zeroing(), irq);
    dev.ack_features(features(&[PageReporting, DeviceInitReported]))
        .unwrap();
    let mocks: Vec<_> = (0..3)
        .map(|i| MockSplitQueue::create(&mem, GuestAddress(0x4000 * i), 16))
        .collect();
    dev.activate(mocks.iter().map(|m| m.create_queue().unwrap()).collect())
        .unwrap();
    let d = Descriptor::new(8 * MIB, 0x1000, 2 /* WRITE */, 0);
    mocks[2]
        .add_desc_chains(&[RawDescriptor::from(d)], 0)
        .unwrap();
    dev.process_queue(&mem, 2).unwrap();
    let used = mocks[2].used().ring().ref_at(0).unwrap().load();
    assert_eq!((used.id(), used.len()), (0, 0x1000));
}
