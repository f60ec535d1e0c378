//! What the host does with reported memory in process mode.

use std::time::Duration;

use zeronce_mem::{Backing, DiscardOp};
use zeronce_mm::ReportedNotZero;

/// What the host does with reported memory: discard at once, hold then discard, free
/// lazily, or zero in the background then discard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPolicy {
    /// Discard at once; the block reads zero from now on (`MADV_DONTNEED`, punch hole).
    Immediate,
    /// Keep the block resident for `hold`, then discard it. Reported but *not* known zero
    /// during the hold, so an allocation in that window takes it back without a fault
    /// (and zeroes it if asked to); after the hold a settle pass discards the blocks still
    /// free and only then marks them known zero.
    Hold(Duration),
    /// `MADV_FREE`: the kernel takes the memory only under pressure and old contents may
    /// survive, so the block is **never** claimed zero. Private anonymous memory only.
    Lazy,
    /// The zero-once lifecycle: a freed block of reporting order is zeroed off the
    /// allocation path by the background zeroer with streaming stores (known zero and
    /// resident: a zero-request takes it with no memset and no fault), and reported
    /// (discarded, known zero, not resident) once it has stayed free for about `hold` (the
    /// engine's delay becomes `hold`). The zeroer's threads, priority and rate are the
    /// builder's [`crate::process::ZeroerConfig`].
    ZeroThenReport {
        /// How long a free block stays resident (zeroed) before it is discarded.
        hold: Duration,
    },
}

impl HostPolicy {
    /// What backs the blocks this policy reports without a zero promise: held and
    /// `MADV_FREE`d blocks are still resident (a zero-request takes them back before
    /// faulting fresh memory in); with `Immediate` only a host without zero hints answers
    /// "not zero", after discarding.
    pub fn reported_not_zero(self) -> ReportedNotZero {
        match self {
            HostPolicy::Immediate | HostPolicy::ZeroThenReport { .. } => ReportedNotZero::Discarded,
            HostPolicy::Hold(_) | HostPolicy::Lazy => ReportedNotZero::Resident,
        }
    }

    /// The discard operation this policy uses on `backing`; `None` if it cannot be used.
    pub fn discard_op(self, backing: Backing) -> Option<DiscardOp> {
        match self {
            HostPolicy::Immediate | HostPolicy::Hold(_) | HostPolicy::ZeroThenReport { .. } => {
                Some(DiscardOp::best_for(backing))
            }
            HostPolicy::Lazy => DiscardOp::Free
                .supported_on(backing)
                .then_some(DiscardOp::Free),
        }
    }
}

/// The device was asked for a policy its backing cannot do.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
#[error("host policy {policy:?} cannot discard {backing} memory")]
pub struct PolicyError {
    /// The policy.
    pub policy: HostPolicy,
    /// The backing.
    pub backing: Backing,
}
