//! The zone invariant checker: a full walk of the frame table and of every free list.

use super::free_lists::NIL;
use super::tags::Tag;
use super::Zone;
use crate::error::InvariantViolation;
use crate::types::{FreeState, Order, PageRange, Pfn, NR_ORDERS};

impl Zone {
    /// Checks, in O(frames): the frame table partitions the zone into aligned blocks (each
    /// page in exactly one allocated, free or isolated block); page counters match;
    /// every free head is on exactly the list of its (order, state) and every list entry is
    /// such a head, with consistent back links and lengths; no two free buddies of equal
    /// order are left unmerged (merging is eager and ignores state, docs/ARCHITECTURE.md §3).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a zone has fewer than 2^32 frames (MemoryManager::new refuses larger ones), so frame indices and block sizes fit in u32"
    )]
    pub fn check(&self) -> Result<(), InvariantViolation> {
        let fail = |what: String| {
            Err(InvariantViolation {
                zone: self.id,
                what,
            })
        };
        let (mut free, mut allocated, mut isolated, mut cached) = (0u64, 0u64, 0u64, 0u64);
        let mut heads = [[0u64; 4]; NR_ORDERS];
        let mut i = 0usize;
        while i < self.tags.len() {
            let pfn = self.pfn(i as u32);
            let order = match self.tags.get(i as u32) {
                Tag::Tail => return fail(format!("{pfn} is a tail outside any block")),
                Tag::Free { order, state } => {
                    free += order.pages();
                    heads[order.index()][state.index()] += 1;
                    self.check_buddy_not_free(pfn, order)?;
                    order
                }
                Tag::Allocated { order } => {
                    allocated += order.pages();
                    order
                }
                Tag::Isolated { order, .. } => {
                    isolated += order.pages();
                    order
                }
                // Free in a per-thread cache: neither on the lists nor allocated.
                Tag::Cached { order, state } => {
                    if state.known_zero {
                        return fail(format!("cached block at {pfn} claims known zero"));
                    }
                    cached += order.pages();
                    order
                }
            };
            if order > self.max_order || !pfn.is_aligned(order) {
                return fail(format!("block at {pfn} has bad {order}"));
            }
            let end = i + order.pages() as usize;
            if end > self.tags.len() {
                return fail(format!("block at {pfn} {order} crosses the zone end"));
            }
            if let Some(j) = (i + 1..end).find(|&j| self.tags.get(j as u32) != Tag::Tail) {
                return fail(format!(
                    "{} is in two blocks (inside {pfn} {order})",
                    self.pfn(j as u32)
                ));
            }
            i = end;
        }
        if free != self.free_pages || isolated != self.isolated_pages {
            return fail(format!(
                "counters free {} isolated {} but table has free {free} isolated {isolated}",
                self.free_pages, self.isolated_pages
            ));
        }
        if free + allocated + isolated + cached != self.range.pages {
            return fail(format!(
                "free {free} + allocated {allocated} + isolated {isolated} + cached {cached} != total"
            ));
        }
        for order in Order::ZERO.up_to(self.max_order) {
            for state in FreeState::ALL {
                self.check_list(order, state, heads[order.index()][state.index()])?;
            }
        }
        Ok(())
    }

    /// A free block's buddy must not be a free block of the same order.
    fn check_buddy_not_free(&self, pfn: Pfn, order: Order) -> Result<(), InvariantViolation> {
        if order >= self.max_order {
            return Ok(());
        }
        let buddy = Pfn(pfn.0 ^ order.pages());
        if !self
            .range
            .contains_range(&PageRange::new(buddy, order.pages()))
        {
            return Ok(());
        }
        match self.tags.get(self.idx(buddy)) {
            Tag::Free { order: o, .. } if o == order => Err(InvariantViolation {
                zone: self.id,
                what: format!("free buddies {pfn} and {buddy} of {order} not merged"),
            }),
            _ => Ok(()),
        }
    }

    /// The list (order, state) holds exactly `expected` entries, each a free head of that
    /// order and state, with consistent links, and its mask bit matches.
    fn check_list(
        &self,
        order: Order,
        state: FreeState,
        expected: u64,
    ) -> Result<(), InvariantViolation> {
        let fail = |what: String| {
            Err(InvariantViolation {
                zone: self.id,
                what,
            })
        };
        let mut n = 0u64;
        for (idx, stored_prev, real_prev) in self.lists.walk(&self.links, order, state) {
            if self.tags.get(idx) != (Tag::Free { order, state }) {
                return fail(format!(
                    "{} on list ({order}, {state:?}) is not such a free head",
                    self.pfn(idx)
                ));
            }
            if stored_prev != real_prev {
                return fail(format!("{} has a bad prev link", self.pfn(idx)));
            }
            n += 1;
        }
        let stored = self.lists.count(order, state);
        if n != expected || stored != expected {
            return fail(format!(
                "list ({order}, {state:?}): walked {n}, counter {stored}, table heads {expected}"
            ));
        }
        if (stored > 0) != (self.lists.smallest(&[state], order, order).is_some()) {
            return fail(format!("non-empty mask wrong for ({order}, {state:?})"));
        }
        if self
            .lists
            .head(order, state)
            .is_some_and(|h| self.links.get(h).is_some_and(|l| l.prev != NIL))
        {
            return fail(format!("head of ({order}, {state:?}) has a prev link"));
        }
        Ok(())
    }
}
