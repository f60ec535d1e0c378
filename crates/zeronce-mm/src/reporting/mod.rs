//! Free page reporting (docs/ARCHITECTURE.md §4): after a delay, free blocks of reportable order are
//! isolated in batches, handed to a [`ReportingDevice`] (the host), and put back reported —
//! known zero where the device guarantees it (the host-zeroed hints of the "skip redundant zeroing" series).
//!
//! Model: Linux `mm/page_reporting.c` (with its rotation and budget patches).
//! - [`ReportingEngine`]: pure state machine IDLE → REQUESTED → ACTIVE plus the pass logic;
//!   time is a parameter, so it is tested without sleeping.
//! - [`Reporter`]: the std driver, one worker thread with a condvar (no busy loop).
//! - [`ReportingHooks`]: what the engine needs from the allocator;
//!   [`crate::MemoryManager`] implements it.
//!
//! Deviations from Linux, and why:
//! - Free lists are kept per state (dirty / zero / reported / reported-zero), so the next
//!   unreported block is always at the head of its list: Linux's rotation after a full
//!   batch is structural (nothing to rotate past).
//! - A spent budget always re-requests a pass (Linux only when it saw an unreported page
//!   left): at worst one empty pass after the delay.
//! - [`BudgetPolicy::Adaptive`] reports everything in one pass when nothing of reportable
//!   order was allocated since the delay began (the request, or the end of the previous
//!   pass): "since the last pass" alone would count the allocations that preceded a big
//!   free and keep the budget for the first pass after it.
//! - Devices with a hold time answer [`ZeroGuarantee::NotZeroed`] at report time and get the
//!   blocks again in a *settle* pass once the hold is over (never a false "zero"; a block
//!   allocated during its hold is simply gone from the free lists).
//! - Time is a parameter of every engine call ([`std::time::Instant`]); only [`Reporter`]
//!   reads the clock.

mod config;
mod device;
mod engine;
mod hooks;
mod state;
mod worker;

#[cfg(test)]
mod tests;

pub use crate::manager::{PutBack, ZeroGuarantee};
pub use config::{BudgetPolicy, ReportingConfig, ReportingConfigError};
pub use device::{ReportError, ReportingDevice, ReportingHooks, Wanted};
pub use engine::{PassKind, PassReport, PassStats, ReportingEngine, ReportingStats};
pub use hooks::ManagerHooks;
#[cfg(test)]
use state::Phase;
pub use worker::{Notifier, Reporter, ReporterHealth};
