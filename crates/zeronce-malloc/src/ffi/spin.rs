//! A spin lock for the library's short critical sections (the listed huge blocks, the
//! transfer cache). No system call on the way in unless the holder stays long (then the
//! waiter yields its CPU: on a machine of two CPUs the holder may be waiting for it), none
//! on the way out, no allocation: it can be taken inside `malloc` and across a `fork`.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, Ordering::*};

/// Spins before the waiter starts yielding its CPU.
const SPINS: u32 = 64;

/// A test-and-test-and-set lock (see the module docs).
pub(crate) struct SpinLock(AtomicBool);

impl SpinLock {
    /// An open lock.
    pub(crate) const fn new() -> Self {
        SpinLock(AtomicBool::new(false))
    }

    /// Takes the lock, waiting as long as it takes.
    pub(crate) fn lock(&self) {
        let mut spins = 0;
        while self
            .0
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            // Wait reading, not writing: the holder's line stays where it is.
            while self.0.load(Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Releases the lock (taken by this thread, or by the parent across a `fork`).
    pub(crate) fn unlock(&self) {
        self.0.store(false, Release);
    }
}
