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

use std::sync::{Arc, Mutex, MutexGuard};

use zeronce_mm::sync::lock;
use zeronce_mm::{
    AllocError, AllocRequest, Allocation, Block, FreeError, FreeHint, MemoryManager, Order,
    PcpCache, PCP_MAX_ORDER,
};

use crate::threads::PerThread;

/// Per-thread caches in front of one manager (see the module docs).
pub(crate) struct ThreadCaches {
    slots: PerThread<Mutex<PcpCache<Arc<MemoryManager>>>>,
}

impl ThreadCaches {
    /// One cache per CPU this process may run on.
    pub(crate) fn new(mm: &Arc<MemoryManager>) -> Self {
        ThreadCaches {
            slots: PerThread::new(|| Mutex::new(PcpCache::new(Arc::clone(mm)))),
        }
    }

    fn mine(&self) -> MutexGuard<'_, PcpCache<Arc<MemoryManager>>> {
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
            self.mine().alloc(order, req)
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
            self.mine().free(block, hint)
        }
    }

    /// Gives every cached block back to the manager.
    pub(crate) fn drain(&self) {
        for slot in self.slots.iter() {
            lock(slot).drain();
        }
    }
}
