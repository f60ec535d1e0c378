//! zeronce-pool: pre-zeroed huge pages for VMMs, as files on a hugetlbfs mount.
//!
//! A VMM whose guest RAM is a hugetlbfs file (QEMU `-object memory-backend-file,
//! mem-path=FILE,share=on`; cloud-hypervisor `--memory-zone file=FILE,shared=on`) waits
//! at start while the kernel zeroes every huge page it faults in. A [`Pool`] keeps N
//! files of size S whose pages are all allocated and zero, so the VMM maps one and runs:
//!
//! * [`Pool::take`] hands out a ready file (or, when none is, zeroes a dirty one on the
//!   request, counted); [`Pool::give_back`] takes it back **dirty**. Over the socket only
//!   its taker may return it (the connection that took it, or the token of the take:
//!   [`Pool::return_file`]), and a file another process still has open or mapped is
//!   held as orphaned, not zeroed, until unused;
//! * zeroing workers ([`WorkerConfig`]: threads, CPU list, nice, bandwidth cap) re-zero
//!   returned files in the background, page by page, stopping between pages at shutdown,
//!   never touching a file a client holds;
//! * pages a client punched out of its file (balloon, free page reporting) come back as
//!   holes: they read zero, so the daemon does not zero them — the kernel repopulates
//!   them ([`PoolCounters::pages_repopulated`], apart from the daemon's own zeroing);
//! * the state file ([`persist`]) records a file as zero only once it is zeroed and
//!   free: after a crash, every file not recorded zero is checked and zeroed again, and a
//!   file recorded held stays its client's until returned;
//! * a take may be a lease on the client's connection ([`Pool::lease`]): if the
//!   connection closes without a return, the file is orphaned — never zeroed while
//!   anyone else still has it open, mapped or in flight in a socket (the daemon's write
//!   lease on the file), reclaimed once nobody has ([`Pool::reclaim_orphans`]);
//! * "zeroable pages appeared" events, rate-limited ([`Pool::subscribe`]).
//!
//! How this fits the rest of zeronce (the huge-page pre-zeroing design, the words used)
//! is in the repository's `docs/ARCHITECTURE.md` and `docs/GLOSSARY.md`.
//!
//! The index:
//! - [`Pool`], started from a [`PoolConfig`] (with its [`WorkerConfig`]; a CPU list
//!   parsed by [`parse_cpu_list`]): take, give back, lease, prezero, [`Stats`], events
//!   ([`ZeroableEvent`]); [`Taken`], [`Served`], [`PrezeroReport`] and [`PoolError`] are
//!   its answers.
//! - [`server::Server`] puts a pool behind a Unix socket speaking the JSON-lines protocol
//!   of [`proto`] (`docs/POOL_PROTOCOL.md`); [`client::Client`] speaks it. The `zeronce
//!   pool` command is a thin layer over both.
//! - [`state`]: the pure pool state ([`PageCounts`], [`PoolCounters`]); [`files`]: the
//!   files on the mount; [`persist`]: the state file.
//!
//! Inside, apart from those: the handle (`daemon`) over the state its threads share
//! (`shared`), the zeroing of jobs on workers or on a requesting thread (`worker`), the
//! bandwidth cap (`pacer`), the events (`events`), the in-use check of a returned or
//! orphaned file (`usage`: a write lease; `/proc` to name a user), one client connection and the bounds on all of them
//! (`connection`, its [`server::Limits`]), the answers to its requests (`requests`), the
//! Prometheus page (`metrics`, [`server::Server::with_metrics`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
mod connection;
mod daemon;
mod events;
pub mod files;
mod metrics;
mod pacer;
pub mod persist;
pub mod proto;
mod requests;
pub mod server;
mod shared;
pub mod state;
mod stats;
mod usage;
mod worker;

pub use daemon::{Pool, PoolConfig, PoolError, PrezeroReport, Returned, Served, Taken};
pub use events::ZeroableEvent;
pub use state::{PageCounts, PoolCounters};
pub use stats::Stats;
pub use usage::FileUser;
pub use worker::{parse_cpu_list, WorkerConfig};
