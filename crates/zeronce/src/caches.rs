//! [`ThreadCaches`]: the fast path of [`crate::ProcessMemory`] and [`crate::VmMemory`],
//! Linux's per-CPU page lists in user space.
//!
//! A handful of slots (one per CPU the process may run on), each behind its own
//! [`TryLock`] on its own cache line; a thread always uses the same slot (live threads are
//! spread over them). As Linux's `pcp_spin_trylock`, a slot is only ever *tried*: a thread
//! that finds its slot busy (another thread on it, or a drain) goes to the manager for
//! that call instead of waiting, so no thread ever spins or sleeps on a slot. Taking a
//! free slot is one atomic swap and giving it back one plain store.
//!
//! Each slot has two layers:
//! - *kept* blocks: blocks their owners freed dirty, still allocated in the manager and
//!   still claimed, so the next non-zero allocation of that order on the slot takes one
//!   back with no manager call, no claim and no chunk-state change. Orders up to
//!   [`PCP_MAX_ORDER`] and the huge-page order (2 MiB), as Linux keeps orders up to
//!   `PAGE_ALLOC_COSTLY_ORDER` and `pageblock_order` on its per-CPU lists. A kept block
//!   is in use as far as everything else knows: its chunk stays `Used` and its pages
//!   written, so no zeroer touches it and no zero claim is made for it.
//! - a [`PcpCache`]: free blocks of orders up to [`PCP_MAX_ORDER`] taken from and given
//!   back to the zone in batches (the manager's own per-thread cache).
//!
//! Cached and kept blocks are neither mergeable nor reportable, so both are bounded (per
//! slot: the manager's `pcp_batch_pages` per small order kept, [`KEPT_HUGE_BYTES`] of huge
//! blocks, the manager's `pcp_high_pages` per order cached) and both go back to the
//! manager before every reporting pass (see [`ThreadCaches`]'s `ReportingHooks`), when an
//! allocation would otherwise fail, on [`ThreadCaches::drain`] and on drop. A kept block
//! goes back as if its owner had freed it then: its chunks become `Dirty` and the
//! background zeroer is woken. Huge blocks are not kept when a background zeroer runs:
//! there a freed chunk is meant to be zeroed off the allocation path at once.

use std::sync::{Arc, OnceLock};

use try_lock::{Locked, TryLock};
use zeronce_mm::reporting::{Notifier, ReportingHooks, Wanted};
use zeronce_mm::{
    AllocError, AllocRequest, Allocation, Block, FreeError, FreeHint, FreeState, MemoryManager,
    Order, PcpCache, PutBack, PutBackError, Stats, Zeroing, ZoneId, PAGE_SIZE, PCP_MAX_ORDER,
};
use zeronce_types::HUGE_PAGE_2M;

use crate::claimed::ClaimedBytes;
use crate::managed::Lifecycle;
use crate::threads::PerThread;

/// A block its owner freed dirty, kept for the next allocation of its order (see the
/// module docs): allocated in the manager, its bytes claimed.
pub(crate) struct Kept {
    pub(crate) alloc: Allocation,
    pub(crate) bytes: ClaimedBytes,
}

/// The huge-page order: 2 MiB blocks.
const HUGE_ORDER: Order = match Order::new((HUGE_PAGE_2M / PAGE_SIZE as usize).ilog2() as u8) {
    Ok(o) => o,
    Err(_) => panic!("2 MiB is a valid order"),
};

/// Most bytes of huge blocks one slot keeps (at most 1/64 of the memory).
pub(crate) const KEPT_HUGE_BYTES: u64 = 16 << 20;

/// Kept lists per slot: one per order up to [`PCP_MAX_ORDER`], one for [`HUGE_ORDER`].
const KEPT_LISTS: usize = PCP_MAX_ORDER.index() + 2;

/// The kept list of `order`, if blocks of that order are kept.
fn kept_list(order: Order) -> Option<usize> {
    if order <= PCP_MAX_ORDER {
        Some(order.index())
    } else if order == HUGE_ORDER {
        Some(KEPT_LISTS - 1)
    } else {
        None
    }
}

/// The order of kept list `list`.
fn list_order(list: usize) -> Order {
    if list == KEPT_LISTS - 1 {
        HUGE_ORDER
    } else {
        u8::try_from(list)
            .ok()
            .and_then(|o| Order::new(o).ok())
            .unwrap_or(Order::ZERO)
    }
}

/// One CPU's cache and kept blocks.
struct Slot {
    pcp: PcpCache<Arc<MemoryManager>>,
    /// Kept blocks per list, most recently freed last.
    kept: [Vec<Kept>; KEPT_LISTS],
    /// Most blocks kept per list.
    limit: [usize; KEPT_LISTS],
    /// Allocations served from `kept`, and frees into it that have not reached the
    /// manager: the manager does not count them.
    kept_allocs: [u64; KEPT_LISTS],
    kept_frees: [u64; KEPT_LISTS],
    /// Bytes freed into `kept` (the zeroing counters' `freed`).
    kept_freed_bytes: u64,
}

impl Slot {
    fn new(mm: &Arc<MemoryManager>, keep_huge: bool) -> Slot {
        let total = mm.total_pages();
        let small = mm.config().pcp_batch_pages.min(total / 64);
        let huge = if keep_huge && HUGE_ORDER <= mm.config().max_order {
            KEPT_HUGE_BYTES.min(total * PAGE_SIZE / 64) / HUGE_ORDER.bytes()
        } else {
            0
        };
        let fit = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Slot {
            pcp: PcpCache::new(Arc::clone(mm)),
            kept: Default::default(),
            limit: std::array::from_fn(|l| {
                if l == KEPT_LISTS - 1 {
                    fit(huge)
                } else {
                    fit(small >> l).max(1)
                }
            }),
            kept_allocs: [0; KEPT_LISTS],
            kept_frees: [0; KEPT_LISTS],
            kept_freed_bytes: 0,
        }
    }
}

/// Per-thread caches in front of one manager (see the module docs).
pub(crate) struct ThreadCaches {
    slots: PerThread<TryLock<Slot>>,
    mm: Arc<MemoryManager>,
    /// The zero-once lifecycle (process mode): kept blocks going back go through it.
    life: Option<Arc<Lifecycle>>,
    /// Wakes the reporting worker when a block of reporting order or larger is kept (it
    /// would have been notified had the block gone to the zone), with that order.
    report: OnceLock<(Notifier, Order)>,
}

impl ThreadCaches {
    /// One slot per CPU this process may run on, in front of `mm`.
    pub(crate) fn new(mm: &Arc<MemoryManager>, life: Option<Arc<Lifecycle>>) -> Self {
        let keep_huge = life.as_ref().is_none_or(|l| l.zeroer.is_none());
        ThreadCaches {
            slots: PerThread::new(|| TryLock::new(Slot::new(mm, keep_huge))),
            mm: Arc::clone(mm),
            life,
            report: OnceLock::new(),
        }
    }

    /// The manager.
    pub(crate) fn manager(&self) -> &Arc<MemoryManager> {
        &self.mm
    }

    /// Wakes `notifier` when a block of `order` or larger is kept.
    pub(crate) fn set_report_notifier(&self, notifier: Notifier, order: Order) {
        if self.report.set((notifier, order)).is_err() {
            tracing::error!("a second reporting notifier for one cache was ignored");
        }
    }

    /// The calling thread's slot, if no other thread holds it now.
    #[inline]
    fn try_mine(&self) -> Option<Locked<'_, Slot>> {
        self.slots.mine().try_lock()
    }

    /// Allocates from the calling thread's cache (small non-zero requests, its slot free)
    /// or the manager; out of memory, every cache is drained and the manager tried again.
    pub(crate) fn alloc(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<Allocation, AllocError> {
        let cached = !req.zeroed && order <= PCP_MAX_ORDER;
        let first = match self.try_mine().filter(|_| cached) {
            // Nothing to zero: the prefix does not matter.
            Some(mut slot) => slot.pcp.alloc(order, req),
            None => self.mm.alloc_prefix(order, req, used_pages),
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
            if let Some(mut slot) = self.try_mine() {
                return slot.pcp.free(block, hint);
            }
        }
        self.mm.free(block, hint)
    }

    /// A kept block of `order` for the calling thread, if its slot has one.
    #[inline]
    pub(crate) fn take_kept(&self, order: Order) -> Option<Kept> {
        let list = kept_list(order)?;
        let mut slot = self.try_mine()?;
        let kept = slot.kept[list].pop()?;
        slot.kept_allocs[list] += 1;
        Some(kept)
    }

    /// Keeps a block its owner freed dirty on the calling thread's slot; back to the
    /// caller when its order is not kept, the slot keeps enough of it or is busy.
    #[inline]
    pub(crate) fn keep(&self, mut kept: Kept) -> Result<(), Kept> {
        let order = kept.alloc.block.order;
        let Some(list) = kept_list(order) else {
            return Err(kept);
        };
        let Some(mut slot) = self.try_mine() else {
            return Err(kept);
        };
        if slot.kept[list].len() >= slot.limit[list] {
            return Err(kept);
        }
        // What the next owner gets: a dirty block, not zeroed for it (written only when
        // it differs: a block kept before already says so, and a narrow store followed by
        // the wide copies of the move would stall store forwarding).
        if kept.alloc.prior != FreeState::DIRTY || kept.alloc.zeroing != Zeroing::NotRequested {
            kept.alloc.prior = FreeState::DIRTY;
            kept.alloc.zeroing = Zeroing::NotRequested;
        }
        slot.kept[list].push(kept);
        slot.kept_frees[list] += 1;
        slot.kept_freed_bytes += order.bytes();
        drop(slot);
        if let Some((notifier, reporting)) = self.report.get() {
            if order >= *reporting {
                // One atomic load unless the reporting engine is idle.
                notifier.freed(order);
            }
        }
        Ok(())
    }

    /// Gives every kept and cached block back to the manager (waiting for each slot).
    pub(crate) fn drain(&self) {
        for slot in self.slots.iter() {
            let kept: Vec<Kept> = {
                let mut s = lock_slot(slot);
                let s = &mut *s;
                let mut out = Vec::new();
                for (list, blocks) in s.kept.iter_mut().enumerate() {
                    s.kept_frees[list] -= blocks.len() as u64;
                    out.append(blocks);
                }
                s.pcp.drain();
                out
            };
            for k in kept {
                self.give_back(k);
            }
        }
    }

    /// A kept block goes back to the manager as if its owner freed it now.
    fn give_back(&self, mut kept: Kept) {
        let block = kept.alloc.block;
        if let Some(l) = &self.life {
            l.map.freed(block, block.order.pages());
        }
        // The claim goes before the manager may touch the block.
        kept.bytes.release();
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
        for slot in self.slots.iter() {
            let slot = lock_slot(slot);
            for list in 0..KEPT_LISTS {
                let o = list_order(list).index();
                stats.allocs[o] += slot.kept_allocs[list];
                stats.frees[o] += slot.kept_frees[list];
            }
        }
        stats
    }

    /// Bytes freed into kept lists (not counted by the zero map).
    pub(crate) fn kept_freed_bytes(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| lock_slot(s).kept_freed_bytes)
            .sum()
    }
}

impl Drop for ThreadCaches {
    fn drop(&mut self) {
        self.drain();
    }
}

/// Takes `slot`, waiting out its holder (who holds it for one cache operation).
fn lock_slot(slot: &TryLock<Slot>) -> Locked<'_, Slot> {
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
impl ReportingHooks for ThreadCaches {
    fn zone_count(&self) -> usize {
        self.mm.zone_count()
    }
    fn max_order(&self) -> Order {
        self.mm.max_order()
    }
    fn zone_free_pages(&self, zone: ZoneId) -> u64 {
        self.mm.zone_free_pages(zone)
    }
    fn zone_low_watermark(&self, zone: ZoneId) -> u64 {
        self.mm.zone_low_watermark(zone)
    }
    fn nr_free(&self, zone: ZoneId, order: Order) -> u64 {
        ReportingHooks::nr_free(&*self.mm, zone, order)
    }
    fn isolate(
        &self,
        zone: ZoneId,
        order: Order,
        wanted: Wanted,
        max: usize,
        out: &mut Vec<Block>,
    ) {
        self.mm.isolate(zone, order, wanted, max, out);
    }
    fn put_back(&self, block: Block, how: PutBack) -> Result<(), PutBackError> {
        ReportingHooks::put_back(&*self.mm, block, how)
    }
    fn reportable_allocs(&self) -> u64 {
        self.mm.reportable_allocs()
    }
    fn before_pass(&self) {
        self.drain();
    }
}
