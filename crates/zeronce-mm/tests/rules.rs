//! One test per state rule of docs/ARCHITECTURE.md §3 and per error kind.

mod common;

use common::{blk, manager, o, FakeZeroer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use zeronce_mm::*;

fn state(mm: &MemoryManager, pfn: u64) -> Option<(Block, FreeState)> {
    mm.free_state_of(Pfn(pfn))
}

/// Allocates every page of a fresh manager as order-0 blocks (dirty requests).
fn alloc_all_pages(mm: &MemoryManager) -> Vec<Block> {
    let mut v = Vec::new();
    while let Ok(a) = mm.alloc(o(0), AllocRequest::DIRTY) {
        v.push(a.block);
    }
    v
}

#[test]
fn merge_is_and_of_known_zero_and_reported() {
    let (mm, z) = manager(4, 2, true);
    alloc_all_pages(&mm);
    z.0.lock().unwrap().dirty.fill(false);
    mm.free(blk(2, 0), FreeHint::KnownZero).unwrap();
    mm.free(blk(3, 0), FreeHint::KnownZero).unwrap();
    // zero ∧ zero = zero.
    assert_eq!(state(&mm, 3), Some((blk(2, 1), FreeState::ZERO)));
    mm.free(blk(0, 0), FreeHint::KnownZero).unwrap();
    assert_eq!(state(&mm, 0), Some((blk(0, 0), FreeState::ZERO)));
    // zero ∧ dirty = dirty, cascading up to order 2.
    mm.free(blk(1, 0), FreeHint::Dirty).unwrap();
    assert_eq!(state(&mm, 0), Some((blk(0, 2), FreeState::DIRTY)));
    mm.check_invariants().unwrap();
}

#[test]
fn merge_of_reported_and_unreported_is_unreported() {
    let (mm, _z) = manager(4, 2, false);
    let a = mm.alloc(o(1), AllocRequest::DIRTY).unwrap().block; // [0,2)
                                                                // The other half [2,4) is free: report it, host zeroed it.
    let iso = mm.isolate_unreported(ZoneId(0), o(0), o(2), 8);
    assert_eq!(iso.len(), 1);
    assert_eq!(iso[0].block, blk(2, 1));
    mm.put_back(iso[0].block, PutBack::Reported(ZeroGuarantee::Zeroed))
        .unwrap();
    assert_eq!(state(&mm, 2), Some((blk(2, 1), FreeState::REPORTED_ZERO)));
    mm.free(a, FreeHint::KnownZero).unwrap();
    // reported ∧ unreported = unreported; zero ∧ zero = zero.
    assert_eq!(state(&mm, 0), Some((blk(0, 2), FreeState::ZERO)));
    mm.check_invariants().unwrap();
}

#[test]
fn split_halves_inherit_state() {
    let (mm, _z) = manager(8, 3, false);
    let iso = mm.isolate_unreported(ZoneId(0), o(0), o(3), 1);
    mm.put_back(iso[0].block, PutBack::Reported(ZeroGuarantee::Zeroed))
        .unwrap();
    let a = mm.alloc(o(0), AllocRequest::ZEROED).unwrap();
    assert_eq!(a.zeroing, Zeroing::Skipped);
    assert!(a.was_reported());
    for (pfn, order) in [(1, 0), (2, 1), (4, 2)] {
        assert_eq!(
            state(&mm, pfn),
            Some((blk(pfn, order), FreeState::REPORTED_ZERO))
        );
    }
    mm.check_invariants().unwrap();
}

#[test]
fn hint_page_is_zeroed_last_and_whole_block_zeroed() {
    let (mm, z) = manager(16, 4, true);
    let a = mm
        .alloc(
            o(3),
            AllocRequest {
                zeroed: true,
                hint: Some(Pfn(5)),
            },
        )
        .unwrap();
    assert_eq!(a.zeroing, Zeroing::Done);
    assert_eq!(a.block, blk(0, 3));
    let log = z.take_log();
    assert_eq!(log.len(), 8);
    assert_eq!(log.last(), Some(&Pfn(5)));
    assert!(z.reads_zero(a.block.range()));
    // A hint outside the block is ignored (nothing to keep hot).
    mm.alloc(
        o(3),
        AllocRequest {
            zeroed: true,
            hint: Some(Pfn(1)),
        },
    )
    .unwrap();
    assert_eq!(z.take_log().last(), Some(&Pfn(15)));
}

/// A 16-page zone: a dirty order-0 block at 0, a known-zero order-1 block at 2, a dirty
/// order-2 block at 4; pages 1 and 8..16 allocated.
fn mixed_zone() -> (MemoryManager, FakeZeroer) {
    let (mm, z) = manager(16, 4, true);
    alloc_all_pages(&mm);
    z.0.lock().unwrap().dirty.fill(false);
    for pfn in [2, 3] {
        mm.free(blk(pfn, 0), FreeHint::KnownZero).unwrap();
    }
    for pfn in [0, 4, 5, 6, 7] {
        mm.free(blk(pfn, 0), FreeHint::Dirty).unwrap();
    }
    assert_eq!(state(&mm, 0), Some((blk(0, 0), FreeState::DIRTY)));
    assert_eq!(state(&mm, 2), Some((blk(2, 1), FreeState::ZERO)));
    assert_eq!(state(&mm, 4), Some((blk(4, 2), FreeState::DIRTY)));
    (mm, z)
}

#[test]
fn non_zero_requests_prefer_dirty_blocks_even_by_splitting() {
    let (mm, _z) = mixed_zone();
    let a = mm.alloc(o(0), AllocRequest::DIRTY).unwrap();
    assert_eq!((a.block, a.prior), (blk(0, 0), FreeState::DIRTY));
    let b = mm.alloc(o(1), AllocRequest::DIRTY).unwrap();
    // Splits the dirty order-2 block rather than take the known-zero order-1 block.
    assert_eq!((b.block, b.prior), (blk(4, 1), FreeState::DIRTY));
    assert_eq!(state(&mm, 6), Some((blk(6, 1), FreeState::DIRTY)));
    assert_eq!(state(&mm, 2), Some((blk(2, 1), FreeState::ZERO)));
    mm.check_invariants().unwrap();
}

#[test]
fn zero_requests_prefer_known_zero_blocks_even_by_splitting() {
    let (mm, z) = mixed_zone();
    let a = mm.alloc(o(0), AllocRequest::ZEROED).unwrap();
    // A dirty order-0 block exists at 0, but the known-zero order-1 block is split instead.
    assert_eq!(a.zeroing, Zeroing::Skipped);
    assert_eq!(a.block, blk(2, 0));
    assert_eq!(state(&mm, 3), Some((blk(3, 0), FreeState::ZERO)));
    assert!(z.take_log().is_empty());
    let s = mm.stats();
    assert_eq!(
        (
            s.zero_requests,
            s.zero_requests_skipped,
            s.bytes_zeroing_skipped
        ),
        (1, 1, 4096)
    );
}

#[test]
fn zero_request_without_known_zero_block_zeroes() {
    let (mm, z) = manager(8, 3, true);
    let a = mm.alloc(o(2), AllocRequest::ZEROED).unwrap();
    assert_eq!(a.zeroing, Zeroing::Done);
    assert!(z.reads_zero(a.block.range()));
    assert_eq!(mm.stats().bytes_zeroed, 4 * 4096);
}

#[test]
fn verify_catches_a_false_known_zero_block_and_repairs_it() {
    let (mm, z) = manager(8, 3, true);
    let a = mm.alloc(o(3), AllocRequest::ZEROED).unwrap();
    mm.free(a.block, FreeHint::KnownZero).unwrap();
    // Someone writes to the free block (use after free, or a lying host).
    z.scribble(PageRange::new(Pfn(6), 1));
    let err = mm.alloc(o(3), AllocRequest::ZEROED).unwrap_err();
    assert_eq!(err, AllocError::VerifyFailed { block: blk(0, 3) });
    // Not lost, no longer claimed zero.
    assert_eq!(state(&mm, 0), Some((blk(0, 3), FreeState::DIRTY)));
    mm.check_invariants().unwrap();
    let s = mm.stats();
    assert_eq!(
        (s.verify_failures, s.allocs[3], s.alloc_failures),
        (1, 1, 1)
    );
    let b = mm.alloc(o(3), AllocRequest::ZEROED).unwrap();
    assert_eq!(b.zeroing, Zeroing::Done);
}

#[test]
fn verify_rejects_a_dirty_block_freed_as_known_zero() {
    let (mm, _z) = manager(8, 3, true);
    let a = mm.alloc(o(3), AllocRequest::DIRTY).unwrap();
    assert_eq!(
        mm.free(a.block, FreeHint::KnownZero),
        Err(FreeError::VerifyFailed(a.block))
    );
    // Still allocated: a dirty free works.
    mm.free(a.block, FreeHint::Dirty).unwrap();
    mm.check_invariants().unwrap();
}

#[test]
fn put_back_verdicts() {
    let (mm, z) = manager(16, 2, true);
    let iso = mm.isolate_unreported(ZoneId(0), o(2), o(2), 8);
    assert_eq!(iso.len(), 4);
    assert_eq!(mm.zone_info(ZoneId(0)).unwrap().isolated_pages, 16);
    // Isolated blocks cannot be allocated.
    assert_eq!(
        mm.alloc(o(0), AllocRequest::DIRTY),
        Err(AllocError::OutOfMemory(o(0)))
    );
    z.0.lock().unwrap().dirty[..4].fill(false);
    mm.put_back(blk(0, 2), PutBack::Reported(ZeroGuarantee::Zeroed))
        .unwrap();
    mm.put_back(blk(4, 2), PutBack::Reported(ZeroGuarantee::NotZeroed))
        .unwrap();
    mm.put_back(blk(8, 2), PutBack::Failed).unwrap();
    // Verify: the host lies about [12,16).
    assert_eq!(
        mm.put_back(blk(12, 2), PutBack::Reported(ZeroGuarantee::Zeroed)),
        Err(PutBackError::VerifyFailed(blk(12, 2)))
    );
    assert_eq!(state(&mm, 0), Some((blk(0, 2), FreeState::REPORTED_ZERO)));
    assert_eq!(state(&mm, 4), Some((blk(4, 2), FreeState::REPORTED_DIRTY)));
    assert_eq!(state(&mm, 8), Some((blk(8, 2), FreeState::DIRTY)));
    assert_eq!(
        state(&mm, 12),
        Some((blk(12, 2), FreeState::REPORTED_DIRTY))
    );
    // Not isolated any more.
    assert_eq!(
        mm.put_back(blk(0, 2), PutBack::Reported(ZeroGuarantee::Zeroed)),
        Err(PutBackError::NotIsolated(blk(0, 2)))
    );
    assert_eq!(
        mm.put_back(blk(64, 2), PutBack::Reported(ZeroGuarantee::Zeroed)),
        Err(PutBackError::NotOwned(Pfn(64)))
    );
    // Only the unreported block is isolated again.
    let again = mm.isolate_unreported(ZoneId(0), o(0), o(2), 8);
    assert_eq!(
        again.iter().map(|b| b.block).collect::<Vec<_>>(),
        vec![blk(8, 2)]
    );
    mm.check_invariants().unwrap();
}

#[test]
fn not_zeroed_verdict_keeps_known_zero() {
    let (mm, _z) = manager(4, 2, false);
    let a = mm.alloc(o(2), AllocRequest::ZEROED).unwrap();
    mm.free(a.block, FreeHint::KnownZero).unwrap();
    let iso = mm.isolate_unreported(ZoneId(0), o(0), o(2), 8);
    assert_eq!(iso[0].state, FreeState::ZERO);
    mm.put_back(blk(0, 2), PutBack::Reported(ZeroGuarantee::NotZeroed))
        .unwrap();
    assert_eq!(state(&mm, 0), Some((blk(0, 2), FreeState::REPORTED_ZERO)));
}

#[test]
fn mark_known_zero_marks_whole_free_blocks_only_and_verifies() {
    let (mm, z) = manager(16, 2, true);
    let a = mm.alloc(o(2), AllocRequest::DIRTY).unwrap().block;
    assert_eq!(a, blk(12, 2)); // LIFO: the last block carved
    z.0.lock().unwrap().dirty[0..8].fill(false);
    // [2,10): [0,4) and [8,12) only partly inside: ignored; [4,8) marked.
    assert_eq!(mm.mark_known_zero(PageRange::new(Pfn(2), 8)), Ok(4));
    assert_eq!(state(&mm, 4), Some((blk(4, 2), FreeState::ZERO)));
    assert_eq!(state(&mm, 0), Some((blk(0, 2), FreeState::DIRTY)));
    // [0,16): [8,12) reads dirty, so nothing is marked ([12,16) is allocated: ignored).
    assert_eq!(
        mm.mark_known_zero(PageRange::new(Pfn(0), 16)),
        Err(MarkError::VerifyFailed(blk(8, 2)))
    );
    assert_eq!(state(&mm, 0), Some((blk(0, 2), FreeState::DIRTY)));
    assert_eq!(mm.mark_known_zero(PageRange::new(Pfn(0), 8)), Ok(4));
    assert_eq!(state(&mm, 0), Some((blk(0, 2), FreeState::ZERO)));
    assert!(matches!(
        mm.mark_known_zero(PageRange::new(Pfn(8), 9)),
        Err(MarkError::NotOwned(_))
    ));
    mm.free(a, FreeHint::Dirty).unwrap();
    mm.check_invariants().unwrap();
}

#[test]
fn every_bad_free_is_a_typed_error_and_changes_nothing() {
    let (mm, _z) = manager(20, 4, false); // carved [0,16) order 4 + [16,20) order 2
    let filler = mm.alloc(o(2), AllocRequest::DIRTY).unwrap().block;
    assert_eq!(filler, blk(16, 2));
    let a = mm.alloc(o(2), AllocRequest::DIRTY).unwrap().block; // [0,4)
    let _b = mm.alloc(o(0), AllocRequest::DIRTY).unwrap().block; // [4,5)
    let iso = mm.isolate_unreported(ZoneId(0), o(3), o(3), 1)[0].block; // [8,16)
    let before = mm.stats();
    let cases = [
        (blk(1000, 0), FreeError::NotOwned(Pfn(1000))),
        (
            blk(2, 1),
            FreeError::NotBlockStart {
                block: blk(2, 1),
                allocated: a,
            },
        ),
        (
            blk(0, 1),
            FreeError::WrongOrder {
                block: blk(0, 1),
                allocated: o(2),
            },
        ),
        (
            blk(0, 3),
            FreeError::WrongOrder {
                block: blk(0, 3),
                allocated: o(2),
            },
        ),
        (blk(6, 2), FreeError::Unaligned(blk(6, 2))),
        (
            blk(5, 0),
            FreeError::DoubleFree {
                block: blk(5, 0),
                free: blk(5, 0),
            },
        ),
        (
            blk(7, 0),
            FreeError::DoubleFree {
                block: blk(7, 0),
                free: blk(6, 1),
            },
        ),
        (
            iso,
            FreeError::Isolated {
                block: iso,
                isolated: iso,
            },
        ),
        (blk(16, 3), FreeError::OutOfZone(blk(16, 3))),
        (
            blk(0, 5),
            FreeError::OrderTooLarge {
                order: o(5),
                max: o(4),
            },
        ),
    ];
    for (block, want) in cases {
        assert_eq!(mm.free(block, FreeHint::Dirty), Err(want), "{block}");
        mm.check_invariants().unwrap();
        assert_eq!(mm.stats(), before, "{block}");
    }
    mm.free(a, FreeHint::Dirty).unwrap();
    assert!(matches!(
        mm.free(a, FreeHint::Dirty),
        Err(FreeError::DoubleFree { .. })
    ));
    assert_eq!(
        mm.alloc(o(5), AllocRequest::DIRTY),
        Err(AllocError::OrderTooLarge {
            order: o(5),
            max: o(4)
        })
    );
}

#[test]
fn unaligned_zone_edges_and_full_round_trip() {
    let zero = FakeZeroer::new(200, true);
    let mut cfg = MmConfig::new(vec![
        PageRange::new(Pfn(3), 37),
        PageRange::new(Pfn(100), 70),
    ]);
    cfg.max_order = o(4);
    cfg.reporting_order = o(3);
    let mm = MemoryManager::new(cfg, Arc::new(zero)).unwrap();
    mm.check_invariants().unwrap();
    let fresh = mm.stats();
    assert_eq!(fresh.free_pages_total(), 107);
    let all = alloc_all_pages(&mm);
    assert_eq!(all.len(), 107);
    assert_eq!(
        mm.alloc(o(0), AllocRequest::DIRTY),
        Err(AllocError::OutOfMemory(o(0)))
    );
    // Zone 0 is used up before zone 1 (fallback order).
    assert!(all[..37].iter().all(|b| b.pfn.0 < 40));
    for b in all.into_iter().rev() {
        mm.free(b, FreeHint::Dirty).unwrap();
    }
    mm.check_invariants().unwrap();
    assert_eq!(mm.stats().free_pages, fresh.free_pages);
}

#[test]
fn reportable_frees_bump_the_generation_and_notify() {
    let (mm, _z) = manager(64, 4, false);
    let mm = {
        let mut cfg = mm.config().clone();
        cfg.reporting_order = o(3);
        MemoryManager::new(cfg, Arc::new(NoopZeroer)).unwrap()
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    assert!(mm
        .set_report_notifier(Box::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        }))
        .is_ok());
    let small = mm.alloc(o(0), AllocRequest::DIRTY).unwrap().block;
    let other = mm.alloc(o(0), AllocRequest::DIRTY).unwrap().block;
    mm.free(small, FreeHint::Dirty).unwrap();
    // Order 0 merges no further than order 0 (buddy allocated): not reportable.
    assert_eq!(mm.reportable_generation(ZoneId(0)), 0);
    mm.free(other, FreeHint::Dirty).unwrap();
    // Now the pair merges back up to order 4.
    assert_eq!(mm.reportable_generation(ZoneId(0)), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn config_errors() {
    let z: Arc<dyn Zeroer> = Arc::new(NoopZeroer);
    let r = |s, n| PageRange::new(Pfn(s), n);
    assert_eq!(
        MemoryManager::new(MmConfig::new(vec![]), z.clone()).err(),
        Some(ConfigError::NoZones)
    );
    assert_eq!(
        MemoryManager::new(MmConfig::new(vec![r(0, 0)]), z.clone()).err(),
        Some(ConfigError::EmptyZone(ZoneId(0)))
    );
    assert_eq!(
        MemoryManager::new(MmConfig::new(vec![r(0, 10), r(9, 10)]), z.clone()).err(),
        Some(ConfigError::Overlap(ZoneId(0), ZoneId(1)))
    );
    let mut cfg = MmConfig::new(vec![r(0, 10)]);
    cfg.max_order = o(3);
    assert!(matches!(
        MemoryManager::new(cfg, z).err(),
        Some(ConfigError::ReportingOrder { .. })
    ));
}

#[test]
fn concurrent_alloc_free_keeps_invariants() {
    let mut cfg = MmConfig::new(vec![
        PageRange::new(Pfn(0), 4096),
        PageRange::new(Pfn(5000), 1000),
    ]);
    cfg.max_order = o(6);
    cfg.reporting_order = o(5);
    let mm = Arc::new(MemoryManager::new(cfg, Arc::new(NoopZeroer)).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let mm = mm.clone();
            std::thread::spawn(move || {
                for i in 0..300u32 {
                    let blocks: Vec<_> = (0..8)
                        .filter_map(|k| {
                            mm.alloc(o(((i + k + t) % 5) as u8), AllocRequest::DIRTY)
                                .ok()
                        })
                        .collect();
                    for a in blocks {
                        mm.free(a.block, FreeHint::Dirty).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    mm.check_invariants().unwrap();
    assert_eq!(mm.stats().free_pages_total(), 5096);
}

#[test]
fn settle_pass_isolates_reported_not_zero_blocks_only() {
    let (mm, z) = manager(16, 2, true);
    for b in mm.isolate_unreported(ZoneId(0), o(2), o(2), 2) {
        mm.put_back(b.block, PutBack::Reported(ZeroGuarantee::NotZeroed))
            .unwrap();
    }
    // Two reported-dirty blocks, two dirty ones.
    let settle = mm.isolate_reported_not_zero(ZoneId(0), o(0), o(2), 8);
    assert_eq!(settle.len(), 2);
    assert!(settle.iter().all(|b| b.state == FreeState::REPORTED_DIRTY));
    let (first, second) = (settle[0].block, settle[1].block);
    z.zero(first.range(), None);
    mm.put_back(first, PutBack::Reported(ZeroGuarantee::Zeroed))
        .unwrap();
    mm.put_back(second, PutBack::Failed).unwrap();
    assert_eq!(
        state(&mm, first.pfn.0),
        Some((first, FreeState::REPORTED_ZERO))
    );
    assert_eq!(
        state(&mm, second.pfn.0),
        Some((second, FreeState::REPORTED_DIRTY))
    );
    mm.check_invariants().unwrap();
}

#[test]
fn manager_is_send_and_sync_and_caches_are_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<MemoryManager>();
    send::<PcpCache<Arc<MemoryManager>>>();
}

#[test]
fn a_block_grows_in_place_only_over_whole_free_upper_buddies() {
    // 64 pages, max order 6: one free block of order 6.
    let (mm, _) = manager(64, 6, false);
    let a = mm.alloc(o(4), AllocRequest::DIRTY).unwrap().block;
    assert_eq!(a, blk(0, 4));
    // Pages 16..32 and 32..64 are free: grows to order 5, then 6.
    assert_eq!(mm.grow_in_place(a, o(5)).unwrap(), Some(blk(0, 5)));
    mm.check_invariants().unwrap();
    let b = mm.grow_in_place(blk(0, 5), o(6)).unwrap().unwrap();
    assert_eq!((b, mm.stats().allocated_pages), (blk(0, 6), 64));
    mm.check_invariants().unwrap();
    mm.free(b, FreeHint::Dirty).unwrap();
    // An upper buddy partly allocated: nothing changes.
    let a = mm.alloc(o(4), AllocRequest::DIRTY).unwrap().block;
    let c = mm.alloc(o(4), AllocRequest::DIRTY).unwrap().block;
    assert_eq!(c, blk(16, 4));
    assert_eq!(mm.grow_in_place(a, o(5)).unwrap(), None);
    assert_eq!(
        mm.grow_in_place(c, o(5)).unwrap(),
        None,
        "not the lower buddy"
    );
    assert!(mm.grow_in_place(blk(32, 4), o(5)).is_err(), "not allocated");
    mm.check_invariants().unwrap();
}

/// A zeroer that writes nothing and says so (0 bytes), claiming it knew the pages read
/// zero; `truthful` says whether they really do.
struct SkippingZeroer {
    truthful: bool,
}

impl Zeroer for SkippingZeroer {
    fn zero(&self, _range: PageRange, _hint_last: Option<Pfn>) -> u64 {
        0
    }
    fn is_zero(&self, _range: PageRange) -> bool {
        self.truthful
    }
}

fn skipping_manager(truthful: bool) -> MemoryManager {
    let mut cfg = MmConfig::new(vec![PageRange::new(Pfn(0), 1024)]);
    cfg.verify = true;
    cfg.initial_state = FreeState::DIRTY;
    MemoryManager::new(cfg, Arc::new(SkippingZeroer { truthful })).unwrap()
}

#[test]
fn a_zeroing_the_zeroer_skipped_is_counted_skipped_and_verified() {
    // Truthful: the allocation says no byte was written, and the counters agree.
    let mm = skipping_manager(true);
    let a = mm.alloc(o(3), AllocRequest::ZEROED).unwrap();
    assert_eq!(a.zeroing, Zeroing::Skipped);
    let s = mm.stats();
    assert_eq!((s.bytes_zeroed, s.bytes_zeroing_skipped), (0, 8 * 4096));
    assert_eq!((s.zero_requests, s.zero_requests_skipped), (1, 1));
    // Lying: verify mode reads the pages, fails the allocation and keeps the block free.
    let mm = skipping_manager(false);
    let free = mm.stats().free_pages_total();
    let r = mm.alloc(o(3), AllocRequest::ZEROED);
    assert!(matches!(r, Err(AllocError::VerifyFailed { .. })), "{r:?}");
    let s = mm.stats();
    assert_eq!((s.verify_failures, s.free_pages_total()), (1, free));
    mm.check_invariants().unwrap();
}
