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
//! (costing nothing until touched), rounded up to a power-of-two block at least as large
//! as the alignment (the range starts aligned for its largest block, so every block is
//! aligned to its size); the rest, and whatever zeronce declines (larger than 1 GiB or
//! aligned past it, not initialised yet, out of memory), go to the inner allocator. `alloc_zeroed` (`vec![0; n]`, `calloc`) skips zeroing known
//! zero memory, and zeroes only the pages the size covers; the untouched tail of a block
//! is never backed, and a resident one is given back (in whole huge pages) once the
//! allocation has lived for the hold (see [`crate::tails`]), so a size that is not a power
//! of two costs its size rounded up to 2 MiB, not its block. `realloc` grows in place when the upper buddies are
//! free. Freed blocks are zeroed in the background, then reported
//! ([`ReportingSetup::zero_then_report`], by default) or follow a [`DiscardPolicy`].
//! Live blocks are found by address in one of 64 shards (a hash of the address picks it),
//! never a lock over all of them, so threads freeing large blocks at once rarely meet.
//! A `fork` child never calls the memory manager again (its threads are gone; see
//! [`ProcessBackend::fork_child`]); the `fork_*` methods are for `pthread_atfork`.
//!
//! `GlobalAlloc` rules: the `unsafe impl` is `zeronce_mem::SplitAlloc`'s (all of
//! zeronce's `unsafe` code lives in zeronce-mem); it never unwinds, never re-enters this
//! backend from one thread (the allocations of the backend's own code, including creating
//! the `ProcessMemory`, go to the inner allocator), and zeronce's own threads (reporting
//! worker, background zeroers) always use the inner allocator.

use std::alloc::Layout;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock, RwLockReadGuard};
use std::time::Duration;

use zeronce_mem::BackingKind;
use zeronce_mem::{Grant, LargeAlloc, SplitAlloc};
use zeronce_mm::sync::lock;
use zeronce_mm::{AllocRequest, Order, MAX_ORDER_LIMIT, PAGE_SIZE};

use crate::block::PageBlock;
use crate::process::is_internal_thread;
use crate::process::{DiscardPolicy, ProcessMemory, ReportingSetup};
use crate::tails::{tail_discard_from, Due, TailSweep};
use crate::ZeroerConfig;

mod fork_gate;
use fork_gate::{Closed, ForkGate};

/// A global allocator: large allocations from zeronce's process mode, the rest from `A`.
/// See the module docs.
pub type ZeronceAlloc<A> = SplitAlloc<A, ProcessBackend>;

/// Largest block: 1 GiB (order 18). Larger allocations go to the inner allocator.
const MAX_ORDER: u8 = MAX_ORDER_LIMIT;
/// Address space reserved by default: 64 GiB.
const DEFAULT_RANGE: usize = 64 << 30;
/// What the range's length is rounded down to (a whole number of 2 MiB blocks).
const RANGE_GRAIN: usize = 2 << 20;
/// How long a resident tail of a live block stays when neither a hold nor a reporting
/// delay is set: the reporting engine's default delay.
const DEFAULT_TAIL_HOLD: Duration = Duration::from_secs(2);

const UNINIT: u8 = 0;
const INITIALISING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

/// A live allocation: its block, how many of its pages the size covers, the page from
/// which on it reads zero until freed (never written: known zero, or discarded), and
/// when its resident tail is due to be given back (see [`crate::tails`]).
struct Live {
    block: PageBlock,
    used_pages: u64,
    zero_from: u64,
    tail_due: Option<Due>,
}

impl Live {
    /// Gives back the backing of the tail's whole huge pages; whether there were any.
    fn discard_tail(&mut self) -> bool {
        let from = tail_discard_from(self.used_pages, self.block.block().order);
        match self.block.discard_tail(from) {
            Ok(discarded) => {
                if discarded {
                    self.zero_from = self.zero_from.min(from);
                }
                discarded
            }
            Err(e) => {
                tracing::warn!(%e, "zeronce global allocator: discarding a tail failed");
                false
            }
        }
    }
}

/// Shards of the live-allocation table: a free, grow or size lookup locks one of them,
/// so threads freeing different blocks at once rarely meet.
const SHARDS: usize = 64;

/// One shard, on a cache line of its own.
#[derive(Default)]
#[repr(align(64))]
struct Shard(Mutex<BTreeMap<usize, Live>>);

struct Arena {
    pm: ProcessMemory,
    live: [Shard; SHARDS],
    tails: TailSweep,
}

impl Arena {
    /// The shard of the block at `addr`: a multiplicative hash of its page number, so
    /// blocks of every order (all aligned to their size) spread over the shards.
    fn shard(&self, addr: usize) -> std::sync::MutexGuard<'_, BTreeMap<usize, Live>> {
        let page = (addr as u64) >> PAGE_SIZE.trailing_zeros();
        let i = page.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros());
        lock(&self.live[i as usize % SHARDS].0)
    }

    /// Gives back the resident tails that are due, if any is (see [`crate::tails`]).
    fn sweep_tails(&self) {
        let Some(sweep) = self.tails.begin() else {
            return;
        };
        for shard in &self.live {
            for live in lock(&shard.0).values_mut() {
                if live.tail_due.is_some_and(|due| sweep.is_due(due)) {
                    live.tail_due = None;
                    live.discard_tail();
                }
            }
        }
    }
}

thread_local! {
    /// The fork gates this thread holds for writing between `fork_prepare` and
    /// `fork_parent` / `fork_child`, by backend address (a process may have several).
    static FORK_HELD: RefCell<Vec<(usize, Closed)>> =
        const { RefCell::new(Vec::new()) };
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
    /// The reporting engine's delay, when set (under the zero-once lifecycle, the hold).
    delay: Option<Duration>,
    zeroer: Option<ZeroerConfig>,
    verify: bool,
    /// Freed blocks looked up in the page tables ([`crate::ProcessBuilder::scan_freed`]).
    scan_freed: bool,
    /// Transparent huge pages for the range (`MADV_HUGEPAGE`); `None`: unless the kernel
    /// reports its free memory to a host ([`crate::reports_free_memory_to_host`]).
    thp: Option<bool>,
    state: AtomicU8,
    /// Passed by every large allocation, free and grow; closed across a `fork` (see
    /// [`ProcessBackend::fork_prepare`]).
    gate: ForkGate,
    /// Set in the child of a `fork`: the memory manager's threads did not survive it.
    forked: AtomicBool,
    live_bytes: AtomicU64,
    peak_live_bytes: AtomicU64,
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
    /// The largest allocation a backend serves (1 GiB): larger ones go to the inner
    /// allocator, so a threshold above it sends everything there.
    pub const LARGEST_BYTES: usize = (PAGE_SIZE as usize) << MAX_ORDER;

    /// Threshold 2 MiB, a 64 GiB range, [`ProcessBackend::zero_then_report`] with a 2 s
    /// hold.
    pub const fn new() -> Self {
        ProcessBackend {
            threshold: 2 << 20,
            range_bytes: DEFAULT_RANGE,
            policy: DiscardPolicy::Immediate,
            zero_then_report: Some(Duration::from_secs(2)),
            delay: None,
            zeroer: None,
            verify: false,
            scan_freed: true,
            thp: None,
            state: AtomicU8::new(UNINIT),
            gate: ForkGate::new(),
            forked: AtomicBool::new(false),
            live_bytes: AtomicU64::new(0),
            peak_live_bytes: AtomicU64::new(0),
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
        self.range_bytes = bytes / RANGE_GRAIN * RANGE_GRAIN;
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

    /// The reporting engine's delay after a free (default: the engine's, 2 s; under
    /// [`ProcessBackend::zero_then_report`] the hold is the delay).
    pub const fn reporting_delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Background zeroer threads (default: the process mode's, one thread under
    /// [`ProcessBackend::zero_then_report`]).
    pub const fn zeroer(mut self, config: ZeroerConfig) -> Self {
        self.zeroer = Some(config);
        self
    }

    /// Verify mode: every skipped zeroing and every claim of zero is checked against
    /// memory (slow; for tests).
    pub const fn verify(mut self, on: bool) -> Self {
        self.verify = on;
        self
    }

    /// Whether a freed block of 2 MiB or more is looked up in the page tables, so the
    /// pages its holder never wrote are not zeroed again ([`crate::ProcessBuilder::scan_freed`];
    /// default on).
    pub const fn scan_freed(mut self, on: bool) -> Self {
        self.scan_freed = on;
        self
    }

    /// Transparent huge pages for the range: a block faults in and stays in 2 MiB pages.
    /// Off, in 4 KiB pages. By default on, except on a virtual machine whose kernel
    /// reports its free memory to the host ([`crate::reports_free_memory_to_host`], read
    /// when the range is created): there a huge-page fault of new memory, or of memory
    /// given back seconds before, lands on memory the host took back and costs several
    /// times a small-page fault.
    pub const fn thp(mut self, on: bool) -> Self {
        self.thp = Some(on);
        self
    }

    /// The threshold in bytes.
    pub fn threshold_bytes(&self) -> usize {
        self.threshold
    }

    /// The range's first address and length, once the first large allocation created it
    /// (every block this backend hands out lies in it).
    pub fn range(&self) -> Option<(usize, usize)> {
        let base = self.base.load(Acquire);
        (base != 0).then(|| (base, self.len.load(Acquire)))
    }

    /// The process memory, once the first large allocation created it.
    pub fn memory(&self) -> Option<&ProcessMemory> {
        self.arena.get().map(|a| &a.pm)
    }

    /// Bytes of live large allocations now (their sizes rounded up to pages).
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Relaxed)
    }

    /// The most [`ProcessBackend::live_bytes`] ever was.
    pub fn peak_live_bytes(&self) -> u64 {
        self.peak_live_bytes.load(Relaxed)
    }

    /// Whether this is the child of a `fork` ([`ProcessBackend::fork_child`] ran).
    pub fn is_forked_child(&self) -> bool {
        self.forked.load(Relaxed)
    }

    /// For `pthread_atfork`'s prepare handler, on the forking thread: waits for the large
    /// allocations, frees and grows of other threads in flight and holds new ones off until
    /// [`ProcessBackend::fork_parent`] or [`ProcessBackend::fork_child`], so the child
    /// inherits a consistent table of live blocks.
    pub fn fork_prepare(&'static self) {
        let guard = self.gate.close();
        let me = self as *const Self as usize;
        let _ = FORK_HELD.try_with(|h| h.borrow_mut().push((me, guard)));
    }

    /// For `pthread_atfork`'s parent handler: lets large calls go on.
    pub fn fork_parent(&'static self) {
        let me = self as *const Self as usize;
        let _ = FORK_HELD.try_with(|h| h.borrow_mut().retain(|(b, _)| *b != me));
    }

    /// For `pthread_atfork`'s child handler. The memory manager's threads (reporting,
    /// zeroing) do not exist in the child and its locks may be held by threads that are
    /// gone, so the child never calls it again: large allocations are declined (the inner
    /// allocator serves them), a free of an inherited block only ends its entry (the block
    /// stays in the child's copy of the range until it exits or `exec`s), and grows are
    /// declined (the caller copies).
    pub fn fork_child(&'static self) {
        self.forked.store(true, Relaxed);
        self.fork_parent();
    }

    /// Gives back now what the arena holds in memory that no allocation uses: the resident
    /// tails of live blocks (without waiting for their hold) and every free block (the
    /// per-thread kept ones first), reported at once whatever the delay. Whether anything
    /// went back; `false` before the first large allocation and in a `fork` child (which
    /// never calls the manager). What `malloc_trim` does for large blocks.
    pub fn trim(&self) -> bool {
        let Some(arena) = self.arena.get() else {
            return false;
        };
        let _gate = self.gate();
        if self.is_forked_child() {
            return false;
        }
        let mut tails = false;
        for shard in &arena.live {
            for live in lock(&shard.0).values_mut() {
                if live.tail_due.take().is_some() {
                    tails |= live.discard_tail();
                }
            }
        }
        let pass = arena.pm.flush(u64::MAX);
        tails || pass.stats.pages > 0
    }

    fn gate(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.enter()
    }

    fn count_live(&self, added: u64, removed: u64) {
        if added > removed {
            let now = self.live_bytes.fetch_add(added - removed, Relaxed) + added - removed;
            self.peak_live_bytes.fetch_max(now, Relaxed);
        } else {
            self.live_bytes.fetch_sub(removed - added, Relaxed);
        }
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

    /// The process mode's reporting: the zero-once lifecycle or a discard policy, with
    /// the delay when one was set.
    fn reporting_setup(&self) -> ReportingSetup {
        let mut setup = match self.zero_then_report {
            Some(hold) => ReportingSetup::zero_then_report(hold),
            None => ReportingSetup {
                policy: self.policy,
                ..ReportingSetup::default()
            },
        };
        if let Some(delay) = self.delay {
            setup.config.delay = delay;
        }
        setup
    }

    fn create(&self) -> Option<&Arena> {
        let mut builder = ProcessMemory::builder()
            .size(self.range_bytes)
            .backing(BackingKind::Anonymous {
                thp: self
                    .thp
                    .unwrap_or_else(|| !crate::reports_free_memory_to_host()),
            })
            .max_order(Order::new(MAX_ORDER).ok()?)
            .verify(self.verify)
            .scan_freed(self.scan_freed)
            .reporting(self.reporting_setup());
        if let Some(zeroer) = self.zeroer {
            builder = builder.background_zeroer(zeroer);
        }
        let built = builder.build();
        let pm = match built {
            Ok(pm) => pm,
            Err(e) => {
                tracing::warn!(%e, "zeronce global allocator: not available, using the inner one");
                self.state.store(FAILED, Release);
                return None;
            }
        };
        let (base, len) = (pm.ram().base_addr(), pm.ram().len());
        // Tails are given back after the hold (the reporting delay without one), as the
        // memory would be if it were free.
        let hold = self.zero_then_report.or(self.delay);
        let arena = self.arena.get_or_init(|| Arena {
            pm,
            live: std::array::from_fn(|_| Shard::default()),
            tails: TailSweep::new(hold.unwrap_or(DEFAULT_TAIL_HOLD)),
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
        if is_internal_thread() {
            return None;
        }
        let used_pages = (layout.size() as u64).div_ceil(PAGE_SIZE);
        // The range starts naturally aligned for its largest block, so a block is aligned
        // to its size: one at least as large as the alignment is aligned enough.
        let align_pages = (layout.align() as u64).div_ceil(PAGE_SIZE);
        let order = order_for(used_pages.max(align_pages))?;
        let _gate = self.gate();
        if self.is_forked_child() {
            return None;
        }
        let arena = self.arena()?;
        arena.sweep_tails();
        let req = AllocRequest { zeroed, hint: None };
        let block = arena.pm.alloc_written_prefix(order, req, used_pages).ok()?;
        let prior = block.allocation().prior;
        // Past the size, a known-zero block reads zero; a dirty one only once discarded.
        let zero_from = if prior.known_zero {
            used_pages
        } else {
            order.pages()
        };
        // A tail that may be resident (used before, or zeroed in the background) is given
        // back if the allocation lives for the hold.
        let resident_tail = !(prior.known_zero && prior.reported)
            && tail_discard_from(used_pages, order) < order.pages();
        let tail_due = resident_tail.then(|| arena.tails.due_from_now());
        let mut live = Live {
            block,
            used_pages,
            zero_from,
            tail_due,
        };
        let grant = Grant::of(live.block.as_mut_slice());
        arena.shard(grant.addr()).insert(grant.addr(), live);
        if let Some(due) = tail_due {
            // After the insert: a sweep from here on finds it.
            arena.tails.pending(due);
        }
        self.count_live(used_pages * PAGE_SIZE, 0);
        Some(grant)
    }

    fn owns(&self, addr: usize) -> bool {
        let base = self.base.load(Acquire);
        base != 0 && addr.wrapping_sub(base) < self.len.load(Acquire)
    }

    fn dealloc(&self, addr: usize) -> bool {
        let Some(arena) = self.arena.get() else {
            return false;
        };
        let _gate = self.gate();
        let Some(live) = arena.shard(addr).remove(&addr) else {
            return false;
        };
        self.count_live(0, live.used_pages * PAGE_SIZE);
        if !self.is_forked_child() {
            arena.sweep_tails();
        }
        if self.is_forked_child() {
            // The manager is not to be called in a child (see `fork_child`): the block
            // stays allocated in this copy of the range.
            std::mem::forget(live.block);
        } else if let Err(e) = live.block.free_with_zero_tail(live.zero_from) {
            tracing::error!(%e, "zeronce global allocator: free failed");
        }
        true
    }

    fn usable_size(&self, addr: usize) -> Option<usize> {
        let arena = self.arena.get()?;
        let _gate = self.gate();
        let pages = arena.shard(addr).get(&addr)?.used_pages;
        usize::try_from(pages * PAGE_SIZE).ok()
    }

    fn grow(&self, addr: usize, new_size: usize) -> Option<Grant> {
        let arena = self.arena.get()?;
        let _gate = self.gate();
        if self.is_forked_child() {
            return None;
        }
        let mut table = arena.shard(addr);
        let live = table.get_mut(&addr)?;
        let before = live.used_pages;
        let pages = (new_size as u64).div_ceil(PAGE_SIZE);
        let order = order_for(pages)?;
        if order > live.block.block().order {
            if !live.block.grow_in_place(order) {
                return None;
            }
            // The grown part's backing is whatever it was: no longer an untouched tail.
            live.used_pages = order.pages();
        } else if pages < live.used_pages {
            // A shrink: the caller no longer needs the rest, so its whole huge pages go
            // back at once (glibc's `mremap` of a mapped chunk does the same).
            live.used_pages = pages;
            live.tail_due = None;
            live.discard_tail();
        } else {
            if pages > live.used_pages {
                // The caller may write up to its new size: the map must know.
                live.block.writes_up_to(pages);
            }
            live.used_pages = pages;
        }
        live.zero_from = live.zero_from.max(live.used_pages);
        let grant = Grant::of(live.block.as_mut_slice());
        let after = live.used_pages;
        drop(table);
        self.count_live(after * PAGE_SIZE, before * PAGE_SIZE);
        Some(grant)
    }
}
