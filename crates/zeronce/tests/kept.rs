//! The fast path's kept blocks (docs/ARCHITECTURE.md, "The fast path"): a block freed
//! dirty stays allocated and claimed on its thread's slot and is handed to the next
//! allocation of its order there; it goes back to the manager before reporting passes and
//! when the owner's last handle goes, and never crosses owners.

mod common;
use common::{eventually, order, reporting_config, reporting_setup};

use std::sync::{Arc, Weak};
use std::time::Duration;

use zeronce::zeronce_mem::{BackingKind, SharedRam};
use zeronce::zeronce_mm::reporting::ReportingConfig;
use zeronce::zeronce_mm::Zeroing;
use zeronce::{CancelToken, DiscardPolicy, PageBlock, ProcessMemory, ReportingSetup, ZeroerConfig};

/// Large enough that 2 MiB blocks are kept too (a slot keeps at most 1/64 of the memory);
/// never touched beyond what the tests write.
const SIZE: usize = 1 << 30;

fn plain() -> ProcessMemory {
    common::plain(SIZE)
}

/// Whether the block's bytes lie in `pm`'s RAM.
fn inside(pm: &ProcessMemory, b: &PageBlock) -> bool {
    let (base, len) = (pm.ram().base_addr(), pm.ram().len());
    let at = b.as_slice().as_ptr() as usize;
    at >= base && at + b.as_slice().len() <= base + len
}

#[test]
fn a_block_freed_dirty_comes_back_to_its_thread_without_the_manager() {
    let pm = plain();
    for o in [order(0), order(3), order(9)] {
        let mut b = pm.alloc(o).unwrap();
        b.as_mut_slice().fill(0x5a);
        let block = b.block();
        b.free().unwrap();
        let manager_allocs = pm.manager().stats().allocs[o.index()];
        let again = pm.alloc(o).unwrap();
        assert_eq!(again.block(), block, "order {o}: not the kept block");
        assert_eq!(again.allocation().zeroing, Zeroing::NotRequested);
        assert!(!again.allocation().prior.known_zero);
        assert_eq!(
            pm.manager().stats().allocs[o.index()],
            manager_allocs,
            "order {o}: the kept block went through the manager"
        );
        // A zero-request never gets a kept (dirty) block: verify mode checks it reads zero.
        let z = pm.alloc_zeroed(o).unwrap();
        assert_ne!(z.block(), block);
        assert!(z.as_slice().iter().all(|&x| x == 0));
        drop((again, z));
        let s = pm.stats().mm;
        assert_eq!(
            (s.allocs[o.index()], s.frees[o.index()]),
            (3, 3),
            "order {o}"
        );
        assert_eq!(
            (s.allocated_pages, s.cached_pages, s.verify_failures),
            (0, 0, 0)
        );
    }
    pm.manager().check_invariants().unwrap();
}

#[test]
fn a_zero_request_takes_a_kept_huge_block_back_before_faulting_fresh_memory() {
    // The search order of a zero-request puts resident dirty memory (a memset) before
    // fresh or reported memory (a refault of every page): a kept block is resident.
    let pm = plain();
    let mut b = pm.alloc(order(9)).unwrap();
    b.as_mut_slice().fill(0xaa);
    let block = b.block();
    drop(b);
    let resident = pm.resident_bytes();
    let z = pm.alloc_zeroed(order(9)).unwrap();
    assert_eq!(z.block(), block, "faulted fresh memory in instead");
    assert_eq!(z.allocation().zeroing, Zeroing::Done);
    assert!(z.as_slice().iter().all(|&x| x == 0));
    assert!(pm.resident_bytes() <= resident, "RSS grew");
    drop(z);
    let s = pm.stats().mm;
    assert_eq!((s.allocs[9], s.frees[9], s.verify_failures), (2, 2, 0));
}

#[test]
fn prezero_zeroes_kept_huge_blocks_too() {
    // No zeroer threads: huge blocks are kept, and the caller's prezero must reach them.
    let pm = ProcessMemory::builder()
        .size(SIZE)
        .no_reporting()
        .verify(true)
        .background_zeroer(ZeroerConfig {
            threads: 0,
            ..ZeroerConfig::default()
        })
        .build()
        .unwrap();
    let mut b = pm.alloc(order(9)).unwrap();
    b.as_mut_slice().fill(0xee);
    drop(b);
    assert_eq!(pm.prezero(u64::MAX, &CancelToken::new()), 2 << 20);
    let z = pm.alloc_zeroed(order(9)).unwrap();
    assert!(z.as_slice().iter().all(|&x| x == 0));
    // Whatever block it is, nothing was zeroed on the allocation path: the kept block was
    // zeroed by prezero, the rest never written; the allocation and the manager's
    // counters say so (the zero map knew it, not the free lists).
    assert_eq!(z.allocation().zeroing, Zeroing::Skipped);
    let s = pm.stats();
    assert_eq!(s.zeroing.alloc_path, 0);
    assert_eq!((s.mm.bytes_zeroed, s.mm.zero_requests_skipped), (0, 1));
    assert_eq!(s.mm.bytes_zeroing_skipped, 2 << 20);
}

#[test]
fn the_last_handle_gives_kept_blocks_back_and_the_memory_goes() {
    let pm = plain();
    let ram: Weak<SharedRam> = Arc::downgrade(pm.ram());
    let clone = pm.clone();
    for o in [order(0), order(2), order(9)] {
        let blocks: Vec<_> = (0..4).map(|_| clone.alloc(o).unwrap()).collect();
        drop(blocks);
    }
    // A block outliving every handle: freed afterwards, it is not kept for a closed owner.
    let survivor = pm.alloc(order(0)).unwrap();
    drop(pm);
    assert!(ram.upgrade().is_some(), "a handle is left");
    drop(clone);
    assert!(ram.upgrade().is_some(), "a block is left");
    survivor.free().unwrap();
    assert!(
        ram.upgrade().is_none(),
        "kept blocks kept the memory alive after the last handle and block"
    );
}

#[test]
fn owners_on_one_thread_never_get_each_others_blocks() {
    let (a, b) = (plain(), plain());
    for round in 0..50u8 {
        for o in [order(0), order(1), order(9)] {
            let mine = [a.alloc(o).unwrap(), b.alloc(o).unwrap()];
            assert!(
                inside(&a, &mine[0]) && inside(&b, &mine[1]),
                "round {round}"
            );
            // Freed in the other order, so each owner's most recent kept block is the
            // other owner's on the next allocation.
            let [x, y] = mine;
            drop(y);
            drop(x);
        }
    }
    for pm in [&a, &b] {
        let s = pm.stats().mm;
        assert_eq!(s.allocs.iter().sum::<u64>(), 150);
        assert_eq!(s.frees.iter().sum::<u64>(), 150);
        assert_eq!(s.allocated_pages, 0);
        pm.manager().check_invariants().unwrap();
    }
}

fn reporting(delay: Duration, reporting_order: u8) -> ProcessMemory {
    ProcessMemory::builder()
        .size(SIZE)
        .backing(BackingKind::Anonymous { thp: true })
        .reporting(ReportingSetup {
            config: ReportingConfig {
                order: order(reporting_order),
                ..reporting_config(delay)
            },
            ..reporting_setup(DiscardPolicy::Immediate, delay)
        })
        .build()
        .unwrap()
}

#[test]
fn kept_huge_blocks_are_given_back_and_reported_after_the_delay() {
    // Reporting order 9: each kept block is reportable; order 10: only two kept buddies
    // merged in the zone are, so keeping must request the pass all the same.
    for reporting_order in [9, 10] {
        let pm = reporting(Duration::from_millis(20), reporting_order);
        // Past the pass requested at start-up (it would give any kept block back too).
        std::thread::sleep(Duration::from_millis(200));
        let blocks: Vec<_> = (0..2)
            .map(|_| {
                let mut b = pm.alloc(order(9)).unwrap();
                b.as_mut_slice().fill(1);
                b
            })
            .collect();
        drop(blocks);
        assert!(
            pm.resident_bytes() >= 4 << 20,
            "the kept blocks are resident"
        );
        // The background pass gives the kept blocks back first; the resident size is read
        // without draining any cache.
        eventually(
            &format!("order {reporting_order}: the kept blocks are reported"),
            || pm.resident_bytes() < 2 << 20,
        );
        let again = pm.alloc_zeroed(order(9)).unwrap();
        assert_eq!(again.allocation().zeroing, Zeroing::Skipped);
        assert!(again.as_slice().iter().all(|&x| x == 0));
    }
}

#[test]
fn dropping_the_last_handle_during_reporting_passes_neither_hangs_nor_leaks() {
    for _ in 0..20 {
        let pm = reporting(Duration::from_millis(1), 9);
        let ram = Arc::downgrade(pm.ram());
        let worker = {
            let pm = pm.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let blocks: Vec<_> = [0, 9, 0, 9].map(|o| pm.alloc(order(o)).unwrap()).into();
                    drop(blocks);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(2));
        drop(pm);
        worker.join().unwrap();
        assert!(ram.upgrade().is_none(), "the memory outlived every handle");
    }
}

#[test]
fn a_refused_known_zero_free_leaves_the_block_dirty_and_counted_once() {
    // Verify mode refuses `free_zeroed` of a block that does not read zero; the block
    // stays allocated and its handle's drop frees it dirty. That must neither leave its
    // written bytes looking zero (a later zero-request would skip them) nor count its
    // bytes freed twice.
    let pm = plain();
    for o in [0, 3, 4, 9, 10].map(order) {
        let freed_before = pm.stats().zeroing.freed;
        let mut b = pm.alloc(o).unwrap();
        b.as_mut_slice().fill(0x77);
        assert!(b.free_zeroed().is_err(), "order {o}: the lie was accepted");
        let s = pm.stats();
        assert_eq!(s.zeroing.freed - freed_before, o.bytes(), "order {o}");
        let z = pm.alloc_zeroed(o).unwrap();
        assert!(
            z.as_slice().iter().all(|&x| x == 0),
            "order {o}: a zero-request read the refused block's bytes"
        );
    }
}

/// Huge blocks a slot keeps at most on this machine: the base (16 MiB) or, once
/// allocations found none kept, an eighth of the memory shared by the slots (one per CPU,
/// rounded up to a power of two, at most 64), whichever is more.
fn most_huge_kept() -> usize {
    let slots = std::thread::available_parallelism()
        .map_or(1, |n| n.get().min(64))
        .next_power_of_two();
    (SIZE / 8 / slots / (2 << 20)).max(8)
}

#[test]
fn a_slot_keeps_more_huge_blocks_while_allocations_find_none_and_gives_the_oldest_back() {
    let pm = plain();
    let most = most_huge_kept();
    let n = most + 20;
    // Every allocation past the kept blocks lets the slot keep one more.
    let blocks: Vec<_> = (0..n)
        .map(|i| {
            let mut b = pm.alloc(order(9)).unwrap();
            b.as_mut_slice()[0] = i as u8;
            b
        })
        .collect();
    let order_of_frees: Vec<_> = blocks.iter().map(PageBlock::block).collect();
    drop(blocks);
    let s = pm.manager().stats();
    let kept = (s.allocated_pages / 512) as usize;
    // A full list gives back all its blocks, at most 32 together.
    let batch = most.clamp(1, 32);
    assert!(
        kept <= most && kept + batch > most,
        "{kept} kept, at most {most}, the last batch back at most {batch}"
    );
    assert_eq!(
        s.allocs[9], n as u64,
        "the manager allocated every block once"
    );
    assert_eq!(s.frees[9] as usize, n - kept, "each block freed once");
    // The oldest went back (in batches), the most recent are kept.
    let first = order_of_frees[0];
    let last = order_of_frees[n - 1];
    assert!(
        pm.manager().free_state_of(first.pfn).is_some(),
        "{first} kept"
    );
    assert!(
        pm.manager().free_state_of(last.pfn).is_none(),
        "{last} not kept"
    );
    let again = pm.alloc(order(9)).unwrap();
    assert_eq!(again.block(), last, "not the most recent kept block");
    assert_eq!(pm.manager().stats().allocs[9], n as u64);
    drop(again);
    // Everything back on a drain, counted as calls.
    let s = pm.stats().mm;
    assert_eq!((s.allocs[9], s.frees[9]), (n as u64 + 1, n as u64 + 1));
    assert_eq!((s.allocated_pages, s.verify_failures), (0, 0));
    pm.manager().check_invariants().unwrap();
    // A drain takes the slot back to the base (16 MiB): blocks held across it and freed
    // afterwards, with no allocation in between, are kept up to the base only.
    let held: Vec<_> = (0..most).map(|_| pm.alloc(order(9)).unwrap()).collect();
    let _ = pm.stats();
    drop(held);
    let kept = pm.manager().stats().allocated_pages / 512;
    assert!(kept <= 8, "{kept} kept after a drain");
}

#[test]
fn a_huge_allocation_past_the_kept_blocks_takes_several_and_counts_one() {
    // Linux's `rmqueue_bulk` for the huge list: an allocation that finds none kept takes
    // a few resident dirty blocks under one zone lock and keeps the others for the next
    // allocations. The user still sees one allocation, and every block taken ahead goes
    // back when the caches drain.
    let pm = plain();
    let n = most_huge_kept() + 8;
    // More than a slot keeps: the rest reach the manager, dirty and resident.
    let blocks: Vec<_> = (0..n).map(|_| pm.alloc(order(9)).unwrap()).collect();
    drop(blocks);
    let before = pm.stats();
    let manager_before = pm.manager().stats().allocs[9];
    let first = pm.alloc(order(9)).unwrap();
    let taken = pm.manager().stats().allocs[9] - manager_before;
    assert!(taken > 1, "one block taken from the manager, not a batch");
    // The next ones come from the batch: no manager call.
    let rest: Vec<_> = (1..taken).map(|_| pm.alloc(order(9)).unwrap()).collect();
    assert_eq!(pm.manager().stats().allocs[9] - manager_before, taken);
    // In address order (the zone gives them so here: they come out of larger blocks the
    // drained ones merged into), so they come back from a program that frees them in
    // that order with buddies side by side.
    let handed: Vec<_> = [&first]
        .into_iter()
        .chain(&rest)
        .map(|b| b.block().pfn)
        .collect();
    assert!(
        handed.windows(2).all(|w| w[0] < w[1]),
        "not in address order: {handed:?}"
    );
    let mut all: Vec<_> = rest.iter().chain([&first]).map(PageBlock::block).collect();
    all.sort_by_key(|b| b.pfn);
    all.dedup();
    assert_eq!(all.len() as u64, taken, "a block handed out twice");
    assert!(rest
        .iter()
        .all(|b| b.allocation().zeroing == Zeroing::NotRequested));
    drop((first, rest));
    // Once more, then drained unused: counted once each way, nothing left allocated.
    let one = pm.alloc(order(9)).unwrap();
    drop(one);
    let after = pm.stats();
    let user = taken + 1;
    assert_eq!(after.mm.allocs[9] - before.mm.allocs[9], user);
    assert_eq!(after.mm.frees[9] - before.mm.frees[9], user);
    assert_eq!(after.zeroing.freed - before.zeroing.freed, user * (2 << 20));
    assert_eq!(after.mm.allocated_pages, 0, "a block taken ahead was lost");
}

#[test]
fn blocks_taken_ahead_into_a_kept_list_are_reported_after_the_delay() {
    // A refill keeps blocks nobody freed; like kept frees they go back before the next
    // reporting pass (the refill requests one too) and are reported: RSS follows the
    // one block still held.
    let pm = reporting(Duration::from_secs(1), 9);
    std::thread::sleep(Duration::from_millis(200));
    let blocks: Vec<_> = (0..most_huge_kept() + 8)
        .map(|_| {
            let mut b = pm.alloc(order(9)).unwrap();
            b.as_mut_slice().fill(1);
            b
        })
        .collect();
    drop(blocks);
    // The kept ones back to the manager, nothing reported yet: the next allocation
    // finds none kept.
    let flushed = pm.flush(0);
    assert_eq!(flushed.stats.pages, 0);
    let manager_before = pm.manager().stats().allocs[9];
    let held = pm.alloc(order(9)).unwrap();
    assert!(
        pm.manager().stats().allocs[9] - manager_before > 1,
        "no batch taken (reported before the allocation?)"
    );
    eventually("everything but the held block is reported", || {
        pm.resident_bytes() < 4 << 20
    });
    assert!(inside(&pm, &held));
}

#[test]
fn husks_of_blocks_given_back_carry_the_next_ones_and_go_with_the_owner() {
    // A full huge list gives its oldest blocks back in batches and keeps their entries
    // (owner reference and all) as husks; the next allocations past the kept blocks take
    // their blocks in those husks. A husk is never a block: no block is handed out twice,
    // each one's bytes are its holder's, and the owner's memory goes with its last handle.
    let pm = plain();
    let ram: Weak<SharedRam> = Arc::downgrade(pm.ram());
    let n = most_huge_kept() + 24;
    for round in 0..3u8 {
        let mut blocks: Vec<_> = (0..n).map(|_| pm.alloc(order(9)).unwrap()).collect();
        for (i, b) in blocks.iter_mut().enumerate() {
            b.as_mut_slice()[4096] = round ^ i as u8;
        }
        let mut pfns: Vec<_> = blocks.iter().map(|b| b.block().pfn).collect();
        pfns.sort();
        pfns.dedup();
        assert_eq!(pfns.len(), n, "round {round}: a block handed out twice");
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(
                b.as_slice()[4096],
                round ^ i as u8,
                "round {round}, block {i}"
            );
        }
        drop(blocks);
    }
    let s = pm.stats().mm;
    assert_eq!((s.allocs[9], s.frees[9]), (3 * n as u64, 3 * n as u64));
    assert_eq!(s.allocated_pages, 0);
    pm.manager().check_invariants().unwrap();
    // Husks are left on the slot after that drain's refills; they must not keep the owner.
    let blocks: Vec<_> = (0..n).map(|_| pm.alloc(order(9)).unwrap()).collect();
    drop(blocks);
    drop(pm);
    assert!(
        ram.upgrade().is_none(),
        "husks kept the memory alive after the last handle"
    );
}

#[test]
fn husks_outnumbering_the_blocks_a_refill_finds_stay_husks() {
    // A drain of a whole list leaves its entries as husks; a refill that finds fewer
    // resident dirty blocks than there are husks carries those blocks in some of them
    // and keeps the others as husks: none is handed out as a block, and they go with
    // the owner.
    let pm = plain();
    let ram: Weak<SharedRam> = Arc::downgrade(pm.ram());
    let all = SIZE / (2 << 20);
    // Every block written once and freed: all of the memory resident and dirty, a full
    // kept list and the husks of its drains.
    let mut blocks: Vec<_> = (0..all).map(|_| pm.alloc(order(9)).unwrap()).collect();
    for b in &mut blocks {
        b.as_mut_slice()[4096] = 0x5a;
    }
    drop(blocks);
    let free = || {
        let s = pm.manager().stats();
        s.free_pages.iter().map(|c| c.dirty).sum::<u64>() / 512
    };
    // A zero-request gives the kept blocks back first (their husks stay) and takes one;
    // dirty order-10 blocks (never kept) then hold all but three.
    let zeroed = pm.alloc_zeroed(order(9)).unwrap();
    let mut held = Vec::new();
    while free() > 3 {
        held.push(pm.alloc(order(10)).unwrap());
    }
    assert_eq!(free(), 3, "three resident dirty blocks left");
    let before = pm.manager().stats().allocs[9];
    let mut three: Vec<_> = (0..3).map(|_| pm.alloc(order(9)).unwrap()).collect();
    assert_eq!(
        pm.manager().stats().allocs[9] - before,
        3,
        "one refill of three"
    );
    let mut pfns: Vec<_> = three
        .iter()
        .chain(&held)
        .chain([&zeroed])
        .map(|b| b.block().pfn)
        .collect();
    pfns.sort();
    pfns.dedup();
    assert_eq!(pfns.len(), 4 + held.len(), "a block handed out twice");
    for (i, b) in three.iter_mut().enumerate() {
        b.as_mut_slice().fill(i as u8 + 1);
    }
    for (i, b) in three.iter().enumerate() {
        assert!(b.as_slice().iter().all(|&x| x == i as u8 + 1), "block {i}");
    }
    assert!(
        pm.alloc(order(9)).is_err(),
        "a husk was handed out as a block"
    );
    drop((three, held, zeroed));
    let s = pm.stats().mm;
    assert_eq!(s.allocs[9], s.frees[9]);
    assert_eq!(s.allocated_pages, 0);
    pm.manager().check_invariants().unwrap();
    drop(pm);
    assert!(ram.upgrade().is_none(), "husks kept the memory alive");
}

#[test]
fn two_owners_past_their_kept_huge_blocks_on_one_thread_keep_their_own() {
    // Both owners' blocks, kept blocks and husks share the thread's slot: drains, refills
    // and husks in place never hand one owner's block (or husk) to the other.
    let (a, b) = (plain(), plain());
    let n = most_huge_kept() + 24;
    for round in 0..4u8 {
        let mut of_a: Vec<_> = (0..n).map(|_| a.alloc(order(9)).unwrap()).collect();
        let mut of_b: Vec<_> = (0..n).map(|_| b.alloc(order(9)).unwrap()).collect();
        for (pm, blocks, mark) in [(&a, &mut of_a, 0xa0), (&b, &mut of_b, 0xb0)] {
            for (i, blk) in blocks.iter_mut().enumerate() {
                assert!(inside(pm, blk), "round {round}: another owner's block");
                blk.as_mut_slice()[8192] = mark ^ round ^ i as u8;
            }
        }
        for (pm, blocks, mark) in [(&a, &of_a, 0xa0), (&b, &of_b, 0xb0)] {
            let mut pfns: Vec<_> = blocks.iter().map(|blk| blk.block().pfn).collect();
            pfns.sort();
            pfns.dedup();
            assert_eq!(pfns.len(), n, "round {round}: a block handed out twice");
            for (i, blk) in blocks.iter().enumerate() {
                assert_eq!(blk.as_slice()[8192], mark ^ round ^ i as u8);
            }
            assert!(blocks.iter().all(|blk| inside(pm, blk)));
        }
        if round % 2 == 0 {
            drop((of_a, of_b));
        } else {
            // Interleaved: each list holds both owners' entries when it fills.
            for (x, y) in of_a.into_iter().zip(of_b) {
                drop(x);
                drop(y);
            }
        }
    }
    for pm in [&a, &b] {
        let s = pm.stats().mm;
        assert_eq!(s.allocs[9], s.frees[9]);
        assert_eq!(s.allocated_pages, 0);
        pm.manager().check_invariants().unwrap();
    }
    let ram_a: Weak<SharedRam> = Arc::downgrade(a.ram());
    drop(a);
    assert!(ram_a.upgrade().is_none(), "a's husks kept its memory alive");
    let again: Vec<_> = (0..n).map(|_| b.alloc(order(9)).unwrap()).collect();
    assert!(again.iter().all(|blk| inside(&b, blk)));
}

#[test]
fn two_owners_allocating_and_freeing_huge_blocks_at_random_keep_their_own() {
    // Seeded random runs of allocations and frees of two owners on one thread, past
    // their kept blocks: lists holding both owners' entries, drains of whole lists and
    // of parts, husks of both owners, refills in place and not. Every block handed out
    // lies in its owner's memory, is no other live block, and keeps what was written.
    let owners = [plain(), plain()];
    let mut live: [Vec<(PageBlock, u8)>; 2] = [Vec::new(), Vec::new()];
    let mut seed = 0x853c_49e6_748f_ea9bu64;
    let mut next = |below: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % below as u64) as usize
    };
    let most = 3 * most_huge_kept();
    for step in 0..6000usize {
        let o = next(2);
        // Runs: a phase of mostly allocations, then mostly frees, per owner.
        let allocating = (step / 150 + o) % 2 == 0;
        let alloc = live[o].is_empty()
            || (live[o].len() < most && next(8) < if allocating { 7 } else { 1 });
        if alloc {
            let mut b = owners[o].alloc(order(9)).unwrap();
            assert!(inside(&owners[o], &b), "step {step}: another owner's block");
            let mark = step as u8;
            b.as_mut_slice()[12288] = mark;
            live[o].push((b, mark));
        } else {
            let at = if next(4) == 0 {
                next(live[o].len())
            } else {
                live[o].len() - 1
            };
            let (b, mark) = live[o].swap_remove(at);
            assert_eq!(
                b.as_slice()[12288],
                mark,
                "step {step}: a block's bytes changed"
            );
            drop(b);
        }
        if step % 500 == 0 {
            let mut addrs: Vec<_> = live
                .iter()
                .flatten()
                .map(|(b, _)| b.as_slice().as_ptr() as usize)
                .collect();
            let n = addrs.len();
            addrs.sort();
            addrs.dedup();
            assert_eq!(addrs.len(), n, "step {step}: a block handed out twice");
        }
    }
    drop(live);
    for pm in &owners {
        let s = pm.stats().mm;
        assert_eq!(s.allocs[9], s.frees[9]);
        assert_eq!(s.allocated_pages, 0);
        pm.manager().check_invariants().unwrap();
    }
}

#[test]
fn a_refill_never_carries_its_blocks_in_another_owners_husks() {
    // Husks of two owners on one slot: `a`'s whole list drains (its entries become
    // husks), then `b`'s list drains onto them (one of `b`'s joins them). `a`'s next
    // refill, its list empty, must not take those husks as its own: a block of `a`'s
    // carried by `b`'s husk would be `b`'s to hand out and free.
    let (a, b) = (plain(), plain());
    let most = most_huge_kept();
    // Both slots' limits grown to the most (every allocation past the kept blocks raises
    // it), then everything given back: the lists and husks start empty.
    for pm in [&a, &b] {
        for _ in 0..4 {
            let blocks: Vec<_> = (0..2 * most).map(|_| pm.alloc(order(9)).unwrap()).collect();
            drop(blocks);
        }
    }
    let mut rounds = Vec::new();
    for round in 0..6 {
        // a: one more than its list keeps, freed: the list drains whole into husks and
        // keeps the last one, which a takes back.
        let blocks: Vec<_> = (0..most + 1).map(|_| a.alloc(order(9)).unwrap()).collect();
        drop(blocks);
        let a_keeps = a.alloc(order(9)).unwrap();
        // b: its list fills and drains onto a's husks; b takes its kept blocks back.
        let blocks: Vec<_> = (0..most + 1).map(|_| b.alloc(order(9)).unwrap()).collect();
        drop(blocks);
        let b_keeps: Vec<_> = (0..most + 1).map(|_| b.alloc(order(9)).unwrap()).collect();
        // a's list is empty: its refill meets both owners' husks.
        let a_next: Vec<_> = (0..most).map(|_| a.alloc(order(9)).unwrap()).collect();
        for blk in a_next.iter().chain([&a_keeps]) {
            assert!(
                inside(&a, blk),
                "round {round}: a got a block outside its memory"
            );
        }
        assert!(b_keeps.iter().all(|blk| inside(&b, blk)));
        rounds.push((a_keeps, b_keeps, a_next));
        if rounds.len() > 1 {
            rounds.remove(0);
        }
    }
    drop(rounds);
    for pm in [&a, &b] {
        let s = pm.stats().mm;
        assert_eq!((s.allocs[9], s.frees[9]), (s.frees[9], s.allocs[9]));
        assert_eq!(s.allocated_pages, 0, "a block freed to the wrong owner");
        pm.manager().check_invariants().unwrap();
    }
}
