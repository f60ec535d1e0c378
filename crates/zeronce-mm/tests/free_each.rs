//! [`MemoryManager::free_each`] (many frees under one zone lock per zone) ends in exactly
//! the state the same frees one by one end in: free lists and states, counters, errors,
//! the zones told about reportable blocks.

mod common;

use common::{o, FakeZeroer};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use zeronce_mm::*;

/// Pages of each of the two zones (the second one starts right after the first).
const ZONE_PAGES: u64 = 64;

/// A manager over two zones with max order 4 and reporting order 2, verify on, and the
/// zones its notifier was called for.
fn twin() -> (MemoryManager, Arc<Mutex<BTreeSet<usize>>>) {
    let z = FakeZeroer::new(2 * ZONE_PAGES, true);
    let mut cfg = MmConfig::new(vec![
        PageRange::new(Pfn(0), ZONE_PAGES),
        PageRange::new(Pfn(ZONE_PAGES), ZONE_PAGES),
    ]);
    cfg.max_order = o(4);
    cfg.reporting_order = o(2);
    cfg.verify = true;
    let mm = MemoryManager::new(cfg, Arc::new(z)).unwrap();
    let told = Arc::new(Mutex::new(BTreeSet::new()));
    let t = told.clone();
    let notify: ReportNotifier = Box::new(move |zone| {
        t.lock().unwrap().insert(zone.0);
    });
    assert!(mm.set_report_notifier(notify).is_ok());
    (mm, told)
}

/// One entry of the list freed: an allocated block, or a bad one (every misuse the
/// manager names).
#[derive(Clone, Debug)]
enum Entry {
    /// The `i`-th allocated block (modulo their number), with a known-zero hint or not.
    Allocated { i: usize, zero: bool },
    /// A block of `order` at `pfn` whatever it is (double, misaligned, outside, wrong
    /// order).
    Any { pfn: u64, order: u8, zero: bool },
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        4 => (any::<usize>(), any::<bool>()).prop_map(|(i, zero)| Entry::Allocated { i, zero }),
        1 => (0..2 * ZONE_PAGES + 8, 0u8..6, any::<bool>())
            .prop_map(|(pfn, order, zero)| Entry::Any { pfn, order, zero }),
    ]
}

fn hint(zero: bool) -> FreeHint {
    if zero {
        FreeHint::KnownZero
    } else {
        FreeHint::Dirty
    }
}

/// Everything observable about a manager.
fn observe(mm: &MemoryManager) -> (Stats, Vec<Option<(Block, FreeState)>>) {
    mm.check_invariants().unwrap();
    let states = (0..2 * ZONE_PAGES)
        .map(|p| mm.free_state_of(Pfn(p)))
        .collect();
    (mm.stats(), states)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn free_each_is_the_frees_one_by_one(
        allocs in prop::collection::vec((0u8..4, any::<bool>()), 1..40),
        entries in prop::collection::vec(entry(), 0..48),
        one_hint in any::<bool>(),
    ) {
        let (bulk, bulk_told) = twin();
        let (single, single_told) = twin();
        let mut blocks = Vec::new();
        for &(order, zeroed) in &allocs {
            let req = if zeroed { AllocRequest::ZEROED } else { AllocRequest::DIRTY };
            let a = bulk.alloc(o(order), req);
            prop_assert_eq!(&a, &single.alloc(o(order), req));
            if let Ok(a) = a {
                blocks.push(a.block);
            }
        }
        prop_assume!(!blocks.is_empty());
        // free_each takes one hint for all: runs of entries with that hint.
        let hint_of = |zero: bool| hint(if one_hint { false } else { zero });
        let list: Vec<(Block, FreeHint)> = entries
            .iter()
            .map(|e| match *e {
                Entry::Allocated { i, zero } => (blocks[i % blocks.len()], hint_of(zero)),
                Entry::Any { pfn, order, zero } => (Block::new(Pfn(pfn), o(order)), hint_of(zero)),
            })
            .collect();
        let mut bulk_errors = Vec::new();
        for run in list.chunk_by(|a, b| a.1 == b.1) {
            let blocks: Vec<Block> = run.iter().map(|(b, _)| *b).collect();
            bulk.free_each(&blocks, run[0].1, |b, e| bulk_errors.push((b, e)));
        }
        let single_errors: Vec<(Block, FreeError)> = list
            .iter()
            .filter_map(|&(b, h)| single.free(b, h).err().map(|e| (b, e)))
            .collect();
        prop_assert_eq!(bulk_errors, single_errors);
        prop_assert_eq!(observe(&bulk), observe(&single));
        prop_assert_eq!(&*bulk_told.lock().unwrap(), &*single_told.lock().unwrap());
    }
}
