//! Basic vocabulary: page frame numbers, orders, ranges, blocks and free-block states.

use std::fmt;
use thiserror::Error;

/// Size of one page frame in bytes: [`zeronce_types::PAGE_SIZE`] (4 KiB, whatever the host
/// page size) as a `u64`, the type frame arithmetic is done in here.
pub const PAGE_SIZE: u64 = zeronce_types::PAGE_SIZE as u64;

/// Largest order any zone may be configured with (2^18 pages = 1 GiB blocks).
pub const MAX_ORDER_LIMIT: u8 = 18;

/// Number of distinct orders (`0..=MAX_ORDER_LIMIT`); sizes per-order arrays.
pub const NR_ORDERS: usize = MAX_ORDER_LIMIT as usize + 1;

/// Default largest order of a zone (Linux `MAX_PAGE_ORDER` = 10: 4 MiB blocks).
pub const DEFAULT_MAX_ORDER: Order = Order(10);

/// Default reporting order (Linux `pageblock_order` = 9: 2 MiB blocks).
pub const DEFAULT_REPORTING_ORDER: Order = Order(9);

/// A page frame number: index of a 4 KiB page, PFN 0 = first page of the managed range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pfn(pub u64);

impl Pfn {
    /// Byte offset of this page from the start of the managed range.
    #[inline]
    pub fn byte_offset(self) -> u64 {
        self.0 * PAGE_SIZE
    }

    /// Whether this PFN is aligned to a block of `order`.
    #[inline]
    pub fn is_aligned(self, order: Order) -> bool {
        self.0 & (order.pages() - 1) == 0
    }
}

impl fmt::Display for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pfn {:#x}", self.0)
    }
}

/// A buddy order: a block of order `o` is `2^o` pages. Always `<= MAX_ORDER_LIMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Order(u8);

impl Order {
    /// Order 0: a single page.
    pub const ZERO: Order = Order(0);

    /// Validates `order` against [`MAX_ORDER_LIMIT`].
    #[inline]
    pub const fn new(order: u8) -> Result<Order, OrderError> {
        if order > MAX_ORDER_LIMIT {
            Err(OrderError { order })
        } else {
            Ok(Order(order))
        }
    }

    /// The raw order.
    #[inline]
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The order as an array index.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// Pages in a block of this order.
    #[inline]
    pub const fn pages(self) -> u64 {
        1 << self.0
    }

    /// Bytes in a block of this order.
    #[inline]
    pub const fn bytes(self) -> u64 {
        self.pages() * PAGE_SIZE
    }

    /// The next smaller order (`None` at order 0).
    #[inline]
    pub(crate) fn lower(self) -> Option<Order> {
        self.0.checked_sub(1).map(Order)
    }

    /// The next larger order (`None` at [`MAX_ORDER_LIMIT`]).
    #[inline]
    pub(crate) fn higher(self) -> Option<Order> {
        Order::new(self.0 + 1).ok()
    }

    /// Every order from `self` up to and including `max`, ascending.
    #[inline]
    pub(crate) fn up_to(self, max: Order) -> impl Iterator<Item = Order> {
        (self.0..=max.0).map(Order)
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "order {}", self.0)
    }
}

/// An order above [`crate::MAX_ORDER_LIMIT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("order {order} is above the limit {}", crate::MAX_ORDER_LIMIT)]
pub struct OrderError {
    /// The rejected order.
    pub order: u8,
}

/// A contiguous run of pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageRange {
    /// First page.
    pub start: Pfn,
    /// Number of pages.
    pub pages: u64,
}

impl PageRange {
    /// The range `[start, start + pages)`.
    #[inline]
    pub fn new(start: Pfn, pages: u64) -> PageRange {
        PageRange { start, pages }
    }

    /// One past the last page (saturating, so a malformed range cannot wrap).
    #[inline]
    pub fn end(&self) -> Pfn {
        Pfn(self.start.0.saturating_add(self.pages))
    }

    /// Whether `pfn` lies in the range.
    #[inline]
    pub fn contains(&self, pfn: Pfn) -> bool {
        pfn >= self.start && pfn < self.end()
    }

    /// Whether `other` lies entirely inside this range.
    #[inline]
    pub fn contains_range(&self, other: &PageRange) -> bool {
        other.start >= self.start && other.end() <= self.end()
    }

    /// Whether the two ranges share at least one page.
    #[inline]
    pub fn overlaps(&self, other: &PageRange) -> bool {
        self.start < other.end() && other.start < self.end()
    }

    /// Size in bytes.
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.pages * PAGE_SIZE
    }
}

/// A naturally aligned buddy block: `2^order` pages starting at `pfn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// First page; a multiple of `order.pages()` in a block the manager hands out.
    pub pfn: Pfn,
    /// Size class.
    pub order: Order,
}

impl Block {
    /// The block of `order` starting at `pfn` (alignment is checked where it matters).
    #[inline]
    pub fn new(pfn: Pfn, order: Order) -> Block {
        Block { pfn, order }
    }

    /// The pages of the block.
    #[inline]
    pub fn range(&self) -> PageRange {
        PageRange::new(self.pfn, self.order.pages())
    }

    /// Whether `pfn` is a multiple of the block size.
    #[inline]
    pub fn is_aligned(&self) -> bool {
        self.pfn.is_aligned(self.order)
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} {}]", self.pfn, self.order)
    }
}

/// What the manager knows about the contents and backing of a free block.
///
/// Two independent facts, both tracked through split and merge (docs/ARCHITECTURE.md §3); no other flag
/// shares their storage (the "skip redundant zeroing" series had to defend PG_zeroed against PG_private aliasing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FreeState {
    /// Every byte of the block is known to read zero.
    pub known_zero: bool,
    /// The block was reported to the host (its backing may have been discarded).
    pub reported: bool,
}

impl FreeState {
    /// Freed by its owner with no promise about its contents.
    pub const DIRTY: FreeState = FreeState {
        known_zero: false,
        reported: false,
    };
    /// Known zero, not reported (e.g. deflated host-zeroed page).
    pub const ZERO: FreeState = FreeState {
        known_zero: true,
        reported: false,
    };
    /// Reported, contents unknown.
    pub const REPORTED_DIRTY: FreeState = FreeState {
        known_zero: false,
        reported: true,
    };
    /// Reported and the host promised zero.
    pub const REPORTED_ZERO: FreeState = FreeState {
        known_zero: true,
        reported: true,
    };
    /// The four states, in [`FreeState::index`] order.
    pub const ALL: [FreeState; 4] = [
        FreeState::DIRTY,
        FreeState::ZERO,
        FreeState::REPORTED_DIRTY,
        FreeState::REPORTED_ZERO,
    ];

    /// State of a block merged from two buddies: each fact holds only if it holds for both.
    #[inline]
    pub fn merge(self, other: FreeState) -> FreeState {
        FreeState {
            known_zero: self.known_zero && other.known_zero,
            reported: self.reported && other.reported,
        }
    }

    /// Dense index 0..4 (bit 0 = known_zero, bit 1 = reported); selects a free list.
    #[inline]
    pub const fn index(self) -> usize {
        (self.known_zero as usize) | ((self.reported as usize) << 1)
    }
}

/// Identifies one zone of a [`crate::MemoryManager`] (index in the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ZoneId(pub usize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_validated() {
        assert!(Order::new(MAX_ORDER_LIMIT).is_ok());
        assert_eq!(Order::new(19), Err(OrderError { order: 19 }));
        assert_eq!(Order::new(9).unwrap().bytes(), 2 << 20);
    }

    #[test]
    fn merge_is_a_conjunction_of_both_facts() {
        for a in FreeState::ALL {
            for b in FreeState::ALL {
                let m = a.merge(b);
                assert_eq!(m.known_zero, a.known_zero && b.known_zero);
                assert_eq!(m.reported, a.reported && b.reported);
            }
        }
        let idx: Vec<usize> = FreeState::ALL.iter().map(|s| s.index()).collect();
        assert_eq!(idx, vec![0, 1, 2, 3]);
    }
}
