//! Property tests against a deliberately simple reference model: one entry per page
//! (allocated / free with a state / isolated / in the per-thread cache), plus fake memory
//! that knows which pages hold non-zero bytes. 40,000 random sequences of up to 71
//! operations, good and bad (alloc and free through the manager or a `PcpCache`, double
//! and malformed frees, isolate / put back with honest and lying verdicts, settle passes,
//! host zero hints, cache drains) on 1–3 unaligned zones, max order 0–5, verify mode on.
//!
//! Checked after every step: the manager's invariants; every page's manager view equals the
//! model (free state per page, exactly, through split and merge, with the ∧ merge rule
//! recomputed by the model); the zone and state chosen by each allocation follow the
//! search policy; a zero-request's block reads zero (skipped only when known zero), the
//! hint page is zeroed last; every free block the manager calls known zero reads zero;
//! caches hold only dirty blocks; counters agree; failed operations changed nothing.
//!
//! Files: this one holds the model's data (`Page`, `World`) and the property; `world.rs`
//! builds the world, keeps the model and checks it against the manager; `step.rs` applies
//! one operation to both; `ops.rs` draws the operations and configurations.

#[path = "../common/mod.rs"]
mod common;
mod ops;
mod step;
mod world;

use common::FakeZeroer;
use ops::{op, setup};
use proptest::prelude::*;
use std::sync::Arc;
use zeronce_mm::*;

/// The model's view of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Page {
    /// Part of a live allocation.
    Allocated,
    /// Free with this state.
    Free(FreeState),
    /// Isolated for reporting; the state it had.
    Isolated(FreeState),
    /// Free in the test's per-thread cache.
    Cached(FreeState),
    /// Not managed (gap between zones).
    Hole,
}

/// The harness: manager, fake memory, model, and what the test holds.
struct World {
    mm: Arc<MemoryManager>,
    /// A per-thread cache over `mm` (small limits so it refills and drains often).
    cache: PcpCache<Arc<MemoryManager>>,
    mem: FakeZeroer,
    pages: Vec<Page>,
    zones: Vec<PageRange>,
    live: Vec<Block>,
    freed: Vec<Block>,
    isolated: Vec<Block>,
}

fn fail(what: &str) -> TestCaseError {
    TestCaseError::fail(what.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40_000))]

    /// The manager agrees with the reference model after every step of a random sequence.
    #[test]
    fn manager_matches_model(s in setup(), ops in prop::collection::vec(op(), 1..72)) {
        let mut w = World::new(&s);
        w.check()?;
        for op in &ops {
            w.step(op)?;
            w.reconcile()?;
            w.check()?;
        }
        w.cache.drain();
        w.reconcile()?;
        w.check()?;
        prop_assert_eq!(w.mm.stats().cached_pages, 0);
        // Everything given back: all pages free again, nothing lost.
        for b in std::mem::take(&mut w.isolated) {
            w.mm.put_back(b, PutBack::Failed).map_err(|e| fail(&e.to_string()))?;
        }
        for b in std::mem::take(&mut w.live) {
            w.mm.free(b, FreeHint::Dirty).map_err(|e| fail(&e.to_string()))?;
        }
        w.mm.check_invariants().map_err(|e| fail(&e.to_string()))?;
        prop_assert_eq!(w.mm.stats().free_pages_total(), w.mm.total_pages());
    }
}
