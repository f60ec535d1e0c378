//! [`ThreadCaches`]: the small-order fast path of [`crate::ProcessMemory`] and
//! [`crate::VmMemory`], Linux's per-CPU page lists in user space.
//!
//! A handful of [`PcpCache`]s (one per CPU the process may run on), each behind its own
//! lock on its own cache line; a thread always uses the same one (live threads are spread
//! over them). Non-zero allocations and dirty frees of orders up to
//! [`PCP_MAX_ORDER`] take no shared lock, so threads do not contend, as Linux's
//! `pcp->lock`, which is a per-CPU spinlock taken with a trylock. Everything else goes to
//! the manager.
//!
//! Cached blocks are free but neither mergeable nor reportable (Linux's pcp pages are not
//! reported either); each cache holds at most the manager's `pcp_high_pages` per order.
//! They go back to the zone when an allocation would otherwise fail, on
//! [`ThreadCaches::drain`] (before a flush reports everything) and on drop.
//!
//! In front of each cache, a few blocks its threads freed dirty are *kept*: still
//! allocated in the manager and still claimed, so the next allocation of that order on the
//! slot takes one back without claiming its bytes again or retagging it (at most one
//! cache batch of pages per order; only blocks smaller than a zero-map chunk, so no chunk
//! state changes). They count as freed and allocated in [`ThreadCaches::stats`], and go
//! back to the manager with the cached blocks.

use std::sync::{Arc, Mutex, MutexGuard};

use zeronce_mm::sync::lock;
use zeronce_mm::{
    AllocError, AllocRequest, Allocation, Block, FreeError, FreeHint, FreeState, MemoryManager,
    Order, PcpCache, Stats, Zeroing, PCP_MAX_ORDER,
};

use crate::claimed::ClaimedBytes;
use crate::threads::PerThread;

/// A block its owner freed dirty, kept for the next allocation of its order (see the
/// module docs): allocated in the manager, its bytes claimed.
pub(crate) struct Kept {
    pub(crate) alloc: Allocation,
    pub(crate) bytes: ClaimedBytes,
}

/// Orders blocks are kept of: those the caches serve.
const KEPT_ORDERS: usize = PCP_MAX_ORDER.index() + 1;

/// One CPU's cache and kept blocks.
struct Slot {
    pcp: PcpCache<Arc<MemoryManager>>,
    /// Kept blocks per order, most recently freed last.
    kept: [Vec<Kept>; KEPT_ORDERS],
    /// Most blocks kept per order.
    limit: [usize; KEPT_ORDERS],
    /// Allocations served from `kept`, and frees into it that have not reached the
    /// manager: the manager does not count them.
    kept_allocs: [u64; KEPT_ORDERS],
    kept_frees: [u64; KEPT_ORDERS],
}

impl Slot {
    fn new(mm: &Arc<MemoryManager>) -> Slot {
        let pages = mm.config().pcp_batch_pages.min(mm.total_pages() / 64);
        Slot {
            pcp: PcpCache::new(Arc::clone(mm)),
            kept: Default::default(),
            limit: std::array::from_fn(|o| usize::try_from(pages >> o).unwrap_or(1).max(1)),
            kept_allocs: [0; KEPT_ORDERS],
            kept_frees: [0; KEPT_ORDERS],
        }
    }

    /// Gives the kept blocks to the cache, then every cached block to the manager.
    fn drain(&mut self) {
        for (o, list) in self.kept.iter_mut().enumerate() {
            for mut k in list.drain(..) {
                // The claim goes before the manager may touch the block.
                k.bytes.release();
                self.kept_frees[o] -= 1;
                if let Err(e) = self.pcp.free(k.alloc.block, FreeHint::Dirty) {
                    tracing::error!(%e, "giving a kept block back failed");
                }
            }
        }
        self.pcp.drain();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.drain();
    }
}

/// Per-thread caches in front of one manager (see the module docs).
pub(crate) struct ThreadCaches {
    slots: PerThread<Mutex<Slot>>,
}

impl ThreadCaches {
    /// One cache per CPU this process may run on.
    pub(crate) fn new(mm: &Arc<MemoryManager>) -> Self {
        ThreadCaches {
            slots: PerThread::new(|| Mutex::new(Slot::new(mm))),
        }
    }

    fn mine(&self) -> MutexGuard<'_, Slot> {
        lock(self.slots.mine())
    }

    /// Allocates from the calling thread's cache (small non-zero requests) or the
    /// manager; out of memory, every cache is drained and the manager tried again.
    pub(crate) fn alloc(
        &self,
        mm: &MemoryManager,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<Allocation, AllocError> {
        let first = if req.zeroed || order > PCP_MAX_ORDER {
            mm.alloc_prefix(order, req, used_pages)
        } else {
            // Nothing to zero: the prefix does not matter.
            self.mine().pcp.alloc(order, req)
        };
        match first {
            Err(AllocError::OutOfMemory(_)) => {
                self.drain();
                mm.alloc_prefix(order, req, used_pages)
            }
            other => other,
        }
    }

    /// Frees into the calling thread's cache (small dirty blocks) or to the manager.
    pub(crate) fn free(
        &self,
        mm: &MemoryManager,
        block: Block,
        hint: FreeHint,
    ) -> Result<(), FreeError> {
        if hint == FreeHint::KnownZero || block.order > PCP_MAX_ORDER {
            mm.free(block, hint)
        } else {
            self.mine().pcp.free(block, hint)
        }
    }

    /// A kept block of `order` for the calling thread, if its slot has one.
    pub(crate) fn take_kept(&self, order: Order) -> Option<Kept> {
        if order > PCP_MAX_ORDER {
            return None;
        }
        let mut slot = self.mine();
        let kept = slot.kept[order.index()].pop()?;
        slot.kept_allocs[order.index()] += 1;
        Some(kept)
    }

    /// Keeps a block its owner freed dirty (of an order the caches serve, smaller than a
    /// zero-map chunk) on the calling thread's slot; back to the caller when the slot
    /// keeps enough of that order.
    pub(crate) fn keep(&self, mut kept: Kept) -> Result<(), Kept> {
        let order = kept.alloc.block.order;
        if order > PCP_MAX_ORDER {
            return Err(kept);
        }
        let o = order.index();
        let mut slot = self.mine();
        if slot.kept[o].len() >= slot.limit[o] {
            return Err(kept);
        }
        // What the next owner gets: a dirty block, not zeroed for it.
        kept.alloc.prior = FreeState::DIRTY;
        kept.alloc.zeroing = Zeroing::NotRequested;
        slot.kept[o].push(kept);
        slot.kept_frees[o] += 1;
        Ok(())
    }

    /// Gives every kept and cached block back to the manager.
    pub(crate) fn drain(&self) {
        for slot in self.slots.iter() {
            lock(slot).drain();
        }
    }

    /// The manager's counters after a [`ThreadCaches::drain`], with the allocations and
    /// frees the kept blocks served added.
    pub(crate) fn stats(&self, mm: &MemoryManager) -> Stats {
        self.drain();
        let mut stats = mm.stats();
        for slot in self.slots.iter() {
            let slot = lock(slot);
            for o in 0..KEPT_ORDERS {
                stats.allocs[o] += slot.kept_allocs[o];
                stats.frees[o] += slot.kept_frees[o];
            }
        }
        stats
    }
}
