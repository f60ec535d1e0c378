//! Vocabulary of the huge-page pool: pages, their states, allocation results, counters
//! and errors.

use thiserror::Error;

use crate::types::{Block, Order, PageRange, Pfn, ZoneId};

/// State of one pool page. Illegal combinations (in use *and* known zero, zeroing *and*
/// allocatable) cannot be expressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// In the pool, allocatable.
    Free {
        /// Every byte is known to read zero (HPG_zeroed).
        known_zero: bool,
    },
    /// Handed out by [`HugePool::alloc`](super::HugePool::alloc).
    InUse,
    /// Handed to a zeroer by [`HugePool::take_zeroable`](super::HugePool::take_zeroable); not allocatable until
    /// [`HugePool::finish_zeroing`](super::HugePool::finish_zeroing).
    Zeroing,
}

/// A page of the pool: `2^order` frames at `pfn` on `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HugePage {
    /// First frame.
    pub pfn: Pfn,
    /// Size class (the pool's order).
    pub order: Order,
    /// Node (zone) it belongs to.
    pub node: ZoneId,
}

impl HugePage {
    /// The page as a buddy block.
    pub fn block(self) -> Block {
        Block::new(self.pfn, self.order)
    }

    /// Its frames.
    pub fn range(self) -> PageRange {
        self.block().range()
    }
}

/// A page handed to a zeroer. Not `Clone`: exactly one [`HugePool::finish_zeroing`](super::HugePool::finish_zeroing) per
/// ticket puts the page back.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a page being zeroed stays unallocatable until finish_zeroing"]
pub struct ZeroingTicket {
    pub(super) page: HugePage,
}

impl ZeroingTicket {
    /// The page to zero.
    pub fn page(&self) -> HugePage {
        self.page
    }
}

/// What the caller of [`HugePool::alloc`](super::HugePool::alloc) must do about zeroing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolZeroing {
    /// Zero-request served from a known-zero page: write nothing.
    Skipped,
    /// Zero-request served from a dirty page (no known-zero page left): the caller must
    /// zero it before use.
    Required,
    /// No zero-request: contents are whatever they were.
    NotRequested,
}

/// A page handed out by [`HugePool::alloc`](super::HugePool::alloc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolAllocation {
    /// The page; free it with [`HugePool::free`](super::HugePool::free).
    pub page: HugePage,
    /// Whether the caller must zero it.
    pub zeroing: PoolZeroing,
}

/// Counters of a pool (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Successful allocations.
    pub allocs: u64,
    /// Zero-requests served from known-zero pages (no zeroing on the allocation path).
    pub allocs_prezeroed: u64,
    /// Zero-requests served from dirty pages (zeroed inline by the caller).
    pub allocs_zeroed_inline: u64,
    /// Allocations that failed (no allocatable page).
    pub alloc_failures: u64,
    /// Frees.
    pub frees: u64,
    /// Pages zeroed by a zeroer ([`HugePool::finish_zeroing`](super::HugePool::finish_zeroing) with `ok`).
    pub pages_prezeroed: u64,
    /// Pages a zeroer gave back unzeroed (cancelled or failed).
    pub zeroing_aborted: u64,
    /// Events delivered to the hook.
    pub events: u64,
}

/// Page counts of one node (or the whole pool), by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Free, known zero.
    pub free_zero: u64,
    /// Free, not known zero: the zeroable pages.
    pub zeroable: u64,
    /// Handed out.
    pub in_use: u64,
    /// Being zeroed.
    pub zeroing: u64,
}

impl PoolCounts {
    /// All pages.
    pub fn total(&self) -> u64 {
        self.free_zero + self.zeroable + self.in_use + self.zeroing
    }
}

/// Why a pool operation was refused. Nothing changed, unless the variant says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HugePoolError {
    /// A range given to [`HugePool::add_range`](super::HugePool::add_range) is empty or not aligned to the pool's order.
    #[error("{range:?} is not a whole number of aligned {order} pages")]
    Unaligned {
        /// The range.
        range: PageRange,
        /// The pool's order.
        order: Order,
    },
    /// A page being added is already in the pool.
    #[error("{0} is already in the pool")]
    AlreadyInPool(Pfn),
    /// The page is not in this pool (or not with this order / node).
    #[error("{0:?} is not a page of this pool")]
    ForeignPage(HugePage),
    /// The page is already free.
    #[error("double free of {0:?}")]
    DoubleFree(HugePage),
    /// The page is being zeroed; only its ticket can put it back.
    #[error("{0:?} is being zeroed, not allocated")]
    BeingZeroed(HugePage),
    /// The ticket's page is not being zeroed (a ticket of another pool).
    #[error("{0:?} is not being zeroed")]
    NotZeroing(HugePage),
    /// No allocatable page on the node(s) asked for; `zeroing` pages will come back after
    /// their zeroer finishes (retry then).
    #[error("no free huge page (node {node:?}); {zeroing} being zeroed")]
    Exhausted {
        /// The node asked for (`None`: any).
        node: Option<ZoneId>,
        /// Pages currently being zeroed there.
        zeroing: u64,
    },
}
