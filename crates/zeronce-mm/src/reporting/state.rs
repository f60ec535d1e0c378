//! The reporting request state machine: IDLE → REQUESTED → ACTIVE (Linux `prdev->state`).
//!
//! The allocator's free path only ever reads this word, and writes it at most once per
//! quiet period: a free of reportable order while the engine is IDLE turns it REQUESTED and
//! wakes the worker; every later free sees REQUESTED (or ACTIVE) and returns at once.

use std::sync::atomic::{AtomicU8, Ordering};

/// Where the engine is in its request cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nothing to do; the next reportable free must wake the worker.
    Idle,
    /// A pass is wanted (after the delay); frees need not wake anyone.
    Requested,
    /// A pass is running; a free turns this back into `Requested` so the pass reschedules.
    Active,
}

const IDLE: u8 = 0;
const REQUESTED: u8 = 1;
const ACTIVE: u8 = 2;

/// The atomic state word shared by the free path and the worker.
#[derive(Debug, Default)]
pub(crate) struct RequestState(AtomicU8);

impl RequestState {
    /// A new state word, IDLE.
    pub(crate) fn new() -> Self {
        RequestState(AtomicU8::new(IDLE))
    }

    /// Current phase.
    pub(crate) fn phase(&self) -> Phase {
        match self.0.load(Ordering::Acquire) {
            IDLE => Phase::Idle,
            REQUESTED => Phase::Requested,
            _ => Phase::Active,
        }
    }

    /// Requests a pass (Linux `__page_reporting_request`). Returns `true` only for the
    /// caller that moved the state out of IDLE: that caller must wake the worker.
    pub(crate) fn request(&self) -> bool {
        // Cheap read first: under churn the state is almost always already REQUESTED.
        if self.0.load(Ordering::Acquire) == REQUESTED {
            return false;
        }
        // ACTIVE → REQUESTED makes the running pass reschedule; IDLE → REQUESTED needs a wake.
        self.0.swap(REQUESTED, Ordering::AcqRel) == IDLE
    }

    /// A pass starts: ACTIVE, so that frees during the pass are noticed.
    pub(crate) fn begin_pass(&self) {
        self.0.store(ACTIVE, Ordering::Release);
    }

    /// A pass ends. Returns `true` when someone requested more work during it (a free of
    /// reportable order, or a spent budget); the worker must schedule another pass after
    /// the delay. Otherwise the state is IDLE again.
    pub(crate) fn end_pass(&self) -> bool {
        // Only ACTIVE → IDLE; a REQUESTED written during the pass survives the exchange.
        self.0
            .compare_exchange(ACTIVE, IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    }

    /// Marks more work pending without waking anyone (a pass stopped on its budget).
    pub(crate) fn set_requested(&self) {
        self.0.store(REQUESTED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_request_after_idle_wakes() {
        let s = RequestState::new();
        assert_eq!(s.phase(), Phase::Idle);
        assert!(s.request());
        assert!(!s.request());
        assert_eq!(s.phase(), Phase::Requested);
        s.begin_pass();
        assert_eq!(s.phase(), Phase::Active);
        assert!(!s.end_pass());
        assert_eq!(s.phase(), Phase::Idle);
    }

    #[test]
    fn a_request_during_a_pass_reschedules_without_a_wake() {
        let s = RequestState::new();
        assert!(s.request());
        s.begin_pass();
        assert!(!s.request(), "the worker is running: no wake needed");
        assert!(s.end_pass(), "the pass must reschedule");
        assert_eq!(s.phase(), Phase::Requested);
        s.begin_pass();
        s.set_requested();
        assert!(s.end_pass());
    }
}
