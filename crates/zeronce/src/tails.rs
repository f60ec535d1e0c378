//! The tails of [`crate::ZeronceAlloc`]'s live blocks: the pages of a block past the size
//! it was allocated for (a 33 MiB request gets a 64 MiB block), and when their backing is
//! given back.
//!
//! A tail that was never backed costs nothing and stays so. A resident one (the block was
//! used before, or zeroed in the background) is given back only once its allocation has
//! lived for the hold, not at once: a buffer freed soon after (a loop allocating buffers
//! of changing sizes) would otherwise have its tail discarded at every allocation and
//! refaulted at the next larger one, the kernel zeroing each page of it again (on this
//! project's machines several times slower than the background zeroer's streaming
//! stores). Only whole huge pages are given back: a discard inside one splits it into
//! 4 KiB pages for good (the kernel keeps the page table), so every later touch of those
//! 2 MiB faults 512 times instead of once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use zeronce_mm::{Order, PAGE_SIZE};

/// Pages of a transparent huge page (2 MiB, the range's alignment).
pub(crate) const THP_PAGES: u64 = (2 << 20) / PAGE_SIZE;

/// The first page of a block of `order` whose backing is given back when only
/// `used_pages` are used: `used_pages` rounded up to a huge-page boundary (the first touch
/// of the used part faults its whole huge page in anyway).
pub(crate) fn tail_discard_from(used_pages: u64, order: Order) -> u64 {
    used_pages.next_multiple_of(THP_PAGES).min(order.pages())
}

/// A point in time, in nanoseconds since [`TailSweep`]'s epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Due(u64);

/// When the resident tails of live blocks are due to be given back, and who does it: the
/// first large allocation or free after the earliest one is due sweeps them all (one
/// thread at a time).
pub(crate) struct TailSweep {
    epoch: Instant,
    hold: Duration,
    /// The earliest [`Due`] of a pending tail (`u64::MAX`: none pending).
    earliest: AtomicU64,
    sweeping: AtomicBool,
}

impl TailSweep {
    /// Tails are given back once their allocation has lived for `hold`.
    pub(crate) fn new(hold: Duration) -> TailSweep {
        TailSweep {
            epoch: Instant::now(),
            hold,
            earliest: AtomicU64::new(u64::MAX),
            sweeping: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// When a tail pending from now on is due.
    pub(crate) fn due_from_now(&self) -> Due {
        let hold = u64::try_from(self.hold.as_nanos()).unwrap_or(u64::MAX);
        Due(self.now().saturating_add(hold).min(u64::MAX - 1))
    }

    /// A tail due at `due` is pending (call it once the tail can be found by a sweep).
    pub(crate) fn pending(&self, due: Due) {
        self.earliest.fetch_min(due.0, AcqRel);
    }

    /// A sweep, if a tail is due and no other thread sweeps: the caller gives back every
    /// tail due by [`Sweep::now`] and calls [`TailSweep::pending`] again for the others.
    pub(crate) fn begin(&self) -> Option<Sweep<'_>> {
        let earliest = self.earliest.load(Acquire);
        if earliest == u64::MAX || self.now() < earliest {
            return None;
        }
        if self.sweeping.swap(true, Acquire) {
            return None;
        }
        // From here on, tails made pending are either seen by this sweep or recorded anew.
        self.earliest.store(u64::MAX, Release);
        Some(Sweep {
            owner: self,
            now: Due(self.now()),
        })
    }
}

/// One thread's sweep of the tails (see [`TailSweep::begin`]); ends on drop.
pub(crate) struct Sweep<'a> {
    owner: &'a TailSweep,
    now: Due,
}

impl Sweep<'_> {
    /// Whether a tail pending until `due` is to be given back now (if not, it is recorded
    /// as pending again).
    pub(crate) fn is_due(&self, due: Due) -> bool {
        if due <= self.now {
            return true;
        }
        self.owner.pending(due);
        false
    }
}

impl Drop for Sweep<'_> {
    fn drop(&mut self) {
        self.owner.sweeping.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_is_given_back_from_the_next_huge_page_boundary() {
        let o14 = Order::new(14).unwrap(); // 64 MiB
        assert_eq!(tail_discard_from(33 * 256, o14), 34 * 256);
        assert_eq!(tail_discard_from(34 * 256, o14), 34 * 256);
        assert_eq!(tail_discard_from(34 * 256 + 1, o14), 36 * 256);
        let o10 = Order::new(10).unwrap(); // 4 MiB
        assert_eq!(tail_discard_from(3 * 256, o10), o10.pages());
        // A block smaller than a huge page: nothing past the size is inside another one.
        let o8 = Order::new(8).unwrap();
        assert_eq!(tail_discard_from(100, o8), o8.pages());
    }

    #[test]
    fn a_sweep_begins_only_once_a_tail_is_due_and_keeps_the_later_ones() {
        let t = TailSweep::new(Duration::from_secs(3600));
        assert!(t.begin().is_none(), "nothing pending");
        let later = t.due_from_now();
        t.pending(later);
        assert!(t.begin().is_none(), "not due for an hour");
        t.pending(Due(0));
        let sweep = t.begin().expect("a tail is due");
        assert!(t.begin().is_none(), "one sweep at a time");
        assert!(sweep.is_due(Due(0)));
        assert!(!sweep.is_due(later));
        drop(sweep);
        // The later tail is pending again, and not due yet.
        assert_eq!(t.earliest.load(Relaxed), later.0);
        assert!(t.begin().is_none());
    }
}
