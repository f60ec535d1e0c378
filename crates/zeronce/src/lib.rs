//! zeronce: return free memory to the host, and never zero a page twice.
//!
//! [`ProcessMemory`] ("process mode") manages memory of the running process with free page
//! reporting to the Linux kernel as the host: freed blocks of 2 MiB and more are
//! discarded after a delay (RSS follows the working set) and come back *known zero*, so a
//! zeroed allocation served from them skips the memset.
//!
//! ```
//! use zeronce::zeronce_mm::Zeroing;
//! use zeronce::{Order, ProcessMemory, ReportingSetup};
//!
//! // 256 MiB of THP-backed memory; freed 2 MiB blocks are reported to the kernel
//! // (MADV_DONTNEED) after 2 s and come back known zero.
//! let pm = ProcessMemory::builder()
//!     .size(256 << 20)
//!     .reporting(ReportingSetup::default())
//!     .build()?;
//! let order = Order::new(9)?; // 2 MiB
//! let mut block = pm.alloc(order)?; // no zero-request: a dirty block is fine
//! block.as_mut_slice().fill(1);
//! drop(block); // freed: dirty until it is reported
//!
//! // Report now instead of waiting for the delay: the kernel discards the block.
//! pm.flush(u64::MAX);
//! let zeroed = pm.alloc_zeroed(order)?;
//! assert_eq!(zeroed.allocation().zeroing, Zeroing::Skipped); // known zero: no memset
//! assert!(zeroed.as_slice().iter().all(|&b| b == 0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`VmMemory`] ("VM mode") is the same allocator reporting through a virtio-balloon
//! driver over split virtqueues in guest RAM to the [`zeronce_balloon`] device running in
//! a thread of this process, sharing the RAM's memfd. [`HugePagePool`] keeps huge pages
//! pre-zeroed on the caller's threads. The building blocks are re-exported:
//! [`zeronce_mm`] (pure allocator and reporting engine), [`zeronce_mem`] (real memory),
//! [`zeronce_balloon`] (the device) and [`zeronce_balloon_driver`] (the guest driver).
//!
//! How the pieces fit, and the rules that keep "known zero" true:
//! `docs/ARCHITECTURE.md` in the repository.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod caches;
mod claimed;
mod error;
pub mod global;
mod kept;
mod managed;
mod policy;
pub mod process;
mod threads;
pub mod vm;
mod words;
mod zeroing;

pub use global::{ProcessBackend, ZeronceAlloc};
pub use process::{
    Builder, DeviceStats, Error, HostPolicy, PageBlock, ProcessDevice, ProcessMemory, ProcessStats,
    RamZeroer, ReportingSetup, ZeroerConfig, ZeroingStats,
};
pub use vm::{
    ConnectDevice, DeviceHost, VmBuilder, VmDriver, VmError, VmHealth, VmMemory, VmStats,
};
pub use zeronce_balloon;
pub use zeronce_balloon_driver;
pub use zeronce_mem;
pub use zeronce_mm;
pub use zeronce_mm::reporting::{BudgetPolicy, ReportingConfig};
pub use zeronce_mm::{AllocRequest, Block, Order};

pub mod prezero;
pub use prezero::{CancelToken, HugePagePool, PoolPage, PrezeroError, PrezeroReport};
