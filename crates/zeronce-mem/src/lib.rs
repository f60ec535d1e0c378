//! zeronce-mem: real memory, discard operations and zeroing kernels.
#![warn(missing_docs)]
