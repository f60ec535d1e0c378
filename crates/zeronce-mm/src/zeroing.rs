//! The zeroing effect, injected: the manager decides *whether* and *what* to zero, a
//! [`Zeroer`] (in `zeronce-mem`, or a fake in tests) does it.

use crate::types::{PageRange, Pfn};

/// Zeroes and inspects page contents on behalf of the manager.
pub trait Zeroer: Send + Sync {
    /// Makes these pages read zero; `hint_last`, if inside, must be zeroed last
    /// (cache-hot). Returns the bytes it wrote: fewer than the range when it knew some
    /// pages already read zero (a zeroer that tracks more than the manager does), 0 when
    /// it wrote none.
    fn zero(&self, range: PageRange, hint_last: Option<Pfn>) -> u64;
    /// Verify mode: whether these pages really read zero.
    fn is_zero(&self, range: PageRange) -> bool;
}

/// A zeroer that does nothing and claims everything is zero: for benchmarks of the
/// allocator itself (with non-zero requests it is never called) and for managers of memory
/// nobody reads. Never use it with `verify` on to test anything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopZeroer;

impl Zeroer for NoopZeroer {
    fn zero(&self, range: PageRange, _hint_last: Option<Pfn>) -> u64 {
        // Claims to have zeroed it (see above): counted as zeroing done.
        range.bytes()
    }
    fn is_zero(&self, _range: PageRange) -> bool {
        true
    }
}

/// Splits `range` around `hint` into the order a zeroer should write it so that the hinted
/// page is written last: `[before, after, hint page]`, empty parts omitted. Zeroers call it
/// to honour `hint_last` (Linux `folio_zero_user` / `clear_huge_page` zero the target
/// subpage last for the same reason).
pub fn hint_last_order(range: PageRange, hint: Option<Pfn>) -> Vec<PageRange> {
    let Some(h) = hint.filter(|h| range.contains(*h)) else {
        return vec![range];
    };
    let before = PageRange::new(range.start, h.0 - range.start.0);
    let after = PageRange::new(Pfn(h.0 + 1), range.end().0 - h.0 - 1);
    [before, after, PageRange::new(h, 1)]
        .into_iter()
        .filter(|r| r.pages > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_page_comes_last_and_everything_is_covered() {
        let r = PageRange::new(Pfn(8), 8);
        let parts = hint_last_order(r, Some(Pfn(10)));
        assert_eq!(
            parts,
            vec![
                PageRange::new(Pfn(8), 2),
                PageRange::new(Pfn(11), 5),
                PageRange::new(Pfn(10), 1)
            ]
        );
        assert_eq!(
            hint_last_order(r, Some(Pfn(8))).last(),
            Some(&PageRange::new(Pfn(8), 1))
        );
        assert_eq!(hint_last_order(r, Some(Pfn(15))).len(), 2);
        assert_eq!(hint_last_order(r, Some(Pfn(16))), vec![r]);
        assert_eq!(hint_last_order(r, None), vec![r]);
    }
}
