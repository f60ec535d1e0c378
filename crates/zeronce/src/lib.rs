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
//! pre-zeroed on the caller's threads. [`ZeronceAlloc`] is process mode as a global
//! allocator.
//!
//! Index:
//! - building: [`Builder`] (the setters both modes share; [`ProcessBuilder`] and
//!   [`VmBuilder`] add their own), [`BuildError`] (every builder, the pool's too);
//! - allocating: [`PageBlock`], [`BlockError`], [`FreeError`]; a pool's calls:
//!   [`PrezeroError`]; [`Error`] is any of them, for callers that mix them;
//! - [`process`]: [`ProcessMemory`], its host policy ([`DiscardPolicy`], the device's
//!   type) and reporting device;
//! - [`vm`]: [`VmMemory`] and where its device runs;
//! - [`prezero`]: [`HugePagePool`]; [`global`]: [`ZeronceAlloc`];
//! - the building blocks, re-exported: [`zeronce_mm`] (pure allocator and reporting
//!   engine), [`zeronce_mem`] (real memory), [`zeronce_balloon`] (the device) and
//!   [`zeronce_balloon_driver`] (the guest driver).
//!
//! How the pieces fit, and the rules that keep "known zero" true:
//! `docs/ARCHITECTURE.md` in the repository (§3 "The fast path" for the per-thread layer
//! in front of the manager).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Private, bottom up: thread slots (`threads`), a block's words and claimed bytes
// (`words`, `claimed`), the zero-once lifecycle (`zeroing`), the per-thread layer
// (`fastpath`), the handles it serves (`block`), the builders' shared part (`builder`),
// the errors, the host policy, and what both modes build (`managed`).
mod block;
mod builder;
mod claimed;
mod error;
mod fastpath;
mod guest;
mod managed;
mod policy;
mod tails;
mod threads;
mod words;
mod zeroing;

pub mod global;
pub mod prezero;
pub mod process;
pub mod vm;

pub use block::PageBlock;
pub use builder::Builder;
pub use error::{BlockError, BuildError, Error, FreeError, OsError, PrezeroError};
pub use global::{ProcessBackend, ZeronceAlloc};
pub use guest::reports_free_memory_to_host;
pub use prezero::{CancelToken, HugePagePool, PoolPage, PrezeroReport};
pub use process::{
    DeviceStats, DiscardPolicy, ProcessBuilder, ProcessDevice, ProcessMemory, ProcessStats,
    RamZeroer, ReportingSetup, ZeroerConfig, ZeroingStats,
};
pub use vm::{ConnectDevice, DeviceHost, VmBuilder, VmDriver, VmHealth, VmMemory, VmStats};
pub use zeronce_mm::reporting::{BudgetPolicy, PassReport, ReportingConfig};
pub use zeronce_mm::{AllocRequest, Block, Order};
pub use {zeronce_balloon, zeronce_balloon_driver, zeronce_mem, zeronce_mm};
