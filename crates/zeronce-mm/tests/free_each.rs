//! [`MemoryManager::free_each`] (many frees under one zone lock per zone) ends in exactly
//! the state the same frees one by one end in: free lists and states, counters, errors,
//! the zones told about reportable blocks; buddies side by side are among them. And
//! [`MemoryManager::alloc_resident_dirty`] of many blocks takes what as many takes of one
//! block take, whole blocks of a higher order among them.

mod common;

use common::{o, FakeZeroer};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use zeronce_mm::*;

/// Pages of each of the two zones (the second one starts right after the first).
const ZONE_PAGES: u64 = 64;

/// A manager over two zones with max order 5 (above [`PCP_MAX_ORDER`] + 1, so buddies of
/// order 4 are freed as a pair) and reporting order 2, verify on, and the zones its
/// notifier was called for.
fn twin() -> (MemoryManager, Arc<Mutex<BTreeSet<usize>>>) {
    let z = FakeZeroer::new(2 * ZONE_PAGES, true);
    let mut cfg = MmConfig::new(vec![
        PageRange::new(Pfn(0), ZONE_PAGES),
        PageRange::new(Pfn(ZONE_PAGES), ZONE_PAGES),
    ]);
    cfg.max_order = o(5);
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
    /// The `i`-th allocated block's lower buddy then upper buddy (either may be free or
    /// split), with one hint.
    Buddies { i: usize, zero: bool },
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        4 => (any::<usize>(), any::<bool>()).prop_map(|(i, zero)| Entry::Allocated { i, zero }),
        1 => (0..2 * ZONE_PAGES + 8, 0u8..7, any::<bool>())
            .prop_map(|(pfn, order, zero)| Entry::Any { pfn, order, zero }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, zero)| Entry::Buddies { i, zero }),
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

/// The same allocations (order, zero-request) on both managers, which must answer the
/// same; the blocks allocated.
fn alloc_both(
    a: &MemoryManager,
    b: &MemoryManager,
    allocs: &[(u8, bool)],
) -> Result<Vec<Block>, TestCaseError> {
    let mut blocks = Vec::new();
    for &(order, zeroed) in allocs {
        let req = if zeroed {
            AllocRequest::ZEROED
        } else {
            AllocRequest::DIRTY
        };
        let got = a.alloc(o(order), req);
        prop_assert_eq!(&got, &b.alloc(o(order), req));
        if let Ok(got) = got {
            blocks.push(got.block);
        }
    }
    Ok(blocks)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn free_each_is_the_frees_one_by_one(
        allocs in prop::collection::vec((0u8..6, any::<bool>()), 1..40),
        entries in prop::collection::vec(entry(), 0..48),
        one_hint in any::<bool>(),
    ) {
        let (bulk, bulk_told) = twin();
        let (single, single_told) = twin();
        let blocks = alloc_both(&bulk, &single, &allocs)?;
        prop_assume!(!blocks.is_empty());
        // free_each takes one hint for all: runs of entries with that hint.
        let hint_of = |zero: bool| hint(if one_hint { false } else { zero });
        let list: Vec<(Block, FreeHint)> = entries
            .iter()
            .flat_map(|e| match *e {
                Entry::Allocated { i, zero } => vec![(blocks[i % blocks.len()], hint_of(zero))],
                Entry::Any { pfn, order, zero } => {
                    vec![(Block::new(Pfn(pfn), o(order)), hint_of(zero))]
                }
                Entry::Buddies { i, zero } => {
                    let b = blocks[i % blocks.len()];
                    let lower = Pfn(b.pfn.0 & !(2 * b.order.pages() - 1));
                    let upper = Pfn(lower.0 + b.order.pages());
                    [lower, upper]
                        .map(|pfn| (Block::new(pfn, b.order), hint_of(zero)))
                        .to_vec()
                }
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn alloc_resident_dirty_of_many_is_as_many_of_one(
        allocs in prop::collection::vec((0u8..6, any::<bool>()), 0..24),
        frees in prop::collection::vec((any::<usize>(), any::<bool>()), 0..24),
        order in 0u8..6,
        want in 1usize..40,
    ) {
        let (bulk, _) = twin();
        let (single, _) = twin();
        // The same history on both: blocks allocated, some freed dirty or zero, so the
        // lists hold split blocks of either state.
        let mut blocks = alloc_both(&bulk, &single, &allocs)?;
        for &(i, zero) in &frees {
            if blocks.is_empty() {
                break;
            }
            let b = blocks.swap_remove(i % blocks.len());
            prop_assert_eq!(bulk.free(b, hint(zero)), single.free(b, hint(zero)));
        }
        let none = Allocation {
            block: Block::new(Pfn(0), o(order)),
            zone: ZoneId(0),
            zeroing: Zeroing::NotRequested,
            prior: FreeState::DIRTY,
        };
        let mut many = vec![none; want];
        let taken = bulk.alloc_resident_dirty(o(order), &mut many);
        many.truncate(taken);
        let mut one_by_one = Vec::new();
        let mut one = [none];
        while one_by_one.len() < want && single.alloc_resident_dirty(o(order), &mut one) == 1 {
            one_by_one.push(one[0]);
        }
        prop_assert_eq!(many, one_by_one);
        prop_assert_eq!(observe(&bulk), observe(&single));
    }
}
