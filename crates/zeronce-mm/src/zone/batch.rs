//! A zone's operations on batches of blocks: the takes of a per-thread cache refill and
//! of a kept list's refill, and the free of two buddies at once. Each ends in the state
//! the same blocks taken or freed one at a time end in (the argument is at each).

use super::tags::Tag;
use super::{Zone, DIRTY_STATES};
use crate::manager::{Allocation, Zeroing};
use crate::types::{Block, FreeState, Order, Pfn};

impl Zone {
    /// Refills a per-thread cache (`rmqueue_bulk`): takes up to `n` blocks of `order` from
    /// the *dirty* lists only (smallest order first, splitting; halves inherit), tags them
    /// cached and appends them to `out`. Known-zero blocks are never cached, so the cache
    /// cannot waste them on non-zero requests. Returns how many were taken.
    pub fn take_for_cache(
        &mut self,
        order: Order,
        n: usize,
        out: &mut Vec<(Pfn, FreeState)>,
    ) -> usize {
        self.take_each(&DIRTY_STATES, order, n, |zone, idx, state| {
            zone.tags.set(idx, Tag::Cached { order, state });
            out.push((zone.pfn(idx), state));
        })
    }

    /// Takes up to `out.len()` resident dirty blocks of `order` (smallest order first,
    /// splitting) and marks them allocated, as [`Zone::take`] would one by one for a
    /// request that zeroes nothing; known-zero and reported blocks stay for the requests
    /// that want them. Fills `out` from the start and returns how many were taken.
    pub fn take_resident_dirty(&mut self, order: Order, out: &mut [Allocation]) -> usize {
        let mut slots = out.iter_mut();
        let n = slots.len();
        self.take_each(&[FreeState::DIRTY], order, n, |zone, idx, prior| {
            zone.tags.set(idx, Tag::Allocated { order });
            zone.counters.allocs[order.index()] += 1;
            if let Some(slot) = slots.next() {
                *slot = Allocation {
                    block: Block::new(zone.pfn(idx), order),
                    zone: zone.id,
                    zeroing: Zeroing::NotRequested,
                    prior,
                };
            }
        })
    }

    /// Takes up to `n` blocks of `order` in `states` (resident first, like
    /// [`Zone::take`]), calling `taken` with each head index and state (its tag is
    /// `taken`'s to set); how many were taken.
    ///
    /// A block of a higher order all of whose pieces of `order` are wanted is taken whole
    /// and handed out piece by piece, in address order, with no split pushed and popped
    /// again: what taking them one by one does. That first take finds the smallest
    /// order with a block in the first state that has one, so that state's lists below it
    /// are empty; the split leaves exactly the block's upper pieces there, and each next
    /// take finds the lowest of them.
    fn take_each(
        &mut self,
        states: &[FreeState],
        order: Order,
        n: usize,
        mut taken: impl FnMut(&mut Self, u32, FreeState),
    ) -> usize {
        let mut count = 0;
        while count < n {
            if let Some((idx, pieces, state)) = self.pop_whole(states, order, n - count) {
                let step = u32::try_from(order.pages()).unwrap_or(u32::MAX);
                for k in 0..pieces {
                    taken(self, idx + k * step, state);
                }
                count += pieces as usize;
                continue;
            }
            let next = states
                .iter()
                .find_map(|&state| self.pop_split(&[state], order));
            let Some((idx, state)) = next else {
                break;
            };
            taken(self, idx, state);
            count += 1;
        }
        count
    }

    /// The block [`Zone::pop_split`] would split for `order` in the first of `states`
    /// that has one, taken off its list whole if it is of a higher order and holds at
    /// most `want` blocks of `order`: its head index, how many blocks of `order` it holds
    /// and its state (the pieces' tags are the caller's to set).
    fn pop_whole(
        &mut self,
        states: &[FreeState],
        order: Order,
        want: usize,
    ) -> Option<(u32, u32, FreeState)> {
        let (found, state) = states
            .iter()
            .find_map(|&s| self.lists.smallest(&[s], order, self.max_order))?;
        let pieces = 1u32 << (found.get() - order.get());
        if found == order || pieces as usize > want {
            return None;
        }
        let idx = self.lists.pop(&mut self.links, found, state)?;
        self.free_pages -= found.pages();
        Some((idx, pieces, state))
    }

    /// Frees the allocated buddies `lower` and `upper` (in that order) in `state`, as
    /// [`Zone::free`] of one then the other does: the first one's free cannot merge (its
    /// buddy is still allocated), the second one's merges with it first, so both go on
    /// the lists as their merged block. `None`, and nothing changes, unless both are
    /// allocated heads of one order above [`crate::PCP_MAX_ORDER`] (whose tags no cache
    /// writes) and below the zone's largest: the caller frees them one by one.
    pub fn free_buddies(
        &mut self,
        lower: Block,
        upper: Block,
        state: FreeState,
    ) -> Option<(Block, FreeState)> {
        let order = lower.order;
        let merged = Block::new(lower.pfn, order.higher()?);
        let buddies = upper.order == order
            && order > crate::PCP_MAX_ORDER
            && order < self.max_order
            && merged.is_aligned()
            && upper.pfn.0 == lower.pfn.0 + order.pages()
            && self.is_allocated_head(lower)
            && self.is_allocated_head(upper);
        if !buddies {
            return None;
        }
        for block in [lower, upper] {
            self.tags.set(self.idx(block.pfn), Tag::Tail);
        }
        self.counters.frees[order.index()] += 2;
        self.free_pages += merged.order.pages();
        Some(self.merge_insert(merged, state))
    }
}
