//! zeronce-mem: real memory, discard operations and zeroing kernels.
//!
//! All of zeronce's `unsafe` code lives in this crate; every `unsafe` block carries a
//! `// SAFETY:` comment saying why it is sound.
//!
//! Where this crate sits among the others, and the zero guarantee of each discard op per
//! backing: `docs/ARCHITECTURE.md` (§2, §5) in the repository.
#![warn(missing_docs)]
// Frame numbers, byte offsets and lengths cross u64 / usize / u32 here: a silent truncation
// would index the wrong frame or discard the wrong range.
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod claims;
pub mod discard;
pub mod global;
pub mod ram;
pub mod resident;
pub mod shared;
pub mod vm;
pub mod zeroing;

pub use discard::{discard_raw, Backing, DiscardError, DiscardOp, ZeroGuarantee, PAGE_SIZE};
pub use ram::{BackingKind, GuestRam, HugePageSize, RamError, RangeError};
pub use resident::{HugetlbPoolCounters, ProcessRss, ResidentError};
pub use shared::{ClaimError, RamRange, SharedRam};
pub use zeroing::{zero_range, zero_range_hinted, ZeroKernel};
