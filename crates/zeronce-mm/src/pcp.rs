//! Per-thread page caches: the Linux per-CPU pageset (`pcp`) fast path, for orders up to
//! [`PCP_MAX_ORDER`] (Linux `PAGE_ALLOC_COSTLY_ORDER`).
//!
//! A [`PcpCache`] belongs to one thread (it is `Send`, not `Sync`). It keeps, per zone and
//! order, a small stack of free blocks taken from the zone in batches under the zone lock;
//! allocations and frees of those orders then touch no lock. State rules stay exact:
//!
//! - Only *dirty* blocks enter a cache (refills take dirty lists only; frees with
//!   [`FreeHint::KnownZero`] go to the zone), so a cache can never spend a known-zero block
//!   on a non-zero request; zero-requests bypass the cache and get the zone's policy.
//!   `reported` is kept per cached block and reported in [`Allocation::prior`].
//! - A cached block is tagged `Cached` in the zone's frame table: it is free (a second free
//!   is a [`FreeError::DoubleFree`]), never merged or isolated, and counted by
//!   [`MemoryManager::check_invariants`] as neither allocated nor on a free list.
//! - A free into the cache changes the frame tag `Allocated → Cached` with one
//!   compare-and-swap, so two racing frees of the same block cannot both succeed.
//! - Counters and the zone's cached-page count are published at batch points (refill,
//!   drain, drop), like Linux's per-CPU vmstat diffs. Dropping the cache drains it.

use crate::error::{AllocError, FreeError};
use crate::manager::{lock, AllocRequest, Allocation, FreeHint, MemoryManager, Zeroing, ZoneSlot};
use crate::types::{Block, FreeState, Order, Pfn, ZoneId};
use crate::zone::tags::Tag;
use std::ops::Deref;
use std::sync::atomic::Ordering::Relaxed;

/// Largest order served by per-thread caches (Linux `PAGE_ALLOC_COSTLY_ORDER`).
pub const PCP_MAX_ORDER: Order = match Order::new(3) {
    Ok(o) => o,
    Err(_) => Order::ZERO,
};

/// Number of cached orders.
const PCP_ORDERS: usize = PCP_MAX_ORDER.index() + 1;

/// A cache list: free blocks of one (zone, order), most recently freed last.
type Stash = Vec<(Pfn, FreeState)>;

/// A per-thread cache in front of a [`MemoryManager`] (see the module docs). `M` is
/// anything that derefs to the manager: `&MemoryManager`, `Arc<MemoryManager>`.
pub struct PcpCache<M: Deref<Target = MemoryManager>> {
    mm: M,
    /// `stash[zone][order]`.
    stash: Vec<[Stash; PCP_ORDERS]>,
    /// Pages in each zone's stashes last published to the zone slot.
    published: Vec<u64>,
    /// Allocations and frees not yet published, per order.
    allocs: [u64; PCP_ORDERS],
    frees: [u64; PCP_ORDERS],
}

impl MemoryManager {
    /// A per-thread cache over this manager (borrowing it).
    pub fn pcp_cache(&self) -> PcpCache<&MemoryManager> {
        PcpCache::new(self)
    }
}

impl<M: Deref<Target = MemoryManager>> PcpCache<M> {
    /// An empty cache over `mm`.
    pub fn new(mm: M) -> Self {
        let zones = mm.zone_count();
        PcpCache {
            stash: (0..zones).map(|_| Default::default()).collect(),
            published: vec![0; zones],
            allocs: [0; PCP_ORDERS],
            frees: [0; PCP_ORDERS],
            mm,
        }
    }

    /// The manager.
    pub fn manager(&self) -> &MemoryManager {
        &self.mm
    }

    /// Blocks per batch and the most a list may hold, for (zone `z`, `order`).
    /// Scaled down for small zones (at most 1/64 resp. 1/16 of the zone, as Linux's
    /// `zone_batchsize` scales with the zone) so a cache cannot hoard a small zone.
    fn limits(&self, z: usize, order: Order) -> (usize, usize) {
        let cfg = self.mm.config();
        let pages = self.mm.zones[z].range.pages;
        let batch = (cfg.pcp_batch_pages.min(pages / 64) >> order.get()).max(1);
        let high = (cfg.pcp_high_pages.min(pages / 16) >> order.get()).max(batch);
        let fit = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        (fit(batch), fit(high))
    }

    /// Like [`MemoryManager::alloc`]; non-zero requests of orders <= [`PCP_MAX_ORDER`] are
    /// served from the cache (refilled from the zone in batches), everything else goes to
    /// the manager. Zones are tried in order: a zone with no dirty block left serves from
    /// its known-zero blocks (as the manager would) before the next zone is tried. Out of
    /// memory with blocks in the cache: the cache is drained and the manager tried again.
    #[inline]
    pub fn alloc(&mut self, order: Order, req: AllocRequest) -> Result<Allocation, AllocError> {
        match self.alloc_once(order, req) {
            Err(AllocError::OutOfMemory(_))
                if self.stash.iter().flatten().any(|l| !l.is_empty()) =>
            {
                // The cache hoards blocks that may merge into one of this order: give them
                // all back and let the zone try again (Linux drains the pcp lists before
                // declaring OOM; other threads' caches are theirs to drain). The failed
                // first attempt stays counted in `alloc_failures`.
                self.drain();
                self.mm.alloc(order, req)
            }
            other => other,
        }
    }

    /// One allocation attempt (see [`PcpCache::alloc`]).
    #[inline]
    fn alloc_once(&mut self, order: Order, req: AllocRequest) -> Result<Allocation, AllocError> {
        if req.zeroed || order > PCP_MAX_ORDER || order > self.mm.config().max_order {
            return self.mm.alloc(order, req);
        }
        let o = order.index();
        for z in 0..self.stash.len() {
            if let Some(a) = self.pop(z, order) {
                return Ok(a);
            }
            let (batch, _) = self.limits(z, order);
            let slot = &self.mm.zones[z];
            let mut zone = lock(slot);
            if zone.take_for_cache(order, batch, &mut self.stash[z][o]) == 0 {
                // No dirty block in this zone: its known-zero blocks, by the zone policy.
                let taken = zone.take(order, crate::zone::Search::DIRTY);
                drop(zone);
                if let Some((block, prior)) = taken {
                    return self
                        .mm
                        .prepare(slot, ZoneId(z), block, prior, req, order.pages());
                }
                continue;
            }
            drop(zone);
            self.publish(z);
            if let Some(a) = self.pop(z, order) {
                return Ok(a);
            }
        }
        self.mm.counters.alloc_failures.fetch_add(1, Relaxed);
        Err(AllocError::OutOfMemory(order))
    }

    /// Hands out the most recently cached block of (zone `z`, `order`).
    #[inline]
    fn pop(&mut self, z: usize, order: Order) -> Option<Allocation> {
        let (pfn, prior) = self.stash[z][order.index()].pop()?;
        let slot = &self.mm.zones[z];
        // Only this cache may touch a cached block: a plain store suffices.
        slot.tags.set(slot.idx(pfn), Tag::Allocated { order });
        self.allocs[order.index()] += 1;
        Some(Allocation {
            block: Block::new(pfn, order),
            zone: ZoneId(z),
            zeroing: Zeroing::NotRequested,
            prior,
        })
    }

    /// Like [`MemoryManager::free`]; dirty frees of orders <= [`PCP_MAX_ORDER`] go to the
    /// cache (a batch goes back to the zone when the list is over its high mark). Any
    /// misuse is reported exactly as by the manager, and changes nothing.
    #[inline]
    pub fn free(&mut self, block: Block, hint: FreeHint) -> Result<(), FreeError> {
        if hint == FreeHint::KnownZero || block.order > PCP_MAX_ORDER {
            return self.mm.free(block, hint);
        }
        let Some(z) = self
            .mm
            .zones
            .iter()
            .position(|s| s.range.contains_range(&block.range()))
        else {
            return self.mm.free(block, hint);
        };
        let slot = &self.mm.zones[z];
        let idx = slot.idx(block.pfn);
        let cached = Tag::Cached {
            order: block.order,
            state: FreeState::DIRTY,
        };
        if !block.is_aligned()
            || slot
                .tags
                .swap_if(idx, Tag::Allocated { order: block.order }, cached)
                .is_err()
        {
            // Not an allocated block of this order: the manager names the error.
            return self.mm.free(block, hint);
        }
        let o = block.order.index();
        self.stash[z][o].push((block.pfn, FreeState::DIRTY));
        self.frees[o] += 1;
        let (batch, high) = self.limits(z, block.order);
        if self.stash[z][o].len() > high {
            self.drain_list(z, block.order, batch);
        }
        Ok(())
    }

    /// Gives the `n` oldest blocks of list (zone `z`, `order`) back to the zone.
    fn drain_list(&mut self, z: usize, order: Order, n: usize) {
        let n = n.min(self.stash[z][order.index()].len());
        if n == 0 {
            return;
        }
        let slot: &ZoneSlot = &self.mm.zones[z];
        let mut reportable = false;
        {
            let mut zone = lock(slot);
            for (pfn, state) in self.stash[z][order.index()].drain(..n) {
                if let Some((merged, m_state)) = zone.return_from_cache(pfn, order, state) {
                    reportable |= self.mm.count_reportable(slot, merged, m_state);
                }
            }
        }
        if reportable {
            self.mm.notify_reportable(slot);
        }
        self.publish(z);
    }

    /// Gives every cached block back to its zone and publishes the counters.
    pub fn drain(&mut self) {
        for z in 0..self.stash.len() {
            for order in Order::ZERO.up_to(PCP_MAX_ORDER) {
                self.drain_list(z, order, usize::MAX);
            }
            // Also when nothing was left to give back: blocks handed out since the last
            // batch point are still counted as cached until published.
            self.publish(z);
        }
    }

    /// Blocks currently cached, with their zone and state (for tests and tools).
    pub fn cached_blocks(&self) -> Vec<(ZoneId, Block, FreeState)> {
        let mut out = Vec::new();
        for (z, lists) in self.stash.iter().enumerate() {
            for (o, list) in lists.iter().enumerate() {
                let order = u8::try_from(o)
                    .ok()
                    .and_then(|o| Order::new(o).ok())
                    .unwrap_or(Order::ZERO);
                out.extend(
                    list.iter()
                        .map(|&(pfn, s)| (ZoneId(z), Block::new(pfn, order), s)),
                );
            }
        }
        out
    }

    /// Publishes zone `z`'s cached-page count and the alloc/free counters.
    fn publish(&mut self, z: usize) {
        let pages: u64 = self.stash[z]
            .iter()
            .enumerate()
            .map(|(o, list)| (list.len() as u64) << o)
            .sum();
        let delta = pages.wrapping_sub(self.published[z]);
        self.mm.zones[z].cached_pages.fetch_add(delta, Relaxed);
        self.published[z] = pages;
        self.flush_counters();
    }

    /// Adds the unpublished alloc/free counts to the manager's.
    fn flush_counters(&mut self) {
        for o in 0..PCP_ORDERS {
            let c = &self.mm.counters;
            c.cached_allocs[o].fetch_add(std::mem::take(&mut self.allocs[o]), Relaxed);
            c.cached_frees[o].fetch_add(std::mem::take(&mut self.frees[o]), Relaxed);
        }
    }
}

impl<M: Deref<Target = MemoryManager>> Drop for PcpCache<M> {
    fn drop(&mut self) {
        self.drain();
    }
}
