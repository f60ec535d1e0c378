//! zeronce-mm: the guest memory manager core (pure logic, no syscalls).
//!
//! The whole system, and the words used here (known zero, reported, hold, settle,
//! budget...), are described in the repository's `docs/ARCHITECTURE.md` and
//! `docs/GLOSSARY.md`.
//!
//! A [`MemoryManager`] is a set of buddy zones (Linux `mm/page_alloc.c`) over a range of
//! 4 KiB page frames whose free blocks carry two facts, [`FreeState::known_zero`] and
//! [`FreeState::reported`], kept truthful through every operation (docs/ARCHITECTURE.md §3):
//!
//! | event | effect |
//! |---|---|
//! | free by owner | dirty + unreported ([`FreeHint::KnownZero`]: known zero + unreported) |
//! | merge of buddies | known_zero = a ∧ b, reported = a ∧ b; merging is eager and never refused because of state |
//! | split | both halves inherit |
//! | put back after report | `Zeroed`: reported + known zero; `NotZeroed`: reported, known_zero unchanged; `Error`: unchanged (unreported) |
//! | zero-request | zeroing skipped iff the block is known zero, else [`Zeroer::zero`] with the hint page last |
//! | other request | state dropped |
//!
//! **Search policy** ([`MemoryManager::alloc`]): zones are tried in configuration order
//! (zone fallback list); in a zone, resident (unreported) blocks are taken before reported
//! ones — the first touch of a reported block faults it back in and the host zeroes it,
//! which costs more than zeroing resident memory (Linux takes reported pages last too).
//! Within each, a zero-request takes a known-zero block at the smallest order ≥ the
//! requested one that has any (splitting a bigger known-zero block rather than zeroing a
//! dirty block of the exact order), else the smallest dirty block; any other request does
//! the mirror image (dirty first, so known-zero blocks are saved for zero-requests). So a
//! zero-request goes: zero, dirty, reported zero, reported dirty — or, when the host keeps
//! reported blocks it did not promise zero resident ([`ReportedNotZero::Resident`]: a hold,
//! `MADV_FREE`), zero, dirty, reported dirty, reported zero: a memset without a fault
//! beats faulting fresh pages in. Each step is O(1): one
//! list per (order, state) and a bitmask of non-empty orders per state.
//!
//! **Verify mode** ([`MmConfig::verify`]): every skipped zeroing and every claim of zero
//! (free with `KnownZero`, verdict `Zeroed`, [`MemoryManager::mark_known_zero`]) is
//! checked with [`Zeroer::is_zero`]; a false claim returns a `VerifyFailed` error, the
//! block is never handed out as zero and its state is corrected to not known zero.
//!
//! Metadata lives in a frame table beside the pages, never in them. Reporting engine
//! primitives: [`MemoryManager::isolate_unreported`],
//! [`MemoryManager::isolate_reported_not_zero`], [`MemoryManager::put_back`],
//! [`MemoryManager::zone_info`], [`MemoryManager::nr_free`],
//! [`MemoryManager::reportable_generation`], [`MemoryManager::set_report_notifier`],
//! [`MemoryManager::mark_known_zero`].
//!
//! **Fast path**: [`PcpCache`] is a per-thread cache for orders ≤ [`PCP_MAX_ORDER`]
//! (Linux's per-CPU page lists): no lock per call, only dirty blocks cached, double frees
//! caught by an atomic compare-and-swap on the frame tag. Threads that allocate small
//! blocks often should each hold one.
//!
//! **Invariants** ([`MemoryManager::check_invariants`]): allocated + free + isolated +
//! cached = total; every frame in exactly one aligned block; free lists, counters and
//! tags consistent; no two free buddies of equal order left unmerged.
//!
//! **Index**: the manager and its vocabulary are re-exported here; the two subsystems
//! built on it are modules with their own short index: [`reporting`] (the engine, its
//! worker thread and the device it reports to) and [`hugepool`] (the huge-page pool's
//! state and its "zeroable" events). Every other module is private. The Cargo feature
//! `test-utils` adds `mock`: a configurable reporting device for tests.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Frame numbers, byte offsets and lengths cross u64 / usize / u32 here: a silent truncation
// would index the wrong frame or discard the wrong range.
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod error;
mod manager;
mod pcp;
mod stats;
mod types;
mod zeroing;
mod zone;

pub mod hugepool;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
pub mod reporting;

/// Poison-tolerant locking, defined in `zeronce-types` for every crate.
pub use zeronce_types::sync;

/// Typed errors of the manager's calls.
pub use error::{AllocError, ConfigError, FreeError, InvariantViolation, MarkError, PutBackError};
/// The manager, what it is asked for and what it hands out.
pub use manager::{
    AllocRequest, Allocation, FreeHint, MemoryManager, MmConfig, PutBack, ReportNotifier,
    ZeroGuarantee, Zeroing,
};
/// The per-thread cache of small blocks.
pub use pcp::{PcpCache, PCP_MAX_ORDER};
/// Counters and the free-list census.
pub use stats::{FreeCounts, Stats, ZoneInfo};
/// Frames, orders, blocks and their free states.
pub use types::{
    Block, FreeState, Order, OrderError, PageRange, Pfn, ZoneId, DEFAULT_MAX_ORDER,
    DEFAULT_REPORTING_ORDER, MAX_ORDER_LIMIT, NR_ORDERS, PAGE_SIZE,
};
/// Who zeroes a block handed out on a zero-request.
pub use zeroing::{hint_last_order, NoopZeroer, Zeroer};
/// Blocks isolated for reporting, and where reported dirty blocks live.
pub use zone::{IsolatedBlock, ReportedNotZero};
