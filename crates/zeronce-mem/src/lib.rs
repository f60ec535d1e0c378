//! zeronce-mem: real memory, discard operations and zeroing kernels.
//!
//! All of zeronce's `unsafe` code lives in this crate; every `unsafe` block carries a
//! `// SAFETY:` comment saying why it is sound.
//!
//! Where this crate sits among the others, and the zero guarantee of each discard op per
//! backing: `docs/ARCHITECTURE.md` (§2, §5) in the repository.
//!
//! Index: everything other crates use is re-exported here, and every module is private.
//! Its `unsafe fn`s stay inside: the other crates forbid `unsafe`, so
//! they get safe owners ([`GuestRam`], [`RamRange`]) instead.
#![warn(missing_docs)]
// Frame numbers, byte offsets and lengths cross u64 / usize / u32 here: a silent truncation
// would index the wrong frame or discard the wrong range.
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod biased;
mod claims;
mod discard;
mod global;
mod lease;
mod ram;
mod resident;
mod scan;
mod shared;
mod vm;
mod zeroing;

/// A try-lock its one steady user takes with plain stores (per-CPU slots).
pub use biased::{BiasedGuard, BiasedLock};
/// Discard operations, the backings they act on and what they promise.
pub use discard::{Backing, DiscardError, DiscardOp, ZeroGuarantee, PAGE_SIZE};
/// A global allocator that sends large requests elsewhere.
pub use global::{in_backend, Grant, LargeAlloc, SplitAlloc};
/// Write leases: whether another open file description of a file exists.
pub use lease::{lease_state, release_lease, take_write_lease, LeaseError, LeaseProbe, LeaseState};
/// Guest RAM: a mapping of one backing kind, owned like a `Box<[u8]>`.
pub use ram::{BackingKind, GuestRam, HugePageSize, RamError, RangeError};
/// Readers of what the kernel holds resident.
pub use resident::{
    file_allocated_bytes, peak_rss, HugetlbPoolCounters, ProcessRss, ResidentError,
};
/// Which pages of private anonymous memory may hold data, from the page tables.
pub use scan::ScanError;
/// Guest RAM shared between threads through exclusively claimed ranges.
pub use shared::{ClaimError, RamClaim, RamRange, SharedRam};
/// The vm-memory bridge: a region's backing, and discards of guest ranges.
pub use vm::{
    describe_region, discard_guest_range, populate_guest_range, GuestDiscardError, RegionInfo,
};
/// The zeroing kernels.
pub use zeroing::{cache_resident_limit, ZeroKernel, NON_TEMPORAL_THRESHOLD};
