//! [`ZeronceAlloc`]: process mode as a Rust global allocator.
//!
//! ```no_run
//! use std::alloc::System;
//! use zeronce::{ProcessBackend, ZeronceAlloc};
//!
//! #[global_allocator]
//! static GLOBAL: ZeronceAlloc<System> = ZeronceAlloc::new(System, ProcessBackend::new());
//!
//! let v = vec![0u8; 256 << 20]; // from zeronce: not zeroed again if known zero
//! drop(v); // zeroed in the background, then given back to the kernel
//! ```
//!
//! Allocations of at least [`ProcessBackend::threshold`] bytes (2 MiB by default) come from
//! a [`ProcessMemory`] created at the first of them over a large `MAP_NORESERVE` range
//! (costing nothing until touched), rounded up to a power-of-two block; the rest, and
//! whatever zeronce declines (too large, too aligned, not initialised yet, out of memory),
//! go to the inner allocator. `alloc_zeroed` (`vec![0; n]`, `calloc`) skips zeroing known
//! zero memory, and zeroes only the pages the size covers; the untouched tail of a block
//! is never backed (a resident tail is discarded), so a size that is not a power of two
//! costs its size, not its block. `realloc` grows in place when the upper buddies are
//! free. Freed blocks are zeroed in the background, then reported
//! ([`ReportingSetup::zero_then_report`], by default) or follow a [`DiscardPolicy`].
//!
//! `GlobalAlloc` rules: the `unsafe impl` is `zeronce_mem::global::SplitAlloc`'s (all of
//! zeronce's `unsafe` code lives in zeronce-mem); it never unwinds, never re-enters this
//! backend from one thread (the allocations of the backend's own code, including creating
//! the `ProcessMemory`, go to the inner allocator), and zeronce's own threads (reporting
//! worker, background zeroers) always use the inner allocator.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use zeronce_mem::global::{Grant, LargeAlloc, SplitAlloc};
use zeronce_mem::BackingKind;
use zeronce_mm::sync::lock;
use zeronce_mm::{AllocRequest, Order, MAX_ORDER_LIMIT, PAGE_SIZE};

use crate::block::PageBlock;
use crate::process::is_internal_thread;
use crate::process::{DiscardPolicy, ProcessMemory, ReportingSetup};

/// A global allocator: large allocations from zeronce's process mode, the rest from `A`.
/// See the module docs.
pub type ZeronceAlloc<A> = SplitAlloc<A, ProcessBackend>;

/// Largest block: 1 GiB (order 18). Larger allocations go to the inner allocator.
const MAX_ORDER: u8 = MAX_ORDER_LIMIT;
/// Address space reserved by default: 64 GiB.
const DEFAULT_RANGE: usize = 64 << 30;
/// Alignment every block has (the range starts on a 2 MiB boundary).
const BLOCK_ALIGN: usize = 2 << 20;

const UNINIT: u8 = 0;
const INITIALISING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

/// A live allocation: its block and how many of its pages the size covers.
struct Live {
    block: PageBlock,
    used_pages: u64,
}

struct Arena {
    pm: ProcessMemory,
    live: Mutex<BTreeMap<usize, Live>>,
}

/// The zeronce side of a [`ZeronceAlloc`]: settings, and the [`ProcessMemory`] it creates
/// at the first large allocation.
pub struct ProcessBackend {
    threshold: usize,
    range_bytes: usize,
    /// What the kernel does with reported blocks.
    policy: DiscardPolicy,
    /// The zero-once lifecycle's hold (`None`: blocks are reported without being zeroed
    /// first).
    zero_then_report: Option<Duration>,
    state: AtomicU8,
    arena: OnceLock<Arena>,
    /// The range's first address and length once created (read without a lock by `owns`).
    base: AtomicUsize,
    len: AtomicUsize,
}

impl std::fmt::Debug for ProcessBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessBackend")
            .field("threshold", &self.threshold)
            .field("range_bytes", &self.range_bytes)
            .field("policy", &self.policy)
            .field("zero_then_report", &self.zero_then_report)
            .field("state", &self.state.load(Relaxed))
            .finish()
    }
}

impl Default for ProcessBackend {
    fn default() -> Self {
        ProcessBackend::new()
    }
}

impl ProcessBackend {
    /// Threshold 2 MiB, a 64 GiB range, [`ProcessBackend::zero_then_report`] with a 2 s
    /// hold.
    pub const fn new() -> Self {
        ProcessBackend {
            threshold: 2 << 20,
            range_bytes: DEFAULT_RANGE,
            policy: DiscardPolicy::Immediate,
            zero_then_report: Some(Duration::from_secs(2)),
            state: AtomicU8::new(UNINIT),
            arena: OnceLock::new(),
            base: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
        }
    }

    /// Allocations of at least `bytes` come from zeronce (at least one page).
    pub const fn threshold(mut self, bytes: usize) -> Self {
        self.threshold = if bytes < PAGE_SIZE as usize {
            PAGE_SIZE as usize
        } else {
            bytes
        };
        self
    }

    /// Address space reserved (default 64 GiB, rounded down to 2 MiB). It costs nothing
    /// until used: the range is `MAP_NORESERVE`, and the allocator's metadata (12 bytes
    /// per 4 KiB page, 0.3 %, plus a bit per page) are zeroed allocations whose pages are
    /// backed only once blocks in their part of the range are split or claimed.
    pub const fn range_bytes(mut self, bytes: usize) -> Self {
        self.range_bytes = bytes / BLOCK_ALIGN * BLOCK_ALIGN;
        self
    }

    /// Freed blocks are zeroed in the background and reported (discarded at once) after
    /// staying free for `hold` (the default, with 2 s; see
    /// [`ReportingSetup::zero_then_report`]).
    pub const fn zero_then_report(mut self, hold: Duration) -> Self {
        self.policy = DiscardPolicy::Immediate;
        self.zero_then_report = Some(hold);
        self
    }

    /// Freed blocks are reported after the engine's delay, not zeroed first, and the
    /// kernel treats them with `policy` (instead of [`ProcessBackend::zero_then_report`]).
    pub const fn policy(mut self, policy: DiscardPolicy) -> Self {
        self.policy = policy;
        self.zero_then_report = None;
        self
    }

    /// The process memory, once the first large allocation created it.
    pub fn memory(&self) -> Option<&ProcessMemory> {
        self.arena.get().map(|a| &a.pm)
    }

    fn arena(&self) -> Option<&Arena> {
        match self.state.load(Acquire) {
            READY => self.arena.get(),
            UNINIT
                if self
                    .state
                    .compare_exchange(UNINIT, INITIALISING, AcqRel, Acquire)
                    .is_ok() =>
            {
                self.create()
            }
            // Another thread is creating it (its large allocations meanwhile go to the
            // inner allocator), or creating it failed.
            _ => None,
        }
    }

    fn create(&self) -> Option<&Arena> {
        let built = ProcessMemory::builder()
            .size(self.range_bytes)
            .backing(BackingKind::Anonymous { thp: true })
            .max_order(Order::new(MAX_ORDER).ok()?)
            .reporting(match self.zero_then_report {
                Some(hold) => ReportingSetup::zero_then_report(hold),
                None => ReportingSetup {
                    policy: self.policy,
                    ..ReportingSetup::default()
                },
            })
            .build();
        let pm = match built {
            Ok(pm) => pm,
            Err(e) => {
                tracing::warn!(%e, "zeronce global allocator: not available, using the inner one");
                self.state.store(FAILED, Release);
                return None;
            }
        };
        let (base, len) = (pm.ram().base_addr(), pm.ram().len());
        let arena = self.arena.get_or_init(|| Arena {
            pm,
            live: Mutex::new(BTreeMap::new()),
        });
        self.base.store(base, Release);
        self.len.store(len, Release);
        self.state.store(READY, Release);
        Some(arena)
    }
}

/// The smallest order whose block holds `pages` pages.
fn order_for(pages: u64) -> Option<Order> {
    let order = pages.next_power_of_two().trailing_zeros();
    Order::new(u8::try_from(order).ok()?)
        .ok()
        .filter(|o| o.get() <= MAX_ORDER)
}

impl LargeAlloc for ProcessBackend {
    fn threshold(&self) -> usize {
        self.threshold
    }

    fn alloc(&self, layout: Layout, zeroed: bool) -> Option<Grant> {
        if is_internal_thread() || layout.align() > BLOCK_ALIGN {
            return None;
        }
        let used_pages = (layout.size() as u64).div_ceil(PAGE_SIZE);
        let order = order_for(used_pages)?;
        if layout.align() > order.bytes() as usize {
            return None;
        }
        let arena = self.arena()?;
        let req = AllocRequest { zeroed, hint: None };
        let mut block = arena.pm.alloc_prefix(order, req, used_pages).ok()?;
        let prior = block.allocation().prior;
        if !(prior.known_zero && prior.reported) {
            // The tail may be resident (used before, or zeroed in the background): give
            // its backing back so it is not counted in the working set.
            if let Err(e) = block.discard_tail(used_pages) {
                tracing::warn!(%e, "zeronce global allocator: discarding a tail failed");
            }
        }
        let grant = Grant::of(block.as_mut_slice());
        lock(&arena.live).insert(grant.addr(), Live { block, used_pages });
        Some(grant)
    }

    fn owns(&self, addr: usize) -> bool {
        let base = self.base.load(Acquire);
        base != 0 && addr.wrapping_sub(base) < self.len.load(Acquire)
    }

    fn dealloc(&self, addr: usize) {
        let Some(arena) = self.arena.get() else {
            return;
        };
        let Some(live) = lock(&arena.live).remove(&addr) else {
            tracing::error!(addr, "zeronce global allocator: freeing an unknown address");
            return;
        };
        if let Err(e) = live.block.free_with_zero_tail(live.used_pages) {
            tracing::error!(%e, "zeronce global allocator: free failed");
        }
    }

    fn grow(&self, addr: usize, new_size: usize) -> Option<Grant> {
        let arena = self.arena.get()?;
        let mut table = lock(&arena.live);
        let live = table.get_mut(&addr)?;
        let pages = (new_size as u64).div_ceil(PAGE_SIZE);
        let order = order_for(pages)?;
        if order > live.block.block().order {
            if !live.block.grow_in_place(order) {
                return None;
            }
            // The grown part's backing is whatever it was: no longer an untouched tail.
            live.used_pages = order.pages();
        } else {
            live.used_pages = live.used_pages.max(pages);
        }
        Some(Grant::of(live.block.as_mut_slice()))
    }
}
