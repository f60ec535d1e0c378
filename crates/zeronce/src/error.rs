//! The errors of process mode, VM mode and the huge-page pool: [`BuildError`] once, when
//! one is built; [`BlockError`] on an allocation; a free fails with the manager's
//! [`FreeError`]; a pool's calls with [`PrezeroError`].

use std::time::Duration;

use rustix::io::Errno;
use vm_memory::mmap::FromRangesError;
use zeronce_balloon_driver::DriverError;
use zeronce_mem::{BackingKind, ClaimError, RamError};
use zeronce_mm::hugepool::HugePoolError;
use zeronce_mm::reporting::ReportingConfigError;
use zeronce_mm::{AllocError, ConfigError, Order};

pub use zeronce_mm::FreeError;

use crate::policy::PolicyError;

/// Why a [`crate::ProcessMemory`], a [`crate::VmMemory`] or a [`crate::HugePagePool`]
/// could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Mapping the RAM failed (size, huge pages, system call).
    #[error(transparent)]
    Ram(#[from] RamError),
    /// The manager refused its configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The reporting engine refused its configuration.
    #[error(transparent)]
    Reporting(#[from] ReportingConfigError),
    /// Process mode: the host policy does not work on this backing (`MADV_FREE` on a
    /// memfd).
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
    /// The background zeroer threads could not be started (process mode).
    #[error("starting the background zeroer: {0}")]
    Zeroer(#[source] std::io::Error),
    /// VM mode: the device needs to map the RAM too, so it must be a memfd (or hugetlb
    /// memfd).
    #[error("VM mode needs file-backed RAM (memfd or hugetlb), not {0:?}")]
    NotFileBacked(BackingKind),
    /// VM mode: the RAM is too small for the ring area and one block.
    #[error("{size} bytes of RAM cannot hold the {ring} bytes of rings and any memory")]
    TooSmall {
        /// RAM size.
        size: usize,
        /// Ring area size.
        ring: u64,
    },
    /// VM mode: duplicating the memfd or starting the device thread failed.
    #[error("device setup: {0}")]
    Io(#[from] std::io::Error),
    /// VM mode: mapping the memfd for the device or the driver failed.
    #[error("mapping guest memory: {0}")]
    Map(#[from] FromRangesError),
    /// VM mode: the driver could not initialise the device.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// VM mode: the device would hold each report at least as long as the driver waits
    /// for it, so the first report would time out and stop the driver for good.
    #[error(
        "the device holds reports for {hold:?}, the driver waits {timeout:?}: the hold \
         must be shorter than the driver's timeout"
    )]
    HoldNotBelowTimeout {
        /// The discard policy's hold.
        hold: Duration,
        /// The driver's timeout.
        timeout: Duration,
    },
    /// Pool: the configuration has no pages, or more nodes than pages.
    #[error("a pool needs at least one page per node ({pages} pages, {nodes} nodes)")]
    EmptyPool {
        /// Pages asked for.
        pages: u64,
        /// Nodes asked for.
        nodes: usize,
    },
    /// Pool: what a pool's call can fail with failed while building it (the pool state
    /// refused its pages, populating found them claimed, eventfd or thread creation).
    #[error(transparent)]
    Pool(#[from] PrezeroError),
}

/// Why a block could not be allocated.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The manager had no block (out of memory) or refused the request.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The block's bytes were still claimed (a bug; the block went back).
    #[error(transparent)]
    Claim(#[from] ClaimError),
}

/// Any failure of process mode, VM mode or a huge-page pool, for a caller that builds,
/// allocates and frees in one function; every call returns the precise one of these.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Building failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// An allocation failed.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// A free failed.
    #[error(transparent)]
    Free(#[from] FreeError),
    /// A call of a huge-page pool failed.
    #[error(transparent)]
    Pool(#[from] PrezeroError),
}

/// Why a call of a pool failed (building one fails with [`BuildError`]).
#[derive(Debug, thiserror::Error)]
pub enum PrezeroError {
    /// The pool state refused the operation.
    #[error(transparent)]
    Pool(#[from] HugePoolError),
    /// A page's bytes were still claimed (a bug).
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// A system call failed (poll).
    #[error(transparent)]
    Os(#[from] OsError),
}

/// A system call of a pool failed.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed: {errno}")]
pub struct OsError {
    /// The call.
    pub call: &'static str,
    /// The error.
    pub errno: Errno,
}
