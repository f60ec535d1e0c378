//! zeronce-mem: real memory, discard operations and zeroing kernels.
//!
//! All of zeronce's `unsafe` code lives in this crate; every `unsafe` block carries a
//! `// SAFETY:` comment saying why it is sound.
#![warn(missing_docs)]

pub mod discard;
pub mod zeroing;
pub mod vm;

pub use discard::{discard_raw, Backing, DiscardError, DiscardOp, PAGE_SIZE};
