//! What the engine talks to: the reporting device (the host side) and the allocator hooks.

use crate::error::PutBackError;
use crate::manager::{PutBack, ZeroGuarantee};
use crate::types::{Block, Order, PageRange, ZoneId};
use std::time::Instant;
use thiserror::Error;

/// A whole report call failed: every block of the batch goes back unreported and the pass
/// stops (Linux: `page_reporting_drain(..., !err)` then exit).
#[derive(Debug, Error)]
#[error("reporting device failed: {source}")]
pub struct ReportError {
    /// What the device said.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl ReportError {
    /// Wraps any device error.
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ReportError {
            source: source.into(),
        }
    }
}

/// The host side of free page reporting (virtio-balloon's reporting queue, or the running
/// process's own kernel in process mode).
pub trait ReportingDevice: Send {
    /// Most blocks one report call may carry (virtqueue size, ...). The engine uses the
    /// largest power of two not above `min(config.capacity, capacity())`.
    fn capacity(&self) -> usize;

    /// Reports `blocks` (isolated: nobody can allocate them until this returns). On
    /// success, `verdicts[i]` (pre-set to [`ZeroGuarantee::NotZeroed`]) says what became of
    /// `blocks[i]`. `now` is the engine's clock.
    fn report(
        &mut self,
        now: Instant,
        blocks: &[PageRange],
        verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), ReportError>;

    /// When the earliest *held* block (reported, not yet discarded) is due to be discarded;
    /// `None` when the device holds nothing. The engine then runs a settle pass.
    fn hold_expiry(&self) -> Option<Instant> {
        None
    }

    /// Settle pass: `blocks` are free blocks that are reported but not known zero, isolated
    /// again. A device with a hold time discards those whose hold is over and answers
    /// [`ZeroGuarantee::Zeroed`] for them. A block allocated during its hold never comes here
    /// (it was taken back, resident and not known zero, so a zero-request zeroes it).
    fn settle(
        &mut self,
        _now: Instant,
        _blocks: &[PageRange],
        _verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), ReportError> {
        Ok(())
    }

    /// A settle pass ended. Every free held block whose hold was over has been offered
    /// (unless its zone was gated or a call failed: those stay reported, not known zero,
    /// which is truthful); expired holds left belong to blocks allocated during their hold.
    /// A device forgets them here, so an expired hold never makes the worker spin.
    fn end_settle(&mut self, _now: Instant) {}
}

/// Which free blocks a pass isolates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// Not reported yet (dirty or known zero): a report pass.
    Unreported,
    /// Reported but not known zero: a settle pass (held or lazily discarded blocks).
    ReportedNotZero,
}

/// What the engine needs from the allocator (implemented by [`crate::MemoryManager`]).
pub trait ReportingHooks {
    /// Number of zones (`ZoneId(0..n)`).
    fn zone_count(&self) -> usize;
    /// Largest block order of the manager.
    fn max_order(&self) -> Order;
    /// Free pages of a zone (isolated pages excluded).
    fn zone_free_pages(&self, zone: ZoneId) -> u64;
    /// The zone's low watermark in pages.
    fn zone_low_watermark(&self, zone: ZoneId) -> u64;
    /// Free blocks of `order` in `zone`, all states (Linux `area->nr_free`).
    fn nr_free(&self, zone: ZoneId, order: Order) -> u64;
    /// Takes up to `max` free blocks of exactly `order` in state `wanted` off the free
    /// lists of `zone` (isolated: not allocatable, not mergeable) and appends them to `out`.
    fn isolate(&self, zone: ZoneId, order: Order, wanted: Wanted, max: usize, out: &mut Vec<Block>);
    /// Puts an isolated block back, merging with free buddies (docs/ARCHITECTURE.md §3).
    fn put_back(&self, block: Block, how: PutBack) -> Result<(), PutBackError>;
    /// Monotonic count of allocations that took a block of reportable order or larger off
    /// the free lists (the adaptive budget's churn signal).
    fn reportable_allocs(&self) -> u64;
    /// Runs before each reporting pass (scheduled or flush, not settle): gives back to
    /// the free lists any free blocks the caller caches outside them, so the pass can
    /// report them. Does nothing by default.
    fn before_pass(&self) {}
}
