//! zeronce's own threads (reporting worker, background zeroers), told apart from the
//! caller's, and [`PerThread`] values that keep threads off each other's cache lines.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

thread_local! {
    /// Set on zeronce's own threads (reporting worker, background zeroers).
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
    /// This thread's number (see [`thread_number`]), given back when the thread ends.
    static NUMBER: Number = Number::take();
    /// This thread's slot once known (see [`slot_index`]): a plain thread-local read on
    /// the fast path, where [`NUMBER`] (which has a destructor) costs a registration check.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
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
pub(crate) const NUMBERS: usize = 64;

/// Live threads holding each number (zeronce's own threads not counted).
static LIVE: [AtomicUsize; NUMBERS] = [const { AtomicUsize::new(0) }; NUMBERS];

/// A thread's number; the thread's end gives it back.
struct Number {
    /// The number.
    n: usize,
    /// Counted in [`LIVE`]: a caller's thread. zeronce's own threads (the reporting worker
    /// gives kept blocks back and counts them on a slot too) take a number without
    /// counting, so they neither push callers' threads together nor make a caller's
    /// thread share its slot (see [`alone_on_my_slot`]).
    counted: bool,
}

impl Number {
    /// The lowest number the fewest live threads hold, so live threads spread over the
    /// [`PerThread`] slots however many came and went before them.
    fn take() -> Number {
        let n = (0..NUMBERS)
            .min_by_key(|&i| LIVE[i].load(Relaxed))
            .unwrap_or(0);
        let counted = !is_internal_thread();
        if counted {
            LIVE[n].fetch_add(1, Relaxed);
        }
        Number { n, counted }
    }
}

impl Drop for Number {
    fn drop(&mut self) {
        if self.counted {
            LIVE[self.n].fetch_sub(1, Relaxed);
        }
    }
}

/// The calling thread's number (below [`NUMBERS`]; 0 while the thread ends).
fn thread_number() -> usize {
    NUMBER.try_with(|n| n.n).unwrap_or(0)
}

/// Slots of per-thread data: one per CPU this process may run on, rounded up to a power
/// of two, at most [`NUMBERS`]. Fixed at first use, so every [`PerThread`] agrees on which
/// slot a thread uses (see [`slot_index`]).
fn slot_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get().min(NUMBERS))
            .next_power_of_two()
    })
}

/// The calling thread's slot, below [`slot_count`]: the same in every [`PerThread`], so one
/// lock held on a slot of one serializes the calling threads' use of that slot of others.
#[inline]
pub(crate) fn slot_index() -> usize {
    let cached = SLOT.try_with(Cell::get).unwrap_or(usize::MAX);
    if cached != usize::MAX {
        return cached;
    }
    // The count is a power of two: a mask instead of a division.
    let slot = thread_number() & (slot_count() - 1);
    // Not while the thread ends (its number may be given back already).
    if NUMBER.try_with(|_| ()).is_ok() {
        let _ = SLOT.try_with(|c| c.set(slot));
    }
    slot
}

/// Whether the calling thread is the only live thread on its slot (asked when a slot
/// would favour it: see [`zeronce_mem::BiasedLock::try_lock_favouring_if`]). Counts the
/// live holders of every number that maps to the slot (zeronce's own threads are not
/// counted: they visit slots, they do not use them).
pub(crate) fn alone_on_my_slot() -> bool {
    let (count, slot) = (slot_count(), slot_index());
    let live: usize = LIVE[slot..]
        .iter()
        .step_by(count)
        .map(|n| n.load(Relaxed))
        .sum();
    live == 1
}

/// A value on a cache line of its own.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// One `T` per slot (per CPU this process may run on), each on its own cache line. A thread
/// always uses the same one and live threads are spread over them, so threads rarely share
/// a line, as with Linux's per-CPU data.
pub(crate) struct PerThread<T> {
    slots: Box<[Padded<T>]>,
}

impl<T> PerThread<T> {
    /// One value per slot, each made by `make`.
    pub(crate) fn new(mut make: impl FnMut() -> T) -> Self {
        PerThread {
            slots: (0..slot_count()).map(|_| Padded(make())).collect(),
        }
    }

    /// The calling thread's value.
    #[inline]
    pub(crate) fn mine(&self) -> &T {
        &self.slots[slot_index()].0
    }

    /// The value of slot `i` (below the slot count).
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.slots.get(i).map(|p| &p.0)
    }

    /// The number of slots.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Every value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeronce_own_threads_take_a_number_without_counting_as_live() {
        let own = std::thread::spawn(|| {
            mark_internal_thread();
            let n = Number::take();
            (n.counted, n.n)
        })
        .join()
        .expect("an internal thread");
        assert!(
            !own.0,
            "an internal thread is not a live user of slot {}",
            own.1
        );
        let caller = std::thread::spawn(|| Number::take().counted)
            .join()
            .expect("a caller's thread");
        assert!(caller, "a caller's thread counts");
    }
}
