//! The error of process and VM mode.

use zeronce_mem::{ClaimError, RamError};
use zeronce_mm::reporting::ReportingConfigError;
use zeronce_mm::{AllocError, ConfigError, FreeError, Order};

use crate::policy::PolicyError;

/// Why process memory could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Mapping the RAM failed (size, huge pages, system call).
    #[error(transparent)]
    Ram(#[from] RamError),
    /// The manager refused its configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The reporting engine refused its configuration.
    #[error(transparent)]
    Reporting(#[from] ReportingConfigError),
    /// The host policy does not work on this backing (e.g. `MADV_FREE` on a memfd).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Reported blocks would be smaller than the backing's pages (hugetlb discards whole
    /// huge pages only).
    #[error("reporting order {order} is below the backing's {page_size}-byte pages")]
    OrderBelowPageSize {
        /// Configured reporting order.
        order: Order,
        /// Page size of the backing.
        page_size: usize,
    },
    /// Allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// Free failed.
    #[error(transparent)]
    Free(#[from] FreeError),
    /// A handed-out block's bytes were still claimed (a bug).
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// Discarding part of a block failed.
    #[error(transparent)]
    Discard(#[from] zeronce_mem::DiscardError),
    /// The background zeroer threads could not be started.
    #[error("starting the background zeroer: {0}")]
    Thread(#[from] std::io::Error),
}
