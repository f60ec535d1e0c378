//! zeronce's own threads (reporting worker, background zeroers), told apart from the
//! caller's, and [`PerThread`] values that keep threads off each other's cache lines.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

thread_local! {
    /// Set on zeronce's own threads (reporting worker, background zeroers).
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
    /// This thread's number (see [`thread_number`]), given back when the thread ends.
    static NUMBER: Number = Number::take();
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

/// Thread numbers handed out: at most this many (the most [`PerThread`] slots).
const NUMBERS: usize = 64;

/// Live threads holding each number.
static LIVE: [AtomicUsize; NUMBERS] = [const { AtomicUsize::new(0) }; NUMBERS];

/// A thread's number; the thread's end gives it back.
struct Number(usize);

impl Number {
    /// The lowest number the fewest live threads hold, so live threads spread over the
    /// [`PerThread`] slots however many came and went before them.
    fn take() -> Number {
        let n = (0..NUMBERS)
            .min_by_key(|&i| LIVE[i].load(Relaxed))
            .unwrap_or(0);
        LIVE[n].fetch_add(1, Relaxed);
        Number(n)
    }
}

impl Drop for Number {
    fn drop(&mut self) {
        LIVE[self.0].fetch_sub(1, Relaxed);
    }
}

/// The calling thread's number (below [`NUMBERS`]; 0 while the thread ends).
fn thread_number() -> usize {
    NUMBER.try_with(|n| n.0).unwrap_or(0)
}

/// A value on a cache line of its own.
#[repr(align(128))]
struct Padded<T>(T);

/// One `T` per CPU this process may run on (rounded up to a power of two, at most
/// [`NUMBERS`]), each on its own cache line. A thread always uses the same one and live
/// threads are spread over them, so threads rarely share a line, as with Linux's per-CPU
/// data.
pub(crate) struct PerThread<T> {
    slots: Box<[Padded<T>]>,
}

impl<T> PerThread<T> {
    /// One value per CPU, each made by `make`.
    pub(crate) fn new(mut make: impl FnMut() -> T) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get().min(NUMBERS));
        PerThread {
            slots: (0..cpus.next_power_of_two())
                .map(|_| Padded(make()))
                .collect(),
        }
    }

    /// The calling thread's value.
    #[inline]
    pub(crate) fn mine(&self) -> &T {
        // The length is a power of two: a mask instead of a division.
        &self.slots[thread_number() & (self.slots.len() - 1)].0
    }

    /// Every value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }
}
