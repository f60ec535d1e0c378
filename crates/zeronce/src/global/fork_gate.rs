//! The gate a `fork` closes: every large allocation, free and grow of a
//! [`ProcessBackend`](super::ProcessBackend) passes it (a read lock), and
//! `pthread_atfork`'s prepare handler closes it (every write lock) so that the child
//! inherits no half-done call.
//!
//! One read-write lock would make every large call of every thread write one shared
//! cache line (the lock's reader count), twice. The gate is split into lanes on cache
//! lines of their own instead — Linux's per-CPU read-write semaphore, by thread rather
//! than by CPU: a call takes the lane of its thread's stack (threads' stacks are separate
//! mappings, megabytes apart), so threads that free large blocks at once mostly write
//! different lines; closing takes every lane, in order.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lanes of the gate (a power of two).
const LANES: usize = 16;

/// One lane, on a cache line of its own.
#[repr(align(64))]
struct Lane(RwLock<()>);

/// The fork gate: [`ForkGate::enter`] for a call, [`ForkGate::close`] across a `fork`.
pub(super) struct ForkGate {
    lanes: [Lane; LANES],
}

/// The lanes a closed gate holds, until dropped.
pub(super) type Closed = Vec<RwLockWriteGuard<'static, ()>>;

impl ForkGate {
    /// An open gate.
    pub(super) const fn new() -> Self {
        ForkGate {
            lanes: [const { Lane(RwLock::new(())) }; LANES],
        }
    }

    /// Passes the gate: held (the calling thread's lane, for reading) until the guard is
    /// dropped; waits while the gate is closed.
    pub(super) fn enter(&self) -> RwLockReadGuard<'_, ()> {
        let lane = &self.lanes[lane_of_this_thread()];
        lane.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the gate: waits for every call in flight, holds new ones off until the
    /// returned guards are dropped.
    pub(super) fn close(&'static self) -> Closed {
        self.lanes
            .iter()
            .map(|l| l.0.write().unwrap_or_else(PoisonError::into_inner))
            .collect()
    }
}

/// The lane of the calling thread: a hash of where its stack is (in 2 MiB units, so a
/// thread's calls mostly land in one lane; which lane a call takes never matters for
/// correctness, only for sharing).
fn lane_of_this_thread() -> usize {
    let here = 0u8;
    let unit = (std::ptr::addr_of!(here).addr() >> 21) as u64;
    (unit.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - LANES.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;

    #[test]
    fn closing_waits_for_calls_in_flight_and_holds_new_ones_off_until_reopened() {
        static GATE: ForkGate = ForkGate::new();
        let in_flight = AtomicUsize::new(0);
        let closed = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let _g = GATE.enter();
                        // Never inside while the gate is closed.
                        assert!(!closed.load(SeqCst));
                        in_flight.fetch_add(1, SeqCst);
                        std::thread::sleep(Duration::from_micros(50));
                        in_flight.fetch_sub(1, SeqCst);
                    }
                });
            }
            for _ in 0..20 {
                let held = GATE.close();
                assert_eq!(held.len(), LANES);
                closed.store(true, SeqCst);
                assert_eq!(
                    in_flight.load(SeqCst),
                    0,
                    "a call was in flight while closed"
                );
                std::thread::sleep(Duration::from_micros(200));
                closed.store(false, SeqCst);
                drop(held);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
    }

    #[test]
    fn threads_alive_together_spread_over_the_lanes() {
        // All alive at once (a thread that has exited leaves its stack to the next one).
        let together = std::sync::Barrier::new(16);
        let lanes: std::collections::BTreeSet<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        together.wait();
                        lane_of_this_thread()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(lanes.iter().all(|&l| l < LANES));
        // 16 threads' stacks, megabytes apart: more than one lane among them.
        assert!(lanes.len() > 1, "all threads in lane {lanes:?}");
    }
}
