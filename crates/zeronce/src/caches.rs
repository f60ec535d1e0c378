//! [`ThreadCaches`]: the fast path of [`crate::ProcessMemory`] and [`crate::VmMemory`],
//! Linux's per-CPU page lists in user space.
//!
//! A handful of slots (one per CPU the process may run on); a thread always uses the same
//! slot (live threads are spread over them). As Linux's `pcp_spin_trylock`, a slot is
//! only ever *tried*: a thread that finds its slot busy (another thread on it, or a drain)
//! goes to the manager for that call instead of waiting, so no thread ever spins or sleeps
//! on a slot. Taking a free slot is one atomic swap and giving it back one plain store.
//!
//! Each slot has two layers:
//! - *kept* blocks ([`crate::kept`]): blocks their owners freed dirty, still allocated in
//!   the manager and still claimed, so the next non-zero allocation of that order on the
//!   slot takes one back with no manager call, no claim and no chunk-state change. Orders
//!   up to [`PCP_MAX_ORDER`] and the huge-page order (2 MiB), as Linux keeps orders up to
//!   `PAGE_ALLOC_COSTLY_ORDER` and `pageblock_order` on its per-CPU lists. A kept block
//!   is in use as far as everything else knows: its chunk stays `Used` and its pages
//!   written, so no zeroer touches it and no zero claim is made for it.
//! - a [`PcpCache`]: free blocks of orders up to [`PCP_MAX_ORDER`] taken from and given
//!   back to the zone in batches (the manager's own per-thread cache).
//!
//! Cached and kept blocks are neither mergeable nor reportable, so both are bounded (per
//! slot: the manager's `pcp_batch_pages` per small order kept, [`KEPT_HUGE_BYTES`] of huge
//! blocks, the manager's `pcp_high_pages` per order cached), and both go back to the
//! manager before every reporting pass (see [`ThreadCaches`]'s `ReportingHooks`; keeping
//! a huge block schedules one, as freeing it to the zone could have), when an
//! allocation would otherwise fail, on [`ThreadCaches::drain`] and when the owner closes.
//! A kept block goes back as if its owner had freed it then: its chunks become `Dirty` and
//! the background zeroer is woken. Huge blocks are not kept when a background zeroer
//! runs: there a freed chunk is meant to be zeroed off the allocation path at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

use try_lock::{Locked, TryLock};
use zeronce_mm::reporting::{ManagerHooks, Notifier};
use zeronce_mm::sync::lock;
use zeronce_mm::{
    AllocError, AllocRequest, Allocation, Block, FreeError, FreeHint, MemoryManager, Order,
    PcpCache, Stats, PAGE_SIZE, PCP_MAX_ORDER,
};
use zeronce_types::HUGE_PAGE_2M;

use crate::kept;
use crate::managed::{Held, Lifecycle};
use crate::threads::PerThread;

/// The huge-page order: 2 MiB blocks.
pub(crate) const HUGE_ORDER: Order =
    match Order::new((HUGE_PAGE_2M / PAGE_SIZE as usize).ilog2() as u8) {
        Ok(o) => o,
        Err(_) => panic!("2 MiB is a valid order"),
    };

/// Most bytes of huge blocks one slot keeps (at most 1/64 of the memory).
pub(crate) const KEPT_HUGE_BYTES: u64 = 16 << 20;

/// Counters of one slot's kept blocks of one owner. Written only under that slot's lock of
/// [`crate::kept`]'s lists, so a plain load and store (no read-modify-write) each.
#[derive(Default)]
struct KeptCounters {
    /// Allocations served from a kept list, and frees into one that have not reached the
    /// manager: the manager does not count them.
    allocs: [AtomicU64; kept::LISTS],
    frees: [AtomicU64; kept::LISTS],
    /// Bytes freed into kept lists (the zeroing counters' `freed`).
    freed_bytes: AtomicU64,
}

/// Adds `by` to a counter only one thread writes at a time.
#[inline]
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
}

/// Per-thread caches in front of one manager (see the module docs).
pub(crate) struct ThreadCaches {
    pcp: PerThread<TryLock<PcpCache<Arc<MemoryManager>>>>,
    /// Most blocks kept per slot, per kept list.
    kept_limit: [usize; kept::LISTS],
    /// Counters of the kept blocks, per slot.
    counters: PerThread<KeptCounters>,
    /// Set when the owner's last handle is gone: no block is kept for it any more.
    closed: AtomicBool,
    /// Held while kept blocks go back from the reporting thread, and while closing: the
    /// owner references the reporting thread drops are never the last.
    giving_back: Mutex<()>,
    mm: Arc<MemoryManager>,
    /// The zero-once lifecycle (process mode): kept blocks going back go through it.
    life: Option<Arc<Lifecycle>>,
    /// Wakes the reporting worker when a huge block is kept, with the reporting order.
    report: OnceLock<(Notifier, Order)>,
}

impl ThreadCaches {
    /// One slot per CPU this process may run on, in front of `mm`.
    pub(crate) fn new(mm: &Arc<MemoryManager>, life: Option<Arc<Lifecycle>>) -> Self {
        let total = mm.total_pages();
        let small = mm.config().pcp_batch_pages.min(total / 64);
        let keep_huge =
            life.as_ref().is_none_or(|l| l.zeroer.is_none()) && HUGE_ORDER <= mm.config().max_order;
        let huge = if keep_huge {
            KEPT_HUGE_BYTES.min(total * PAGE_SIZE / 64) / HUGE_ORDER.bytes()
        } else {
            0
        };
        let fit = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        ThreadCaches {
            pcp: PerThread::new(|| TryLock::new(PcpCache::new(Arc::clone(mm)))),
            kept_limit: std::array::from_fn(|list| match kept::list_order(list) {
                o if o == HUGE_ORDER => fit(huge),
                o => fit(small >> o.get()).max(1),
            }),
            counters: PerThread::new(KeptCounters::default),
            closed: AtomicBool::new(false),
            giving_back: Mutex::new(()),
            mm: Arc::clone(mm),
            life,
            report: OnceLock::new(),
        }
    }

    /// The manager.
    pub(crate) fn manager(&self) -> &Arc<MemoryManager> {
        &self.mm
    }

    /// Wakes `notifier`, whose reporting order is `order`, when a huge block is kept.
    pub(crate) fn set_report_notifier(&self, notifier: Notifier, order: Order) {
        if self.report.set((notifier, order)).is_err() {
            tracing::error!("a second reporting notifier for one cache was ignored");
        }
    }

    /// Allocates from the calling thread's cache (small non-zero requests, its slot free)
    /// or the manager; out of memory, every cache is drained and the manager tried again.
    pub(crate) fn alloc(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<Allocation, AllocError> {
        let first = {
            let cached = !req.zeroed && order <= PCP_MAX_ORDER;
            match self.pcp.mine().try_lock().filter(|_| cached) {
                // Nothing to zero: the prefix does not matter.
                Some(mut pcp) => pcp.alloc(order, req),
                None => self.mm.alloc_prefix(order, req, used_pages),
            }
        };
        match first {
            Err(AllocError::OutOfMemory(_)) => {
                self.drain();
                self.mm.alloc_prefix(order, req, used_pages)
            }
            other => other,
        }
    }

    /// Frees into the calling thread's cache (small dirty blocks, its slot free) or to the
    /// manager.
    pub(crate) fn free(&self, block: Block, hint: FreeHint) -> Result<(), FreeError> {
        if hint == FreeHint::Dirty && block.order <= PCP_MAX_ORDER {
            if let Some(mut pcp) = self.pcp.mine().try_lock() {
                return pcp.free(block, hint);
            }
        }
        self.mm.free(block, hint)
    }

    /// Whether the owner's last handle is gone.
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Acquire)
    }

    /// The owner's last handle is gone: its kept blocks go back and none is kept again
    /// (their owner references would keep it alive).
    pub(crate) fn close(&self) {
        let _serial = lock(&self.giving_back);
        self.closed.store(true, Release);
        self.give_back_kept();
    }

    /// Most blocks of kept list `list` per slot.
    #[inline]
    pub(crate) fn kept_limit(&self, list: usize) -> usize {
        self.kept_limit[list]
    }

    /// Number of slots.
    pub(crate) fn slots(&self) -> usize {
        self.counters.len()
    }

    /// Counts an allocation served from slot `slot`'s kept list `list` (under that slot's
    /// kept-list lock).
    #[inline]
    pub(crate) fn count_kept_alloc(&self, slot: usize, list: usize) {
        if let Some(c) = self.counters.get(slot) {
            bump(&c.allocs[list], 1);
        }
    }

    /// Counts a block of `order` kept in slot `slot`'s list `list` (under that lock).
    #[inline]
    pub(crate) fn count_kept_free(&self, slot: usize, list: usize, order: Order) {
        if let Some(c) = self.counters.get(slot) {
            bump(&c.frees[list], 1);
            bump(&c.freed_bytes, order.bytes());
        }
    }

    /// `n` blocks of slot `slot`'s list `list` go back to the manager, which counts their
    /// frees (under that lock).
    pub(crate) fn uncount_kept_frees(&self, slot: usize, list: usize, n: u64) {
        if let Some(c) = self.counters.get(slot) {
            bump(&c.frees[list], n.wrapping_neg());
        }
    }

    /// A huge block was kept: requests a reporting pass (one atomic load unless the
    /// reporting engine is idle), which gives it back first. Whatever the reporting order:
    /// in the zone the block could have merged into a reportable one, and only a pass
    /// gives it back to merge.
    #[inline]
    pub(crate) fn kept_block(&self) {
        if let Some((notifier, reporting)) = self.report.get() {
            notifier.freed(*reporting);
        }
    }

    /// Gives every kept and cached block back to the manager (waiting for each slot). Not
    /// on the reporting thread (see [`ReportingHooks::before_pass`] below).
    pub(crate) fn drain(&self) {
        self.give_back_kept();
        for pcp in self.pcp.iter() {
            lock_slot(pcp).drain();
        }
    }

    /// Gives the kept blocks back to the manager.
    fn give_back_kept(&self) {
        for held in kept::take_all(self) {
            self.give_back(held);
        }
    }

    /// Gives a kept block back to the manager as if its owner freed it now.
    pub(crate) fn give_back(&self, held: Held) {
        let block = held.alloc.block();
        let mut bytes = held.bytes;
        if let Some(l) = &self.life {
            l.map.freed(block, block.order.pages());
        }
        // The claim goes before the manager may touch the block.
        bytes.release();
        match self.mm.free(block, FreeHint::Dirty) {
            Ok(()) => {
                if let Some(l) = &self.life {
                    l.after_free(block, FreeHint::Dirty);
                }
            }
            Err(e) => tracing::error!(%e, %block, "giving a kept block back failed"),
        }
    }

    /// The manager's counters after a [`ThreadCaches::drain`], with the allocations and
    /// frees the kept blocks served added.
    pub(crate) fn stats(&self) -> Stats {
        self.drain();
        let mut stats = self.mm.stats();
        for c in self.counters.iter() {
            for list in 0..kept::LISTS {
                let o = kept::list_order(list).index();
                stats.allocs[o] += c.allocs[list].load(Relaxed);
                stats.frees[o] += c.frees[list].load(Relaxed);
            }
        }
        stats
    }

    /// Bytes freed into kept lists (not counted by the zero map).
    pub(crate) fn kept_freed_bytes(&self) -> u64 {
        self.counters
            .iter()
            .map(|c| c.freed_bytes.load(Relaxed))
            .sum()
    }
}

impl Drop for ThreadCaches {
    fn drop(&mut self) {
        self.drain();
    }
}

/// Takes `slot`, waiting out its holder (who holds it for one cache operation).
pub(crate) fn lock_slot<T>(slot: &TryLock<T>) -> Locked<'_, T> {
    loop {
        if let Some(s) = slot.try_lock() {
            return s;
        }
        std::thread::yield_now();
    }
}

/// The reporting engine's view: the manager, with every cache given back to it before a
/// pass, so blocks freed into a cache are reported like blocks freed to the zone (Linux
/// reports only what reached the buddy lists; its per-CPU lists are small).
impl ManagerHooks for ThreadCaches {
    fn manager(&self) -> &MemoryManager {
        &self.mm
    }
    fn before_pass(&self) {
        // Serialized with `close`: until it has run, the owner's handles hold references,
        // so the kept blocks' references dropped here are not the last (the last would
        // drop the reporter, which joins this very thread).
        let _serial = lock(&self.giving_back);
        if !self.is_closed() {
            self.drain();
        }
    }
}
