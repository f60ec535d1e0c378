//! The huge-page pool and its pre-zeroing bookkeeping (docs/ARCHITECTURE.md §6; the hugetlb pre-zeroing series'
//! `zeroable_hugepages`, the "skip redundant zeroing" series' `HPG_zeroed`). Pure state: no syscalls, no
//! zeroing — it says *which* page to zero and *whether*; the effect layer does it.
//!
//! A [`HugePool`] holds pages of one order (9 = 2 MiB, 18 = 1 GiB) per node over PFN
//! ranges added with [`HugePool::add_range`] (hugetlbfs-like backing, apart from the buddy
//! allocator). Each page is in exactly one [`PageState`]:
//!
//! | event | state after |
//! |---|---|
//! | added known zero / dirty | `Free { known_zero: true }` / `Free { known_zero: false }` |
//! | freed by its user ([`FreeHint::Dirty`]) | `Free { known_zero: false }` (HPG_zeroed cleared) |
//! | freed with [`FreeHint::KnownZero`] | `Free { known_zero: true }` |
//! | taken by a zeroer ([`HugePool::take_zeroable`]) | `Zeroing` — cannot be allocated |
//! | [`HugePool::finish_zeroing`] ok / failed | `Free { known_zero: true }` / `Free { known_zero: false }` |
//! | allocated | `InUse` |
//!
//! **Zeroable** = free pages not known zero: a page the host (or anyone) already zeroed is
//! no work. **Allocation** ([`HugePool::alloc`]): a zero-request takes a known-zero page
//! (no write) and only if there is none a dirty one, which the caller must zero inline
//! ([`PoolZeroing::Required`], counted); any other request prefers dirty pages, saving
//! known-zero ones for zero-requests. Dirty pages are a deque: frees push at the back,
//! non-zero requests take the back (most recently freed, likely cache-hot), the zeroer
//! takes the front (oldest, coldest).
//!
//! **Notification** ([`HugePool::set_event_hook`]): an [`EventHook`] is called when a
//! node's zeroable count grows, rate-limited per node by an injected [`Clock`] with a
//! trailing event (see `events`).

mod check;
mod events;
mod types;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

pub use events::{Clock, EventHook, ManualClock, Notifier, ZeroableEvent};
pub use types::{
    HugePage, HugePoolError, PageState, PoolAllocation, PoolCounters, PoolCounts, PoolZeroing,
    ZeroingTicket,
};

use crate::manager::FreeHint;
use crate::types::{Order, PageRange, Pfn, ZoneId};

/// One page's record.
#[derive(Clone, Copy, Debug)]
struct Slot {
    page: HugePage,
    state: PageState,
}

/// Free lists and counts of one node. Lists hold slot indices; every state change pops
/// from or pushes to them, so they never hold stale entries.
#[derive(Clone, Debug, Default)]
struct Node {
    known_zero: Vec<u32>,
    dirty: VecDeque<u32>,
    in_use: u64,
    zeroing: u64,
}

/// The huge-page pool; see the module docs.
pub struct HugePool {
    order: Order,
    slots: Vec<Slot>,
    by_pfn: HashMap<Pfn, u32>,
    nodes: Vec<Node>,
    counters: PoolCounters,
    notifier: Option<Notifier>,
}

impl std::fmt::Debug for HugePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugePool")
            .field("order", &self.order)
            .field("counts", &self.counts())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl HugePool {
    /// An empty pool of pages of `order`.
    pub fn new(order: Order) -> HugePool {
        HugePool {
            order,
            slots: Vec::new(),
            by_pfn: HashMap::new(),
            nodes: Vec::new(),
            counters: PoolCounters::default(),
            notifier: None,
        }
    }

    /// The pool's page order.
    pub fn order(&self) -> Order {
        self.order
    }

    /// Calls `hook` when a node's zeroable count grows, at most once per `min_interval` of
    /// `clock` per node, with trailing events (fired by [`HugePool::poll_events`]).
    pub fn set_event_hook(
        &mut self,
        hook: EventHook,
        clock: Arc<dyn Clock>,
        min_interval: Duration,
    ) {
        self.notifier = Some(Notifier::new(hook, clock, min_interval));
    }

    /// Fires the held-back events that are due; returns when the next one will be (call
    /// again then), `None` if none is pending.
    pub fn poll_events(&mut self) -> Option<Duration> {
        let mut notifier = self.notifier.take()?;
        let next = notifier.poll(|node| self.zeroable(node));
        self.notifier = Some(notifier);
        next
    }

    /// When the next held-back event is due (`None`: none pending).
    pub fn next_event_deadline(&self) -> Option<Duration> {
        self.notifier.as_ref().and_then(Notifier::next_deadline)
    }

    /// The hook's clock (`None` without a hook).
    pub fn clock_now(&self) -> Option<Duration> {
        self.notifier.as_ref().map(Notifier::now)
    }

    fn node_mut(&mut self, node: ZoneId) -> &mut Node {
        if self.nodes.len() <= node.0 {
            self.nodes.resize(node.0 + 1, Node::default());
        }
        &mut self.nodes[node.0]
    }

    /// Records a new page, free in the given state.
    fn insert(&mut self, page: HugePage, known_zero: bool) -> Result<(), HugePoolError> {
        if self.by_pfn.contains_key(&page.pfn) {
            return Err(HugePoolError::AlreadyInPool(page.pfn));
        }
        let slot = Slot {
            page,
            state: PageState::Free { known_zero },
        };
        let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 pool pages");
        self.slots.push(slot);
        self.by_pfn.insert(page.pfn, index);
        self.push_free(page.node, index, known_zero);
        Ok(())
    }

    fn push_free(&mut self, node: ZoneId, index: u32, known_zero: bool) {
        let n = self.node_mut(node);
        if known_zero {
            n.known_zero.push(index);
        } else {
            n.dirty.push_back(index);
        }
    }

    /// The zeroable count of `node` grew.
    fn zeroable_grew(&mut self, node: ZoneId) {
        let zeroable = self.zeroable(node);
        if let Some(notifier) = self.notifier.as_mut() {
            notifier.grew(node, zeroable);
        }
    }

    /// Adds every page of `range` (aligned to the pool's order) on `node`, free, known zero
    /// or not (fresh untouched memory reads zero). All or nothing.
    pub fn add_range(
        &mut self,
        node: ZoneId,
        range: PageRange,
        known_zero: bool,
    ) -> Result<u64, HugePoolError> {
        let unaligned = HugePoolError::Unaligned {
            range,
            order: self.order,
        };
        if range.pages == 0
            || !range.start.is_aligned(self.order)
            || !range.pages.is_multiple_of(self.order.pages())
        {
            return Err(unaligned);
        }
        let count = range.pages / self.order.pages();
        let order = self.order;
        let pages = (0..count).map(|i| HugePage {
            pfn: Pfn(range.start.0 + i * order.pages()),
            order,
            node,
        });
        if let Some(p) = pages.clone().find(|p| self.by_pfn.contains_key(&p.pfn)) {
            return Err(HugePoolError::AlreadyInPool(p.pfn));
        }
        for page in pages {
            self.insert(page, known_zero)?;
        }
        if !known_zero {
            self.zeroable_grew(node);
        }
        Ok(count)
    }

    /// Allocates a page on `node` (or any node, known-zero pages of every node first for a
    /// zero-request). See the module docs for the preference; the caller must zero the
    /// page when told [`PoolZeroing::Required`].
    pub fn alloc(
        &mut self,
        node: Option<ZoneId>,
        zeroed: bool,
    ) -> Result<PoolAllocation, HugePoolError> {
        let nodes: Vec<usize> = match node {
            Some(n) => vec![n.0],
            None => (0..self.nodes.len()).collect(),
        };
        let order = if zeroed { [true, false] } else { [false, true] };
        let found = order.into_iter().find_map(|known_zero| {
            nodes.iter().find_map(|&n| {
                let list = self.nodes.get_mut(n)?;
                let index = if known_zero {
                    list.known_zero.pop()
                } else {
                    list.dirty.pop_back()
                }?;
                Some((index, known_zero))
            })
        });
        let Some((index, known_zero)) = found else {
            self.counters.alloc_failures += 1;
            let zeroing = nodes
                .iter()
                .filter_map(|&n| self.nodes.get(n))
                .map(|n| n.zeroing)
                .sum();
            return Err(HugePoolError::Exhausted { node, zeroing });
        };
        let slot = &mut self.slots[index as usize];
        slot.state = PageState::InUse;
        let page = slot.page;
        self.node_mut(page.node).in_use += 1;
        self.counters.allocs += 1;
        let zeroing = match (zeroed, known_zero) {
            (false, _) => PoolZeroing::NotRequested,
            (true, true) => {
                self.counters.allocs_prezeroed += 1;
                PoolZeroing::Skipped
            }
            (true, false) => {
                self.counters.allocs_zeroed_inline += 1;
                PoolZeroing::Required
            }
        };
        Ok(PoolAllocation { page, zeroing })
    }

    /// Looks `page` up, checking it is this pool's page with this order and node.
    fn index_of(&self, page: HugePage) -> Result<u32, HugePoolError> {
        let index = *self
            .by_pfn
            .get(&page.pfn)
            .ok_or(HugePoolError::ForeignPage(page))?;
        if self.slots[index as usize].page == page {
            Ok(index)
        } else {
            Err(HugePoolError::ForeignPage(page))
        }
    }

    /// Gives an allocated page back: dirty (HPG_zeroed cleared), or known zero with
    /// [`FreeHint::KnownZero`] when the caller knows it reads zero.
    pub fn free(&mut self, page: HugePage, hint: FreeHint) -> Result<(), HugePoolError> {
        let index = self.index_of(page)?;
        let slot = &mut self.slots[index as usize];
        match slot.state {
            PageState::InUse => {}
            PageState::Free { .. } => return Err(HugePoolError::DoubleFree(page)),
            PageState::Zeroing => return Err(HugePoolError::BeingZeroed(page)),
        }
        let known_zero = hint == FreeHint::KnownZero;
        slot.state = PageState::Free { known_zero };
        self.node_mut(page.node).in_use -= 1;
        self.push_free(page.node, index, known_zero);
        self.counters.frees += 1;
        if !known_zero {
            self.zeroable_grew(page.node);
        }
        Ok(())
    }

    /// Free pages of `node` not known zero: the work a pre-zeroer can do there.
    pub fn zeroable(&self, node: ZoneId) -> u64 {
        self.nodes.get(node.0).map_or(0, |n| n.dirty.len() as u64)
    }

    /// Zeroable pages of every node.
    pub fn zeroable_total(&self) -> u64 {
        self.nodes.iter().map(|n| n.dirty.len() as u64).sum()
    }

    /// Hands up to `max` zeroable pages of `node` (oldest freed first) to a zeroer; they
    /// cannot be allocated until [`HugePool::finish_zeroing`].
    pub fn take_zeroable(&mut self, node: ZoneId, max: u64) -> Vec<ZeroingTicket> {
        let Some(n) = self.nodes.get_mut(node.0) else {
            return Vec::new();
        };
        let take = usize::try_from(max).map_or(n.dirty.len(), |m| m.min(n.dirty.len()));
        let indices: Vec<u32> = n.dirty.drain(..take).collect();
        n.zeroing += take as u64;
        indices
            .into_iter()
            .map(|i| {
                let slot = &mut self.slots[i as usize];
                slot.state = PageState::Zeroing;
                ZeroingTicket { page: slot.page }
            })
            .collect()
    }

    /// Puts a page back from its zeroer: known zero if `zeroed`, else dirty again
    /// (cancelled / failed; it is zeroable again).
    pub fn finish_zeroing(
        &mut self,
        ticket: ZeroingTicket,
        zeroed: bool,
    ) -> Result<(), HugePoolError> {
        let page = ticket.page;
        let index = self.index_of(page)?;
        let slot = &mut self.slots[index as usize];
        if slot.state != PageState::Zeroing {
            return Err(HugePoolError::NotZeroing(page));
        }
        slot.state = PageState::Free { known_zero: zeroed };
        self.node_mut(page.node).zeroing -= 1;
        if zeroed {
            self.counters.pages_prezeroed += 1;
            self.node_mut(page.node).known_zero.push(index);
        } else {
            self.counters.zeroing_aborted += 1;
            // Back at the front: it was the oldest, and stays first in line.
            self.node_mut(page.node).dirty.push_front(index);
            self.zeroable_grew(page.node);
        }
        Ok(())
    }

    /// The state of the page starting at `pfn` (`None`: not a page of this pool).
    pub fn state_of(&self, pfn: Pfn) -> Option<(HugePage, PageState)> {
        let index = *self.by_pfn.get(&pfn)?;
        let s = self.slots[index as usize];
        Some((s.page, s.state))
    }

    /// Page counts of `node`.
    pub(crate) fn node_counts(&self, node: ZoneId) -> PoolCounts {
        self.nodes
            .get(node.0)
            .map_or_else(PoolCounts::default, |n| PoolCounts {
                free_zero: n.known_zero.len() as u64,
                zeroable: n.dirty.len() as u64,
                in_use: n.in_use,
                zeroing: n.zeroing,
            })
    }

    /// Page counts of the whole pool.
    pub fn counts(&self) -> PoolCounts {
        (0..self.nodes.len()).fold(PoolCounts::default(), |mut acc, i| {
            let c = self.node_counts(ZoneId(i));
            acc.free_zero += c.free_zero;
            acc.zeroable += c.zeroable;
            acc.in_use += c.in_use;
            acc.zeroing += c.zeroing;
            acc
        })
    }

    /// Number of nodes that have (or had) pages: ids are `0..node_count()`.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Counters.
    pub fn counters(&self) -> PoolCounters {
        PoolCounters {
            events: self.notifier.as_ref().map_or(0, Notifier::fired),
            ..self.counters
        }
    }
}

#[cfg(test)]
mod tests;
