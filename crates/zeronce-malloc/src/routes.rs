//! The decisions a C call can make from two loads, before the runtime is looked at: a
//! small allocation goes straight to mimalloc, and so does a pointer that lies outside
//! every zeronce range. Everything else takes the full path in [`crate::runtime`].
//!
//! A program's calls are mostly small (sqlite3's bulk insert: 600 000 allocations, none
//! large), so these two tests are what most calls pay on top of mimalloc's own work.
//!
//! The routes also hold the *free mark*: what `free` writes into the second word of a
//! mimalloc block before giving it to mimalloc, which writes only the first word of a
//! free block (its free-list link). A block whose second word already holds its mark when
//! it is freed was freed before and not handed out since (every allocation clears the
//! word): a double free, told and aborted on as glibc does, instead of a free-list cycle
//! that hands one block out twice. The mark is the block's address mixed with a secret
//! (random once the runtime exists), so a live block's own data matches it only by
//! chance: a self-pointer, common in list heads, does not.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The two fast routes. One instance serves the process ([`ROUTES`]); tests make their own.
pub struct Routes {
    /// Sizes below this go straight to mimalloc: the threshold once the runtime exists
    /// and the exit report does not count small allocations; 0 (none) until then.
    small_below: AtomicUsize,
    /// The smallest span of addresses covering every zeronce range this process (and its
    /// `fork` ancestors) created: `[lo, hi)`, empty (`lo > hi`) before the first. It only
    /// grows, one end at a time, so any pair of values a reader sees covers every range
    /// covered before (see [`Routes::cover`]).
    lo: AtomicUsize,
    hi: AtomicUsize,
    /// The secret of the free mark (see the module docs): never 0.
    mark: AtomicUsize,
}

/// The free mark's secret until the runtime draws a random one: odd, no pattern a
/// program writes.
const FIRST_MARK: usize = 0x9e37_79b9_7f4a_7c15;

/// The process's routes.
pub static ROUTES: Routes = Routes::new();

impl Routes {
    /// No fast route yet: every call takes the full path.
    pub const fn new() -> Self {
        Routes {
            small_below: AtomicUsize::new(0),
            lo: AtomicUsize::new(usize::MAX),
            hi: AtomicUsize::new(0),
            mark: AtomicUsize::new(FIRST_MARK),
        }
    }

    /// The free mark of the block at `addr`: what its second word holds while it is free.
    #[inline(always)]
    pub fn free_mark(&self, addr: usize) -> usize {
        self.mark.load(Relaxed) ^ addr
    }

    /// Mixes `seed` (random bytes) into the free mark's secret. A block freed before keeps
    /// the old mark: a second free of it is then not seen, never wrongly seen.
    pub fn seed_free_mark(&self, seed: u64) {
        let mixed = (FIRST_MARK ^ seed as usize) | 1;
        self.mark.store(mixed, Relaxed);
    }

    /// Whether an allocation of `size` bytes is mimalloc's without further checks.
    #[inline(always)]
    pub fn is_small(&self, size: usize) -> bool {
        size < self.small_below.load(Relaxed)
    }

    /// Sends sizes below `threshold` straight to mimalloc.
    pub fn set_small_below(&self, threshold: usize) {
        self.small_below.store(threshold, Relaxed);
    }

    /// Whether `addr` may be zeronce's: `false` means it is certainly not (it lies outside
    /// every range), `true` that the runtime must look (it may lie between two ranges).
    ///
    /// Relaxed loads suffice: a pointer reaches a thread only after the allocation that
    /// made it, which covered its range first, happened before.
    #[inline(always)]
    pub fn may_be_large(&self, addr: usize) -> bool {
        addr >= self.lo.load(Relaxed) && addr < self.hi.load(Relaxed)
    }

    /// Widens the span to cover `[base, base + len)`, before any block of that range is
    /// handed out. The upper end moves first, then the lower: a reader that sees one end
    /// new and the other old still sees a span covering every range covered before, so a
    /// zeronce block is never sent to mimalloc.
    pub fn cover(&self, base: usize, len: usize) {
        self.hi.fetch_max(base.saturating_add(len), Relaxed);
        self.lo.fetch_min(base, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_routed_fast_before_the_runtime_says_so() {
        let r = Routes::new();
        assert!(!r.is_small(1));
        assert!(!r.may_be_large(0) && !r.may_be_large(usize::MAX - 1));
        r.set_small_below(2 << 20);
        assert!(r.is_small(0) && r.is_small((2 << 20) - 1) && !r.is_small(2 << 20));
    }

    #[test]
    fn a_free_mark_is_the_address_mixed_with_a_secret_that_the_seed_changes() {
        let r = Routes::new();
        let (a, b) = (0x5000_0000_1000usize, 0x5000_0000_1010usize);
        assert_ne!(r.free_mark(a), r.free_mark(b));
        // A self-pointer (a list head's link to itself) or a zero word is no mark.
        assert_ne!(r.free_mark(a), a);
        assert_ne!(r.free_mark(a), 0);
        let before = r.free_mark(a);
        r.seed_free_mark(0x1234_5678_9abc_def0);
        assert_ne!(r.free_mark(a), before);
        assert_ne!(r.free_mark(a), a);
        // A seed that cancels the first secret still leaves one.
        r.seed_free_mark(FIRST_MARK as u64);
        assert_ne!(r.free_mark(a), a);
    }

    #[test]
    fn the_span_covers_every_range_in_any_order_and_nothing_below_or_above() {
        let r = Routes::new();
        let ranges = [(0x7000_0000_0000, 1 << 36), (0x1000_0000_0000, 1 << 30)];
        for &(base, len) in &ranges {
            r.cover(base, len);
        }
        for &(base, len) in &ranges {
            assert!(r.may_be_large(base) && r.may_be_large(base + len - 1));
        }
        // Between the two ranges: "maybe" (the runtime decides); outside: certainly not.
        assert!(r.may_be_large(0x4000_0000_0000));
        assert!(!r.may_be_large(0x1000_0000_0000 - 1));
        assert!(!r.may_be_large(0x7000_0000_0000 + (1 << 36)));
        assert!(!r.may_be_large(0));
    }

    #[test]
    fn concurrent_covers_end_covering_every_range_and_each_reader_sees_a_superset() {
        let r = Routes::new();
        let first = (0x5000_0000_0000usize, 1usize << 30);
        r.cover(first.0, first.1);
        std::thread::scope(|s| {
            for i in 0..4usize {
                let r = &r;
                s.spawn(move || r.cover(0x1000_0000_0000 * (i + 1) + 0x100_0000, 1 << 20));
            }
            // Whatever the other threads have done so far, the first range stays covered.
            for _ in 0..10_000 {
                assert!(r.may_be_large(first.0) && r.may_be_large(first.0 + first.1 - 1));
            }
        });
        for i in 0..4usize {
            assert!(r.may_be_large(0x1000_0000_0000 * (i + 1) + 0x100_0000));
        }
    }
}
