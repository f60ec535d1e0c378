//! zeronce-types: the few words every zeronce crate shares, defined once. No
//! dependencies, no `unsafe`. The pure allocator (`zeronce-mm`) and the crate that touches
//! real memory (`zeronce-mem`) both depend on it and re-export what they use, so either
//! crate's users keep their paths.
//!
//! The index:
//! - [`PAGE_SIZE`], [`HUGE_PAGE_2M`], [`HUGE_PAGE_1G`]: the page sizes.
//! - [`ZeroGuarantee`]: whether a range of memory the host took back reads zero.
//! - [`sync`]: how a mutex is locked and a condition variable waited on (recovering from
//!   poisoning).
//! - [`clock`]: how a configured duration becomes a deadline (saturating, never a panic).
//! - [`size`]: how an operator's size (`512M`) is read: one grammar for every command.
//! - [`rate`]: how events are rate-limited without losing one (a trailing event), and how
//!   a flood of log lines is thinned (the first ten, then one at each doubling).
//!
//! Where this crate sits among the others: the repository's `docs/ARCHITECTURE.md` (§2).
#![forbid(unsafe_code)]

pub mod clock;
mod page;
pub mod rate;
pub mod size;
pub mod sync;
mod zero;

pub use page::{HUGE_PAGE_1G, HUGE_PAGE_2M, PAGE_SIZE};
pub use zero::ZeroGuarantee;
