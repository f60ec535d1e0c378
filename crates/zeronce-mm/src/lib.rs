//! zeronce-mm: the guest memory manager core (pure logic, no syscalls).
#![forbid(unsafe_code)]
#![warn(missing_docs)]
