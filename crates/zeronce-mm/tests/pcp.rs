//! The per-thread cache keeps the state rules exact and catches every misuse.

mod common;

use common::{blk, manager, o};
use std::sync::{Arc, Barrier};
use zeronce_mm::*;

#[test]
fn cache_serves_dirty_requests_and_never_holds_known_zero_blocks() {
    let (mm, z) = manager(16, 4, true);
    // Make the whole zone known zero.
    let a = mm.alloc(o(4), AllocRequest::ZEROED).unwrap();
    mm.free(a.block, FreeHint::KnownZero).unwrap();
    let mut cache = mm.pcp_cache();
    // No dirty block: the zone's fallback policy serves a known-zero one, the cache stays empty.
    let b = cache.alloc(o(0), AllocRequest::DIRTY).unwrap();
    assert!(b.prior.known_zero);
    assert!(cache.cached_blocks().is_empty());
    z.scribble(b.block.range());
    // Freed dirty into the cache; a zero-request does not take it from there.
    cache.free(b.block, FreeHint::Dirty).unwrap();
    assert_eq!(
        cache.cached_blocks(),
        vec![(ZoneId(0), b.block, FreeState::DIRTY)]
    );
    let c = cache.alloc(o(0), AllocRequest::ZEROED).unwrap();
    assert_eq!(c.zeroing, Zeroing::Skipped);
    assert_ne!(c.block, b.block);
    // A dirty request does.
    let d = cache.alloc(o(0), AllocRequest::DIRTY).unwrap();
    assert_eq!((d.block, d.prior), (b.block, FreeState::DIRTY));
    mm.check_invariants().unwrap();
}

#[test]
fn every_double_free_is_caught_whichever_path_frees() {
    let (mm, _z) = manager(64, 4, false);
    let mut cache = mm.pcp_cache();
    let a = cache.alloc(o(1), AllocRequest::DIRTY).unwrap().block;
    let b = mm.alloc(o(1), AllocRequest::DIRTY).unwrap().block;
    cache.free(a, FreeHint::Dirty).unwrap();
    // `a` sits in the cache: freeing it again by either path is a double free.
    assert!(matches!(
        cache.free(a, FreeHint::Dirty),
        Err(FreeError::DoubleFree { .. })
    ));
    assert!(matches!(
        mm.free(a, FreeHint::Dirty),
        Err(FreeError::DoubleFree { .. })
    ));
    // Cross paths work for live blocks, and misuse is named as by the manager.
    assert_eq!(
        cache.free(Block::new(b.pfn, o(0)), FreeHint::Dirty),
        Err(FreeError::WrongOrder {
            block: Block::new(b.pfn, o(0)),
            allocated: o(1)
        })
    );
    assert_eq!(
        cache.free(blk(1000, 0), FreeHint::Dirty),
        Err(FreeError::NotOwned(Pfn(1000)))
    );
    cache.free(b, FreeHint::Dirty).unwrap();
    assert!(matches!(
        mm.free(b, FreeHint::Dirty),
        Err(FreeError::DoubleFree { .. })
    ));
    mm.check_invariants().unwrap();
    drop(cache);
    let s = mm.stats();
    assert_eq!(
        (s.free_pages_total(), s.cached_pages, s.allocated_pages),
        (64, 0, 0)
    );
    assert_eq!((s.allocs[1], s.frees[1]), (2, 2));
}

#[test]
fn drop_drains_merges_and_counts_reportable_frees() {
    let (mm, _z) = manager(1024, 10, false);
    {
        let mut cache = mm.pcp_cache();
        let blocks: Vec<_> = (0..200)
            .map(|_| cache.alloc(o(0), AllocRequest::DIRTY).unwrap().block)
            .collect();
        for b in blocks {
            cache.free(b, FreeHint::Dirty).unwrap();
        }
        mm.check_invariants().unwrap();
        assert!(!cache.cached_blocks().is_empty());
    }
    // Everything merged back into the single order-10 block, which is reportable.
    assert_eq!(
        mm.free_state_of(Pfn(0)),
        Some((blk(0, 10), FreeState::DIRTY))
    );
    assert!(mm.reportable_generation(ZoneId(0)) >= 1);
    mm.check_invariants().unwrap();
    let s = mm.stats();
    assert_eq!((s.allocs[0], s.frees[0], s.cached_pages), (200, 200, 0));
}

#[test]
fn racing_double_frees_from_two_threads_succeed_exactly_once() {
    let mut cfg = MmConfig::new(vec![PageRange::new(Pfn(0), 4096)]);
    cfg.max_order = o(10);
    let mm = Arc::new(MemoryManager::new(cfg, Arc::new(NoopZeroer)).unwrap());
    for round in 0..50 {
        let blocks: Vec<Block> = (0..64)
            .map(|_| mm.alloc(o(0), AllocRequest::DIRTY).unwrap().block)
            .collect();
        let blocks = Arc::new(blocks);
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (mm, blocks, barrier) = (mm.clone(), blocks.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut cache = PcpCache::new(mm.clone());
                    barrier.wait();
                    // One thread frees through its cache, the other alternates paths.
                    blocks
                        .iter()
                        .enumerate()
                        .filter(|&(i, b)| {
                            if t == 1 && (i + round) % 2 == 0 {
                                mm.free(*b, FreeHint::Dirty).is_ok()
                            } else {
                                cache.free(*b, FreeHint::Dirty).is_ok()
                            }
                        })
                        .count()
                })
            })
            .collect();
        let ok: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(ok, 64, "round {round}: each block freed exactly once");
        mm.check_invariants().unwrap();
    }
    assert_eq!(mm.stats().free_pages_total(), 4096);
}

#[test]
fn threads_with_caches_share_a_manager() {
    let mut cfg = MmConfig::new(vec![
        PageRange::new(Pfn(0), 8192),
        PageRange::new(Pfn(9000), 500),
    ]);
    cfg.pcp_batch_pages = 16;
    cfg.pcp_high_pages = 64;
    let mm = Arc::new(MemoryManager::new(cfg, Arc::new(NoopZeroer)).unwrap());
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let mm = mm.clone();
            std::thread::spawn(move || {
                let mut cache = PcpCache::new(mm);
                let mut held = Vec::new();
                for i in 0..2000u32 {
                    let order = o(((i + t) % 5) as u8);
                    if let Ok(a) = cache.alloc(order, AllocRequest::DIRTY) {
                        held.push(a.block);
                    }
                    if held.len() > 20 {
                        let b = held.swap_remove((i as usize * 7) % held.len());
                        cache.free(b, FreeHint::Dirty).unwrap();
                    }
                }
                for b in held {
                    cache.free(b, FreeHint::Dirty).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    mm.check_invariants().unwrap();
    let s = mm.stats();
    assert_eq!((s.free_pages_total(), s.cached_pages), (8692, 0));
    assert_eq!(s.allocs.iter().sum::<u64>(), s.frees.iter().sum::<u64>());
}

#[test]
fn a_cache_gives_its_blocks_back_before_failing() {
    let (mm, _z) = manager(16, 4, false);
    let mut cache = mm.pcp_cache();
    // Fill the cache with order-0 blocks covering the whole zone.
    let all: Vec<_> = (0..16)
        .map(|_| cache.alloc(o(0), AllocRequest::DIRTY).unwrap().block)
        .collect();
    for b in all {
        cache.free(b, FreeHint::Dirty).unwrap();
    }
    // Whatever the cache kept, an order-4 request must find the whole zone again.
    let big = cache.alloc(o(4), AllocRequest::DIRTY).unwrap();
    assert_eq!(big.block, blk(0, 4));
    assert!(cache.cached_blocks().is_empty());
    assert_eq!(
        cache.alloc(o(0), AllocRequest::DIRTY),
        Err(AllocError::OutOfMemory(o(0)))
    );
    mm.check_invariants().unwrap();
}
