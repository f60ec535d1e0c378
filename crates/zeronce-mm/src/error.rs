//! Typed errors. Every error is returned before any state changes, except where a variant
//! documents otherwise (verification failures, which repair the state they detect).

use crate::types::{Block, Order, PageRange, Pfn, ZoneId};
use thiserror::Error;

/// A configuration the manager refuses.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// No zone configured.
    #[error("no zones configured")]
    NoZones,
    /// A zone has no pages.
    #[error("zone {0:?} is empty")]
    EmptyZone(ZoneId),
    /// A zone has more frames than the frame table can index (2^32 - 1).
    #[error("zone {0:?} is too large for the frame table")]
    ZoneTooLarge(ZoneId),
    /// Two zones share pages.
    #[error("zones {0:?} and {1:?} overlap")]
    Overlap(ZoneId, ZoneId),
    /// The reporting order is above the maximum order.
    #[error("reporting order {reporting} is above max order {max}")]
    ReportingOrder {
        /// Configured reporting order.
        reporting: Order,
        /// Configured maximum order.
        max: Order,
    },
}

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum AllocError {
    /// The order is above the manager's `max_order`.
    #[error("{order} is above max order {max}")]
    OrderTooLarge {
        /// Requested order.
        order: Order,
        /// Configured maximum.
        max: Order,
    },
    /// No zone has a free block of the order (or larger).
    #[error("out of memory for {0}")]
    OutOfMemory(Order),
    /// Verify mode: a block tracked as known zero did not read zero. The block was put back
    /// on the free lists as *not* known zero and was not handed out; this is a bug in
    /// whoever claimed it was zero (host, deflate path, pre-zeroer) and must be loud.
    #[error("verify: {block} was tracked as known zero but is not")]
    VerifyFailed {
        /// The block that failed verification.
        block: Block,
    },
}

/// Why a free (or put-back / zero hint) was refused. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum FreeError {
    /// The PFN lies in no zone of this manager.
    #[error("{0} is not managed by this manager")]
    NotOwned(Pfn),
    /// The block does not lie entirely inside the zone holding its first page.
    #[error("{0} crosses the end of its zone")]
    OutOfZone(Block),
    /// The PFN is not a multiple of the block size.
    #[error("{0} is not aligned to its order")]
    Unaligned(Block),
    /// The order is above the manager's `max_order`.
    #[error("{order} is above max order {max}")]
    OrderTooLarge {
        /// Given order.
        order: Order,
        /// Configured maximum.
        max: Order,
    },
    /// The block is already free (double free).
    #[error("double free of {block}: already free in {free}")]
    DoubleFree {
        /// The block given.
        block: Block,
        /// The free block containing it.
        free: Block,
    },
    /// The block is isolated for reporting; only the reporting engine may put it back.
    #[error("{block} is isolated for reporting (inside {isolated})")]
    Isolated {
        /// The block given.
        block: Block,
        /// The isolated block containing it.
        isolated: Block,
    },
    /// The PFN starts an allocation of a different order.
    #[error("{block} has the wrong order: allocated as {allocated}")]
    WrongOrder {
        /// The block given.
        block: Block,
        /// The order it was allocated with.
        allocated: Order,
    },
    /// The PFN is inside an allocated block but is not its first page.
    #[error("{block} is not the start of an allocation (inside {allocated})")]
    NotBlockStart {
        /// The block given.
        block: Block,
        /// The allocation containing it.
        allocated: Block,
    },
    /// Verify mode: freed with [`crate::FreeHint::KnownZero`] but not zero. Nothing changed:
    /// the block is still allocated.
    #[error("verify: {0} freed as known zero but is not")]
    VerifyFailed(Block),
}

/// Why [`crate::MemoryManager::put_back`] refused a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum PutBackError {
    /// The PFN lies in no zone of this manager.
    #[error("{0} is not managed by this manager")]
    NotOwned(Pfn),
    /// The block is not an isolated block of exactly this PFN and order. Nothing changed.
    #[error("{0} is not isolated")]
    NotIsolated(Block),
    /// Verify mode: the verdict said zeroed but the block is not. The block *was* put back
    /// (never lost) as reported and not known zero.
    #[error("verify: host said {0} is zeroed but it is not (put back as not known zero)")]
    VerifyFailed(Block),
}

/// Why [`crate::MemoryManager::mark_known_zero`] refused a range. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum MarkError {
    /// The range is not inside a single zone.
    #[error("{0:?} is not inside one zone")]
    NotOwned(PageRange),
    /// Verify mode: a free block inside the range does not read zero.
    #[error("verify: {0} was claimed zero but is not")]
    VerifyFailed(Block),
}

/// A broken internal invariant (a bug in this crate), found by `check_invariants`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("zone {zone:?}: {what}")]
pub struct InvariantViolation {
    /// Zone where it was found.
    pub zone: ZoneId,
    /// Human-readable description.
    pub what: String,
}
