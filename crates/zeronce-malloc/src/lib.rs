//! `libzeronce.so`: zeronce's process mode for any program, without a rebuild:
//!
//! ```sh
//! LD_PRELOAD=$PWD/target/release/libzeronce.so python3 job.py     # or: zeronce exec -- python3 job.py
//! ```
//!
//! Allocations of at least `ZERONCE_THRESHOLD` bytes (2 MiB by default) come from
//! zeronce's process mode (`zeronce::ProcessBackend`): a `calloc` of a known-zero block
//! writes nothing, a freed block is zeroed in the background and given back to the kernel
//! after the delay, `realloc` grows in place where the buddies are free, and a size that is
//! not a power of two costs its size in RSS, rounded up to 2 MiB (a reused block's resident
//! tail once the allocation has lived for the hold). Everything smaller comes from mimalloc,
//! compiled in (its own symbols are not exported), with thread caches in front of it for
//! blocks one thread frees for another (`ffi/cache.rs`). Settings: [`config`].
//!
//! The C functions are in `ffi.rs` (and its modules) and the library's own Rust allocator
//! in [`inner`], the only modules with `unsafe`; the rest is safe Rust.
//! This library's own Rust allocations (zeronce's tables, its threads) use mimalloc
//! directly, never the exported `malloc`, so they cannot recurse into it.
#![deny(unsafe_code)]

mod classes;
mod commit;
mod config;
mod ffi;
mod inner;
mod routes;
mod runtime;
mod stderr;

/// Rust allocations inside the library: mimalloc (big blocks: mappings of their own),
/// never the exported `malloc`.
#[global_allocator]
static GLOBAL: inner::Inner = inner::Inner;
