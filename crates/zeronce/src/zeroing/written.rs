//! [`WrittenPages`]: one bit per page of process memory, set while the page may have been
//! written since it was last zeroed, clear while it reads zero.
//!
//! The chunk states of [`super::zeromap::ZeroMap`] remember "known zero" per chunk (the
//! reporting order), and a chunk holding blocks smaller than itself is `Used`: there the
//! manager's per-block state was all there was, and a merge with a dirty buddy forgot that
//! the other half read zero. These bits remember it per page, so a zero-request zeroes only
//! the pages written since their last zeroing, whatever the block size.
//!
//! A bit is set when a block covering its page is handed out (its holder may write it;
//! the global allocator's holders only the prefix their size covers, and the rest once a
//! grow says so), and cleared when the page is zeroed (background zeroer, allocation
//! path) or freed by a holder vouching it reads zero. A freed chunk none of whose bits is
//! set reads zero, so it is not zeroed again: a dirty block's untouched tail is not
//! faulted in by the zeroer. Only a block's holder, or a zeroer that holds the block,
//! writes its bits; neighbouring blocks sharing a word update it with atomic OR / AND.

use std::sync::atomic::{AtomicU64, Ordering::*};

use zeronce_mm::{PageRange, Pfn};

/// The bits (see the module docs).
pub(crate) struct WrittenPages(Box<[AtomicU64]>);

/// Words and masks of the bits of `range`.
fn words(range: PageRange) -> impl Iterator<Item = (usize, u64)> {
    let (start, end) = (range.start.0, range.end().0);
    let mut at = start;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let word = at / 64;
        let hi = end.min((word + 1) * 64);
        let (lo_bit, n) = (at % 64, hi - at);
        let mask = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << lo_bit
        };
        at = hi;
        Some((word as usize, mask))
    })
}

impl WrittenPages {
    /// `pages` pages, all reading zero, or all written (`written`). A zeroed allocation:
    /// the bits of a large range cost nothing until used.
    pub(crate) fn new(pages: u64, written: bool) -> Self {
        let bits = WrittenPages(bytemuck::zeroed_slice_box(pages.div_ceil(64) as usize));
        if written {
            bits.mark(PageRange::new(Pfn(0), pages), true);
        }
        bits
    }

    /// Marks the pages of `range` written (`true`) or reading zero.
    #[inline]
    pub(crate) fn mark(&self, range: PageRange, written: bool) {
        let (start, end) = (range.start.0, range.end().0);
        if start.is_multiple_of(64) && end.is_multiple_of(64) {
            // Whole words (every block of 64 pages or more): one comparison a word, and
            // no write where they already say so (a block handed out again).
            let want = if written { u64::MAX } else { 0 };
            // Words past the table are skipped, as below.
            let hi = ((end / 64) as usize).min(self.0.len());
            let lo = ((start / 64) as usize).min(hi);
            for w in &self.0[lo..hi] {
                if w.load(Acquire) != want {
                    if written {
                        w.fetch_or(u64::MAX, AcqRel);
                    } else {
                        w.fetch_and(0, AcqRel);
                    }
                }
            }
            return;
        }
        for (word, mask) in words(range) {
            let Some(w) = self.0.get(word) else { return };
            // Only the holder of these pages changes their bits (see the module docs): when
            // they already say so, a load instead of a locked read-modify-write (a dirty
            // block handed out again is the common case).
            let cur = w.load(Acquire);
            if written {
                if cur & mask != mask {
                    w.fetch_or(mask, AcqRel);
                }
            } else if cur & mask != 0 {
                w.fetch_and(!mask, AcqRel);
            }
        }
    }

    fn is_written(&self, pfn: u64) -> bool {
        // Out of the table: not vouched for.
        self.0
            .get((pfn / 64) as usize)
            .is_none_or(|w| w.load(Acquire) & (1 << (pfn % 64)) != 0)
    }

    /// Whether any page of `range` may have been written since it was last zeroed.
    pub(crate) fn any_written(&self, range: PageRange) -> bool {
        let (start, end) = (range.start.0, range.end().0);
        if start.is_multiple_of(64) && end.is_multiple_of(64) {
            // Whole words (every block of 64 pages or more): one load and test a word.
            let (lo, hi) = ((start / 64) as usize, (end / 64) as usize);
            return match self.0.get(lo..hi) {
                Some(words) => words.iter().any(|w| w.load(Acquire) != 0),
                // Out of the table: not vouched for.
                None => start < end,
            };
        }
        words(range).any(|(word, mask)| {
            // Out of the table: not vouched for.
            self.0.get(word).is_none_or(|w| w.load(Acquire) & mask != 0)
        })
    }

    /// Calls `f` on each maximal run of written pages of `range`, in address order.
    pub(crate) fn for_each_written_run(&self, range: PageRange, mut f: impl FnMut(PageRange)) {
        let mut run: Option<u64> = None;
        for pfn in range.start.0..range.end().0 {
            match (self.is_written(pfn), run) {
                (true, None) => run = Some(pfn),
                (false, Some(s)) => {
                    f(PageRange::new(Pfn(s), pfn - s));
                    run = None;
                }
                _ => {}
            }
        }
        if let Some(s) = run {
            f(PageRange::new(Pfn(s), range.end().0 - s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(w: &WrittenPages, range: PageRange) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        w.for_each_written_run(range, |r| v.push((r.start.0, r.pages)));
        v
    }

    #[test]
    fn any_written_sees_one_page_in_a_range_across_words() {
        let w = WrittenPages::new(300, false);
        let all = PageRange::new(Pfn(0), 300);
        assert!(!w.any_written(all));
        w.mark(PageRange::new(Pfn(130), 1), true);
        assert!(w.any_written(all));
        assert!(w.any_written(PageRange::new(Pfn(100), 40)));
        assert!(!w.any_written(PageRange::new(Pfn(0), 130)));
        assert!(!w.any_written(PageRange::new(Pfn(131), 169)));
        assert!(
            w.any_written(PageRange::new(Pfn(330), 10)),
            "past the table"
        );
        // Whole words, the quick way.
        assert!(w.any_written(PageRange::new(Pfn(128), 64)));
        assert!(!w.any_written(PageRange::new(Pfn(0), 128)));
        assert!(!w.any_written(PageRange::new(Pfn(192), 128)));
        assert!(!w.any_written(PageRange::new(Pfn(192), 0)));
        assert!(
            w.any_written(PageRange::new(Pfn(256), 128)),
            "past the table"
        );
    }

    #[test]
    fn runs_follow_marks_across_words() {
        let w = WrittenPages::new(300, false);
        assert!(runs(&w, PageRange::new(Pfn(0), 300)).is_empty());
        w.mark(PageRange::new(Pfn(60), 10), true);
        w.mark(PageRange::new(Pfn(128), 64), true);
        w.mark(PageRange::new(Pfn(140), 2), false);
        assert_eq!(
            runs(&w, PageRange::new(Pfn(0), 300)),
            vec![(60, 10), (128, 12), (142, 50)]
        );
        assert_eq!(
            runs(&w, PageRange::new(Pfn(65), 70)),
            vec![(65, 5), (128, 7)]
        );
        let all = WrittenPages::new(100, true);
        assert_eq!(runs(&all, PageRange::new(Pfn(0), 100)), vec![(0, 100)]);
    }
}
