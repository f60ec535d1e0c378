//! zeronce's own threads (reporting worker, background zeroers), told apart from the
//! caller's.

use std::cell::Cell;

thread_local! {
    /// Set on zeronce's own threads (reporting worker, background zeroers).
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as one of zeronce's own (see [`is_internal_thread`]).
pub(crate) fn mark_internal_thread() {
    INTERNAL.with(|c| c.set(true));
}

/// Whether the calling thread is one of zeronce's own (reporting worker, background
/// zeroer): a global allocator built on process mode sends their allocations to its inner
/// allocator, so they never wait on the locks they may hold.
pub fn is_internal_thread() -> bool {
    INTERNAL.try_with(Cell::get).unwrap_or(false)
}
