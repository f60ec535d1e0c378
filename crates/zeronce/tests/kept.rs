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
