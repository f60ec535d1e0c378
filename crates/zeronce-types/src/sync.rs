//! Poison-tolerant locking: the one way zeronce takes its mutexes and waits on its
//! condition variables.
//!
//! A panic while a lock is held poisons it. zeronce's locks guard state that every
//! critical section leaves consistent before anything that can panic (the pure state
//! machines check their inputs and return typed errors), so a poisoned lock still guards
//! sound state. Recovering it keeps one panicking thread (a caller's closure, a device
//! under test) from turning every later free, report pass or zeroer wake-up into a panic.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Locks `m`, recovering the guard if a panicking thread poisoned it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`Condvar::wait`], recovering the guard if the lock was poisoned meanwhile.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// [`Condvar::wait_timeout`] (woken or timed out: the caller re-checks its condition),
/// recovering the guard if the lock was poisoned meanwhile.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, timeout)
        .unwrap_or_else(|e| e.into_inner())
        .0
}
