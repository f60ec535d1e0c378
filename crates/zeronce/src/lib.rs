//! zeronce as a library: free page reporting with host-zeroed hints for the memory of the
//! running process ("process mode", DESIGN §1). Build a [`ProcessMemory`] in a few lines,
//! allocate blocks (zeroed only when not known zero), free them, and RSS follows the
//! working set. The building blocks are re-exported: [`zeronce_mm`] (pure allocator and
//! reporting engine) and [`zeronce_mem`] (real memory).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod process;

pub use process::{
    Builder, DeviceStats, Error, HostPolicy, PageBlock, ProcessDevice, ProcessMemory, ProcessStats,
    RamZeroer, ReportingSetup,
};
pub use zeronce_mem;
pub use zeronce_mm;
pub use zeronce_mm::reporting::{BudgetPolicy, ReportingConfig};
pub use zeronce_mm::{AllocRequest, Block, Order};
