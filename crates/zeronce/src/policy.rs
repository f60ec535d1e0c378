//! The host policy of process mode: [`DiscardPolicy`] (one type with the device's, from
//! `zeronce_balloon`), refused where its op does not work on the RAM's backing.

use zeronce_balloon::DiscardPolicy;
use zeronce_mem::{Backing, DiscardOp};
use zeronce_mm::ReportedNotZero;

/// What backs the blocks `policy` reports without a zero promise in process mode: held
/// and `MADV_FREE`d blocks are still resident (a zero-request takes them back before
/// faulting fresh memory in); with `Immediate` only a host without zero hints answers
/// "not zero", after discarding.
pub(crate) fn reported_not_zero(policy: DiscardPolicy) -> ReportedNotZero {
    match policy {
        DiscardPolicy::Immediate => ReportedNotZero::Discarded,
        DiscardPolicy::Hold(_) | DiscardPolicy::Lazy => ReportedNotZero::Resident,
    }
}

/// The op `policy` uses on `backing` in process mode: its own, or refused (process mode
/// knows its one backing when it is built, so it takes no fallback; see
/// [`DiscardPolicy::op_for`]).
pub(crate) fn discard_op(
    policy: DiscardPolicy,
    backing: Backing,
) -> Result<DiscardOp, PolicyError> {
    policy
        .op_for(backing)
        .map_err(|_| PolicyError { policy, backing })
}

/// Process mode was asked for a policy its backing cannot do.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
#[error("host policy {policy:?} cannot discard {backing} memory")]
pub struct PolicyError {
    /// The policy.
    pub policy: DiscardPolicy,
    /// The backing.
    pub backing: Backing,
}
