//! Configuration of the reporting engine: Linux defaults (docs/ARCHITECTURE.md §4), all overridable.

use crate::types::{Order, DEFAULT_REPORTING_ORDER};
use std::time::Duration;
use thiserror::Error;

/// Linux `PAGE_REPORTING_CAPACITY`: blocks per report call.
pub(crate) const DEFAULT_CAPACITY: usize = 32;

/// Linux `PAGE_REPORTING_DELAY`: wait after a reportable free before a pass starts.
pub(crate) const DEFAULT_DELAY: Duration = Duration::from_secs(2);

/// Linux divides each free list by `capacity * 16` to size a pass's budget.
pub(crate) const BUDGET_DIVISOR: u64 = 16;

/// How many report calls a pass may make per free list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BudgetPolicy {
    /// Linux: `ceil(nr_free / (capacity * 16))` calls, plus one for a batch carried over
    /// from the previous list. An idle system is fully reported in about 16 passes.
    #[default]
    Linux,
    /// No budget while nothing of reportable order was allocated during the delay that
    /// preceded the pass (the memory is idle: report all of it now); the Linux budget
    /// under churn, where reported blocks would only be faulted back in.
    Adaptive,
    /// No budget at all (every unreported block is reported in one pass).
    Unlimited,
}

impl BudgetPolicy {
    /// Report calls allowed for a free list of `nr_free` blocks. `quiet`: nothing of
    /// reportable order was allocated since the delay began.
    pub fn calls(self, nr_free: u64, capacity: usize, quiet: bool) -> u64 {
        // Linux: budget = DIV_ROUND_UP(nr_free, CAPACITY * 16); the loop stops when the
        // budget goes negative, so one more call than the quotient is made.
        let linux = nr_free.div_ceil(capacity as u64 * BUDGET_DIVISOR) + 1;
        match self {
            BudgetPolicy::Linux => linux,
            BudgetPolicy::Adaptive if quiet => u64::MAX,
            BudgetPolicy::Adaptive => linux,
            BudgetPolicy::Unlimited => u64::MAX,
        }
    }
}

/// Settings of a [`crate::reporting::ReportingEngine`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportingConfig {
    /// Smallest order reported (Linux: `pageblock_order` = 9, 2 MiB). Every larger order
    /// up to the manager's `max_order` is reported too.
    pub order: Order,
    /// Blocks per report call; a power of two (Linux: 32). The device may lower it.
    pub capacity: usize,
    /// Wait between a reportable free and the pass it triggers (Linux: 2 s).
    pub delay: Duration,
    /// Report calls allowed per pass and free list.
    pub budget: BudgetPolicy,
    /// Skip a zone whose free pages are under its low watermark plus one full batch
    /// (Linux: always on).
    pub watermark_gate: bool,
}

impl Default for ReportingConfig {
    fn default() -> Self {
        ReportingConfig {
            order: DEFAULT_REPORTING_ORDER,
            capacity: DEFAULT_CAPACITY,
            delay: DEFAULT_DELAY,
            budget: BudgetPolicy::Linux,
            watermark_gate: true,
        }
    }
}

/// A [`ReportingConfig`] the engine refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ReportingConfigError {
    /// Capacity zero or not a power of two.
    #[error("reporting capacity {0} is not a power of two")]
    Capacity(usize),
    /// The device accepts no block at all.
    #[error("the reporting device accepts no block (capacity 0)")]
    DeviceCapacity,
    /// The reporting order is above the allocator's largest order: nothing would ever be
    /// reported.
    #[error("reporting {order} is above the allocator's max {max}")]
    OrderAboveMax {
        /// Configured reporting order.
        order: crate::Order,
        /// The allocator's largest order.
        max: crate::Order,
    },
}

impl ReportingConfig {
    /// Checks the configuration and lowers the capacity to what the device accepts
    /// (rounded down to a power of two, as Linux's budget division expects).
    pub(crate) fn fitted(mut self, device_capacity: usize) -> Result<Self, ReportingConfigError> {
        if self.capacity == 0 || !self.capacity.is_power_of_two() {
            return Err(ReportingConfigError::Capacity(self.capacity));
        }
        if device_capacity == 0 {
            return Err(ReportingConfigError::DeviceCapacity);
        }
        if device_capacity < self.capacity {
            // Largest power of two not above what the device can take.
            self.capacity = 1 << (usize::BITS - 1 - device_capacity.leading_zeros());
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_budget_is_a_sixteenth_plus_one_call() {
        assert_eq!(BudgetPolicy::Linux.calls(0, 32, true), 1);
        assert_eq!(BudgetPolicy::Linux.calls(1, 32, true), 2);
        assert_eq!(BudgetPolicy::Linux.calls(512, 32, true), 2);
        assert_eq!(BudgetPolicy::Linux.calls(513, 32, true), 3);
        assert_eq!(BudgetPolicy::Adaptive.calls(513, 32, false), 3);
        assert_eq!(BudgetPolicy::Adaptive.calls(513, 32, true), u64::MAX);
        assert_eq!(BudgetPolicy::Unlimited.calls(1, 32, false), u64::MAX);
    }

    #[test]
    fn capacity_is_fitted_to_the_device() {
        let c = ReportingConfig::default();
        assert_eq!(c.fitted(256).unwrap().capacity, 32);
        assert_eq!(c.fitted(24).unwrap().capacity, 16);
        assert_eq!(c.fitted(1).unwrap().capacity, 1);
        assert_eq!(c.fitted(0), Err(ReportingConfigError::DeviceCapacity));
        let bad = ReportingConfig { capacity: 24, ..c };
        assert_eq!(bad.fitted(32), Err(ReportingConfigError::Capacity(24)));
    }
}
