//! zeronce as a library: free page reporting with host-zeroed hints for the memory of the
//! running process ("process mode", docs/ARCHITECTURE.md §1). Build a [`ProcessMemory`] in a few lines,
//! allocate blocks (zeroed only when not known zero), free them, and RSS follows the
//! working set. The building blocks are re-exported: [`zeronce_mm`] (pure allocator and
//! reporting engine) and [`zeronce_mem`] (real memory).
//!
//! VM mode ([`VmMemory`]) is the same allocator reporting through a virtio-balloon driver
//! over split virtqueues in guest RAM to the [`zeronce_balloon`] device running in a
//! thread of this process, sharing the RAM's memfd.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod held;
mod managed;
pub mod process;
pub mod vm;

pub use process::{
    Builder, DeviceStats, Error, HostPolicy, PageBlock, ProcessDevice, ProcessMemory, ProcessStats,
    RamZeroer, ReportingSetup,
};
pub use vm::{VmBuilder, VmDriver, VmError, VmMemory, VmStats};
pub use zeronce_balloon;
pub use zeronce_balloon_driver;
pub use zeronce_mem;
pub use zeronce_mm;
pub use zeronce_mm::reporting::{BudgetPolicy, ReportingConfig};
pub use zeronce_mm::{AllocRequest, Block, Order};

pub mod prezero;
pub use prezero::{CancelToken, HugePagePool, PoolPage, PrezeroError, PrezeroReport};
