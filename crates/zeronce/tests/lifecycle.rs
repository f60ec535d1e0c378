//! The zero-once lifecycle on real memory: freed blocks zeroed in the background (known
//! zero, resident), then reported; `init_on_free` / `init_on_alloc`; never a byte zeroed
//! twice, never a zeroer writing a block someone holds.

use std::time::Duration;

use proptest::prelude::*;
use zeronce::zeronce_mem::BackingKind;
use zeronce::zeronce_mm::reporting::ReportingConfig;
use zeronce::zeronce_mm::{FreeState, Zeroing};
use zeronce::{
    CancelToken, DiscardPolicy, ProcessMemory, ReportingSetup, ZeroerConfig, ZeroingStats,
};

mod common;
use common::{eventually, order, reporting_config, reporting_setup};

const SIZE: usize = 32 << 20;

/// The zero-once lifecycle with `hold` and `threads` background zeroers, verify mode on.
fn build(hold: Duration, threads: usize) -> ProcessMemory {
    ProcessMemory::builder()
        .size(SIZE)
        .backing(BackingKind::Anonymous { thp: true })
        .verify(true)
        .reporting(zero_then_report(hold))
        .background_zeroer(ZeroerConfig {
            threads,
            ..ZeroerConfig::default()
        })
        .build()
        .unwrap()
}

/// Allocates `n` blocks of order 9, fills them, frees them.
fn dirty(pm: &ProcessMemory, n: usize) {
    let blocks: Vec<_> = (0..n)
        .map(|_| {
            let mut b = pm.alloc(order(9)).unwrap();
            b.as_mut_slice().fill(0xA5);
            b
        })
        .collect();
    drop(blocks);
}

#[test]
fn freed_blocks_are_zeroed_in_the_background_and_taken_without_a_memset() {
    let pm = build(Duration::from_secs(3600), 1);
    dirty(&pm, 4);
    eventually("background zeroing of 8 MiB", || {
        pm.stats().zeroing.background >= 8 << 20
    });
    let b = pm.alloc_zeroed(order(9)).unwrap();
    // Known zero and still resident: neither zeroed nor reported.
    assert_eq!(b.allocation().zeroing, Zeroing::Skipped);
    assert_eq!(b.allocation().prior, FreeState::ZERO);
    assert!(b.as_slice().iter().all(|&x| x == 0));
    let z = pm.stats().zeroing;
    assert_eq!((z.background, z.alloc_path), (8 << 20, 0));
    drop(b);
    pm.manager().check_invariants().unwrap();
}

#[test]
fn after_the_hold_zeroed_blocks_are_reported_and_stay_known_zero() {
    let pm = build(Duration::from_millis(10), 1);
    dirty(&pm, 4);
    eventually("every page reported", || {
        pm.stats().mm.reported_pages() == SIZE as u64 / 4096
    });
    let s = pm.stats();
    assert_eq!(
        s.device.unwrap().zeroed_bytes,
        s.device.unwrap().discarded_bytes
    );
    let all: Vec<_> = (0..SIZE >> 21)
        .map(|_| pm.alloc_zeroed(order(9)).unwrap())
        .collect();
    assert!(all
        .iter()
        .all(|b| b.allocation().zeroing == Zeroing::Skipped));
    assert_eq!(pm.stats().zeroing.alloc_path, 0);
}

#[test]
fn prezero_runs_on_the_callers_thread_and_stops_when_cancelled() {
    let pm = build(Duration::from_secs(3600), 0);
    dirty(&pm, 3);
    let cancelled = CancelToken::new();
    cancelled.cancel();
    assert_eq!(pm.prezero(u64::MAX, &cancelled), 0);
    assert_eq!(pm.prezero(2 << 20, &CancelToken::new()), 2 << 20);
    assert_eq!(pm.prezero(u64::MAX, &CancelToken::new()), 4 << 20);
    assert_eq!(pm.prezero(u64::MAX, &CancelToken::new()), 0, "nothing left");
    assert_eq!(pm.stats().zeroing.background, 6 << 20);
}

#[test]
fn a_half_zeroed_block_merged_with_a_dirty_buddy_is_not_zeroed_twice() {
    let pm = build(Duration::from_secs(3600), 0);
    let mut a = pm.alloc(order(9)).unwrap();
    let mut b = pm.alloc(order(9)).unwrap();
    assert_eq!(a.block().pfn.0 ^ 512, b.block().pfn.0, "buddies");
    a.as_mut_slice().fill(1);
    b.as_mut_slice().fill(2);
    drop(a);
    assert_eq!(pm.prezero(u64::MAX, &CancelToken::new()), 2 << 20);
    // The merge forgets "known zero" (zero ∧ dirty); the chunk states do not.
    drop(b);
    let both = pm.alloc_zeroed(order(10)).unwrap();
    assert_eq!(both.allocation().zeroing, Zeroing::Done);
    assert!(both.as_slice().iter().all(|&x| x == 0));
    let z = pm.stats().zeroing;
    assert_eq!(
        (z.background, z.alloc_path, z.skipped_by_map),
        (2 << 20, 2 << 20, 2 << 20)
    );
}

#[test]
fn the_background_zeroer_never_writes_a_block_someone_holds() {
    // Four threads allocate, fill with their own pattern, check it, free; two zeroers
    // zero every freed chunk as fast as they can meanwhile.
    let pm = build(Duration::from_secs(3600), 2);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let pm = &pm;
            s.spawn(move || {
                for round in 0..200u32 {
                    let o = order(9 + (round % 2) as u8);
                    let Ok(mut b) = pm.alloc(o) else { continue };
                    let pattern = t * 16 + 1;
                    b.as_mut_slice().fill(pattern);
                    std::thread::yield_now();
                    assert!(b.as_slice().iter().all(|&x| x == pattern), "overwritten");
                    drop(b);
                }
            });
        }
    });
    pm.set_background_zeroing(false);
    pm.manager().check_invariants().unwrap();
}

/// `background + alloc_path + at_free <= freed` on memory that starts zero: every byte
/// zeroed was freed since it was last zeroed.
fn never_twice(z: ZeroingStats) -> bool {
    z.background + z.alloc_path + z.at_free <= z.freed
}

/// The zero-once lifecycle with `hold`, without the watermark gate.
fn zero_then_report(hold: Duration) -> ReportingSetup {
    ReportingSetup {
        config: reporting_config(hold),
        ..ReportingSetup::zero_then_report(hold)
    }
}

/// Host policies, the zero-once lifecycle, and none (no reporting, no background zeroer).
fn host() -> impl Strategy<Value = Option<ReportingSetup>> {
    let policy = |p| Some(reporting_setup(p, ReportingConfig::default().delay));
    prop_oneof![
        Just(None),
        Just(policy(DiscardPolicy::Immediate)),
        Just(policy(DiscardPolicy::Hold(Duration::from_secs(3600)))),
        Just(policy(DiscardPolicy::Lazy)),
        Just(Some(zero_then_report(Duration::ZERO))),
        Just(Some(zero_then_report(Duration::from_secs(3600)))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Blocks of every size, from one page (far below the reporting order, 2 MiB) to
    /// 4 MiB, in every combination of `init_on_free`, `init_on_alloc` and host policy.
    #[test]
    fn no_byte_is_zeroed_twice_in_any_combination(
        init_on_free in any::<bool>(),
        init_on_alloc in any::<bool>(),
        host in host(),
        ops in prop::collection::vec((0u8..6, 0u8..=10, any::<bool>()), 1..80),
    ) {
        let mut builder = ProcessMemory::builder()
            .size(SIZE)
            .backing(BackingKind::Anonymous { thp: false })
            .verify(true)
            .init_on_free(init_on_free)
            .init_on_alloc(init_on_alloc);
        if let Some(setup) = host {
            builder = builder.reporting(setup);
        }
        let pm = builder.build().unwrap();
        let mut live = Vec::new();
        for (op, o, zeroed) in ops {
            match op {
                0 | 1 => {
                    let r = if zeroed { pm.alloc_zeroed(order(o)) } else { pm.alloc(order(o)) };
                    if let Ok(mut b) = r {
                        if zeroed || init_on_alloc {
                            prop_assert!(b.as_slice().iter().all(|&x| x == 0));
                        }
                        b.as_mut_slice().fill(0xEE);
                        live.push(b);
                    }
                }
                2 if !live.is_empty() => drop(live.swap_remove(o as usize % live.len())),
                3 => { pm.prezero(u64::MAX, &CancelToken::new()); }
                4 => { pm.flush(u64::MAX); }
                _ => {}
            }
            let z = pm.stats().zeroing;
            prop_assert!(never_twice(z), "{z:?}");
        }
        drop(live);
        prop_assert!(never_twice(pm.stats().zeroing));
        prop_assert_eq!(pm.stats().mm.verify_failures, 0);
    }
}

/// A 16 MiB block (never kept on a thread's list) of a 64 MiB memory in small pages, verify
/// mode on (every skipped zeroing is read back), no reporting and no zeroer: what a free
/// leaves is what the next zero-request finds.
fn scanning(scan: bool) -> ProcessMemory {
    ProcessMemory::builder()
        .size(64 << 20)
        .backing(BackingKind::Anonymous { thp: false })
        .max_order(order(12))
        .verify(true)
        .no_reporting()
        .scan_freed(scan)
        .build()
        .unwrap()
}

#[test]
fn a_block_its_holder_only_read_goes_back_known_zero_and_a_written_page_is_found() {
    const BLOCK: u64 = 16 << 20;
    for scan in [true, false] {
        let pm = scanning(scan);
        let zeroed = |pm: &ProcessMemory| pm.stats().zeroing.alloc_path;
        // Fresh memory, only read: the kernel's zero page behind every page.
        let b = pm.alloc_zeroed(order(12)).unwrap();
        assert!(b.as_slice().iter().step_by(4096).all(|&x| x == 0));
        drop(b);
        let before = zeroed(&pm);
        // Handed out again: not zeroed when the free looked at the page tables.
        let mut b = pm.alloc_zeroed(order(12)).unwrap();
        assert!(b.as_slice().iter().all(|&x| x == 0));
        let second = zeroed(&pm) - before;
        // One page written, in the third 2 MiB chunk; the rest only read.
        b.as_mut_slice()[(4 << 20) + 5 * 4096 + 9] = 7;
        drop(b);
        let before = zeroed(&pm);
        let b = pm.alloc_zeroed(order(12)).unwrap();
        assert!(b.as_slice().iter().all(|&x| x == 0), "scan {scan}");
        let third = zeroed(&pm) - before;
        drop(b);
        if scan {
            assert_eq!(second, 0, "a block only read was zeroed again");
            assert!(
                third > 0 && third <= 4096,
                "scan on: {third} bytes zeroed for one written page"
            );
        } else {
            assert_eq!(
                (second, third),
                (BLOCK, BLOCK),
                "scan off: every page written"
            );
        }
        let s = pm.stats().mm;
        assert_eq!((s.allocated_pages, s.verify_failures), (0, 0));
    }
}
