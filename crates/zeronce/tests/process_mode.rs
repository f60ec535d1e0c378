//! Process mode on real memory: report, then allocate zeroed with verify mode on, for every
//! backing. The hugetlb variants need reserved 2 MiB pages, so they are `#[ignore]`d and
//! reported skipped by the runner; `.ci/run` reserves pages and runs them
//! (`cargo nextest run --run-ignored all`), where a missing reservation fails them.

mod common;
use common::{eventually, order, reporting_config, reporting_setup, NEVER};

use std::time::Duration;

use zeronce::zeronce_mem::{BackingKind, HugePageSize, RamError};
use zeronce::zeronce_mm::Zeroing;
use zeronce::{BuildError, DiscardPolicy, Order, ProcessMemory, ReportingSetup};

const SIZE: usize = 32 << 20;

fn order9() -> Order {
    order(9)
}

/// Reporting only when the tests flush.
fn setup(policy: DiscardPolicy) -> ReportingSetup {
    reporting_setup(policy, NEVER)
}

/// Process memory of `kind` in verify mode; panics saying what to reserve when `kind` is
/// hugetlb and this machine has no free 2 MiB pages.
fn build(kind: BackingKind, policy: DiscardPolicy) -> ProcessMemory {
    let r = ProcessMemory::builder()
        .size(SIZE)
        .backing(kind)
        .verify(true)
        .fresh_is_zero(false)
        .reporting(setup(policy))
        .build();
    match r {
        Err(BuildError::Ram(e @ (RamError::NoHugePages { .. } | RamError::HugetlbPool(_)))) => {
            panic!("{kind:?} needs reserved huge pages (echo 64 > /proc/sys/vm/nr_hugepages): {e}")
        }
        other => other.unwrap(),
    }
}

/// The backings every machine has; hugetlb runs in the `hugetlb_*` tests.
fn kinds() -> [BackingKind; 2] {
    [BackingKind::Anonymous { thp: true }, BackingKind::Memfd]
}

const HUGETLB: BackingKind = BackingKind::Hugetlb(HugePageSize::Size2M);

/// Allocates every free 2 MiB block, fills it with `byte`, frees them all; the count.
fn dirty_everything(pm: &ProcessMemory, byte: u8) -> usize {
    let mut blocks = Vec::new();
    while let Ok(mut b) = pm.alloc(order9()) {
        b.as_mut_slice().fill(byte);
        blocks.push(b);
    }
    blocks.len()
}

/// [`dirty_everything`], then a flush that must report and discard it all; the count.
fn dirty_free_and_flush(pm: &ProcessMemory) -> usize {
    let n = dirty_everything(pm, 0xA5);
    let r = pm.flush(u64::MAX);
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(
        r.stats.pages,
        SIZE as u64 / 4096,
        "every free page reported"
    );
    // (RSS is not checked here: verify mode reads the discarded pages, which maps the
    // shared zero page; zeronce-mem's tests check what each discard returns.)
    assert_eq!(pm.stats().device.unwrap().discarded_bytes, SIZE as u64);
    n
}

#[test]
fn reported_memory_comes_back_zero_without_zeroing_on_every_backing() {
    for kind in kinds() {
        reported_memory_comes_back_zero_without_zeroing_on_every_backing_on(kind);
    }
}

#[test]
#[ignore = "needs reserved 2 MiB huge pages; .ci/run reserves them and runs it"]
fn hugetlb_reported_memory_comes_back_zero_without_zeroing_on_every_backing() {
    reported_memory_comes_back_zero_without_zeroing_on_every_backing_on(HUGETLB);
}

fn reported_memory_comes_back_zero_without_zeroing_on_every_backing_on(kind: BackingKind) {
    let pm = build(kind, DiscardPolicy::Immediate);
    let n = dirty_free_and_flush(&pm);
    assert_eq!(
        pm.stats().device.unwrap().zeroed_bytes,
        SIZE as u64,
        "{kind:?}"
    );
    let blocks: Vec<_> = (0..n).map(|_| pm.alloc_zeroed(order9()).unwrap()).collect();
    for b in &blocks {
        // Verify mode already read it; read again through the handle.
        assert_eq!(b.allocation().zeroing, Zeroing::Skipped, "{kind:?}");
        assert!(b.as_slice().iter().all(|&x| x == 0), "{kind:?}");
    }
    assert_eq!(pm.stats().mm.verify_failures, 0);
    drop(blocks);
    pm.manager().check_invariants().unwrap();
}

#[test]
fn lazy_policy_never_claims_zero() {
    let pm = build(BackingKind::Anonymous { thp: false }, DiscardPolicy::Lazy);
    dirty_free_and_flush_lazy(&pm);
    let mut b = pm.alloc_zeroed(order9()).unwrap();
    assert_eq!(
        b.allocation().zeroing,
        Zeroing::Done,
        "MADV_FREE memory must be zeroed"
    );
    assert!(b.as_slice().iter().all(|&x| x == 0));
    b.as_mut_slice()[0] = 1;
    assert_eq!(pm.stats().device.unwrap().zeroed_bytes, 0);
    assert!(matches!(
        ProcessMemory::builder()
            .size(SIZE)
            .backing(BackingKind::Memfd)
            .reporting(setup(DiscardPolicy::Lazy))
            .build(),
        Err(BuildError::Policy(_))
    ));
}

/// Lazy discards keep RSS until pressure, so only the report itself is checked.
fn dirty_free_and_flush_lazy(pm: &ProcessMemory) {
    let blocks: Vec<_> = (0..4)
        .map(|_| {
            let mut b = pm.alloc(order9()).unwrap();
            b.as_mut_slice().fill(0x5A);
            b
        })
        .collect();
    drop(blocks);
    let r = pm.flush(u64::MAX);
    assert!(r.error.is_none() && r.stats.zeroed_pages == 0 && r.stats.pages > 0);
}

#[test]
fn a_block_taken_back_during_its_hold_is_zeroed_by_the_allocator() {
    for kind in kinds() {
        a_block_taken_back_during_its_hold_is_zeroed_by_the_allocator_on(kind);
    }
}

#[test]
#[ignore = "needs reserved 2 MiB huge pages; .ci/run reserves them and runs it"]
fn hugetlb_a_block_taken_back_during_its_hold_is_zeroed_by_the_allocator() {
    a_block_taken_back_during_its_hold_is_zeroed_by_the_allocator_on(HUGETLB);
}

fn a_block_taken_back_during_its_hold_is_zeroed_by_the_allocator_on(kind: BackingKind) {
    // A hold nobody outlives: the background worker cannot settle anything.
    let pm = build(kind, DiscardPolicy::Hold(Duration::from_secs(3600)));
    dirty_everything(&pm, 0xC3);
    // Reported, held (still resident with old contents), so not known zero.
    let r = pm.flush(u64::MAX);
    assert_eq!(
        (r.stats.pages, r.stats.zeroed_pages),
        (SIZE as u64 / 4096, 0)
    );
    // Taken back during the hold: zeroed by the allocator, truthful.
    let early = pm.alloc_zeroed(order9()).unwrap();
    assert_eq!(early.allocation().zeroing, Zeroing::Done, "{kind:?}");
    assert!(early.as_slice().iter().all(|&x| x == 0));
    // The hold is not over: a settle pass discards nothing.
    let s = pm.settle();
    assert_eq!(
        (
            s.stats.zeroed_pages,
            pm.stats().device.unwrap().discarded_bytes
        ),
        (0, 0)
    );
    drop(early);
    pm.manager().check_invariants().unwrap();
}

#[test]
fn held_blocks_become_known_zero_once_the_hold_is_over() {
    for kind in kinds() {
        held_blocks_become_known_zero_once_the_hold_is_over_on(kind);
    }
}

#[test]
#[ignore = "needs reserved 2 MiB huge pages; .ci/run reserves them and runs it"]
fn hugetlb_held_blocks_become_known_zero_once_the_hold_is_over() {
    held_blocks_become_known_zero_once_the_hold_is_over_on(HUGETLB);
}

fn held_blocks_become_known_zero_once_the_hold_is_over_on(kind: BackingKind) {
    let pm = build(kind, DiscardPolicy::Hold(Duration::ZERO));
    let n = dirty_everything(&pm, 0x3C);
    let r = pm.flush(u64::MAX);
    assert_eq!(r.stats.zeroed_pages, 0, "held, not zero yet");
    // The hold is over at once: the background worker or this settle discards them
    // (whichever comes first; both count in the device).
    pm.settle();
    let d = pm.stats().device.unwrap();
    assert_eq!((d.zeroed_bytes, d.held_bytes), (SIZE as u64, 0), "{kind:?}");
    let all: Vec<_> = (0..n).map(|_| pm.alloc_zeroed(order9()).unwrap()).collect();
    assert!(
        all.iter()
            .all(|b| b.allocation().zeroing == Zeroing::Skipped),
        "{kind:?}"
    );
    drop(all);
    pm.manager().check_invariants().unwrap();
}

#[test]
fn the_worker_reports_after_the_delay_without_a_flush() {
    let pm = ProcessMemory::builder()
        .size(SIZE)
        .backing(BackingKind::Anonymous { thp: true })
        .verify(true)
        .reporting(ReportingSetup {
            config: reporting_config(Duration::from_millis(10)),
            ..ReportingSetup::default()
        })
        .build()
        .unwrap();
    let mut b = pm.alloc(order9()).unwrap();
    b.as_mut_slice().fill(1);
    drop(b);
    eventually("the worker reports the freed block", || {
        pm.stats().mm.reported_pages() == SIZE as u64 / 4096
    });
    let b = pm.alloc_zeroed(order9()).unwrap();
    assert_eq!(b.allocation().zeroing, Zeroing::Skipped);
}

#[test]
fn a_zero_request_takes_back_a_held_or_lazily_freed_block_before_fresh_memory() {
    // Held (`Hold`) and `MADV_FREE`d (`Lazy`) blocks are reported but still resident:
    // taking one back costs a memset and no fault, while fresh (never touched) memory,
    // though known zero, faults every page in and grows RSS.
    for policy in [
        DiscardPolicy::Hold(Duration::from_secs(3600)),
        DiscardPolicy::Lazy,
    ] {
        let pm = ProcessMemory::builder()
            .size(SIZE)
            .backing(BackingKind::Anonymous { thp: false })
            .reporting(setup(policy))
            .build()
            .unwrap();
        let mut b = pm.alloc(order9()).unwrap();
        let used = b.block();
        b.as_mut_slice().fill(0x77);
        drop(b);
        let r = pm.flush(u64::MAX);
        assert!(r.error.is_none() && r.stats.pages > 0, "{policy:?}: {r:?}");
        let resident = pm.resident_bytes();
        let again = pm.alloc_zeroed(order9()).unwrap();
        assert_eq!(again.block(), used, "{policy:?}: took fresh memory instead");
        assert_eq!(again.allocation().zeroing, Zeroing::Done, "{policy:?}");
        assert!(again.as_slice().iter().all(|&x| x == 0), "{policy:?}");
        assert!(pm.resident_bytes() <= resident, "{policy:?}: RSS grew");
    }
}

/// Small blocks freed dirty are kept on the thread's slot and handed to the next
/// allocation of their order: a zero-request never gets one (it reads zero, checked in
/// verify mode), stats count every allocation and free, and every kept block is back in
/// the manager once stats have drained the caches.
#[test]
fn kept_blocks_are_counted_and_never_serve_zero_requests() {
    let pm = common::plain(SIZE);
    for order in [Order::ZERO, Order::new(3).unwrap()] {
        for _ in 0..10 {
            let blocks: Vec<_> = (0..8)
                .map(|_| {
                    let mut b = pm.alloc(order).unwrap();
                    b.as_mut_slice().fill(0xa5);
                    b
                })
                .collect();
            blocks.into_iter().for_each(|b| b.free().unwrap());
        }
        let zeroed = pm.alloc_zeroed(order).unwrap();
        assert!(zeroed.as_slice().iter().all(|&b| b == 0));
        zeroed.free().unwrap();
        let s = pm.stats().mm;
        let o = order.index();
        assert_eq!((s.allocs[o], s.frees[o]), (81, 81), "order {order}");
        assert_eq!((s.allocated_pages, s.cached_pages), (0, 0));
        assert_eq!(s.verify_failures, 0);
        pm.manager().check_invariants().unwrap();
    }
}
