//! The frame table entry and the free lists threaded through it.
//!
//! Free lists are intrusive doubly linked lists whose links live in the frame table (indices,
//! not pointers), never in the free pages themselves: a reported page may have been
//! discarded by the host, and writing to it would fault it back in.
//!
//! There is one list per (order, [`FreeState`]), so "a known-zero block of order o" and "a
//! dirty block of order o" are each one list-head read, and a bitmask per state records
//! which orders have a non-empty list, so "the smallest order >= o with a block in state s"
//! is one `trailing_zeros`.

use super::tags::{Tag, TagTable};
use crate::types::{FreeState, Order, NR_ORDERS};

/// "No frame": end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// List links of one frame (meaningful only while it heads a free block on a list).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    /// Previous free block in the same list.
    pub prev: u32,
    /// Next free block in the same list.
    pub next: u32,
}

impl Link {
    /// Not on any list.
    pub const NONE: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

/// Heads, lengths and non-empty masks of the per-(order, state) free lists of one zone.
#[derive(Clone, Debug)]
pub(crate) struct FreeLists {
    /// First block of each list, `NIL` when empty.
    heads: [[u32; 4]; NR_ORDERS],
    /// Number of blocks on each list.
    counts: [[u64; 4]; NR_ORDERS],
    /// Per state: bit `o` set iff the list (o, state) is non-empty.
    nonempty: [u32; 4],
}

impl FreeLists {
    /// All lists empty.
    pub fn new() -> FreeLists {
        FreeLists {
            heads: [[NIL; 4]; NR_ORDERS],
            counts: [[0; 4]; NR_ORDERS],
            nonempty: [0; 4],
        }
    }

    /// Marks frame `idx` as the head of a free block and pushes it at the front of its list
    /// (LIFO, as Linux: the most recently freed block is the most likely cache-hot).
    pub fn push(
        &mut self,
        tags: &TagTable,
        links: &mut [Link],
        idx: u32,
        order: Order,
        state: FreeState,
    ) {
        let (o, s) = (order.index(), state.index());
        let old = self.heads[o][s];
        tags.set(idx, Tag::Free { order, state });
        links[idx as usize] = Link {
            prev: NIL,
            next: old,
        };
        if old != NIL {
            links[old as usize].prev = idx;
        }
        self.heads[o][s] = idx;
        self.counts[o][s] += 1;
        self.nonempty[s] |= 1 << o;
    }

    /// Unlinks free block `idx` (which must be on list (order, state)) in O(1). Leaves its
    /// tag for the caller to overwrite.
    pub fn remove(&mut self, links: &mut [Link], idx: u32, order: Order, state: FreeState) {
        let (o, s) = (order.index(), state.index());
        let Link { prev, next } = links[idx as usize];
        if prev == NIL {
            // It was the head: the list now starts at its successor.
            self.heads[o][s] = next;
        } else {
            links[prev as usize].next = next;
        }
        if next != NIL {
            links[next as usize].prev = prev;
        }
        links[idx as usize] = Link::NONE;
        self.counts[o][s] -= 1;
        if self.counts[o][s] == 0 {
            self.nonempty[s] &= !(1 << o);
        }
    }

    /// Unlinks and returns the first block of list (order, state), if any.
    pub fn pop(&mut self, links: &mut [Link], order: Order, state: FreeState) -> Option<u32> {
        let head = self.heads[order.index()][state.index()];
        if head == NIL {
            return None;
        }
        self.remove(links, head, order, state);
        Some(head)
    }

    /// First block of list (order, state).
    pub fn head(&self, order: Order, state: FreeState) -> Option<u32> {
        let h = self.heads[order.index()][state.index()];
        (h != NIL).then_some(h)
    }

    /// Length of list (order, state).
    pub fn count(&self, order: Order, state: FreeState) -> u64 {
        self.counts[order.index()][state.index()]
    }

    /// The smallest order in `min..=max` where one of `states` has a block, and the first
    /// of `states` (in the given preference order) that has one at that order.
    pub fn smallest(
        &self,
        states: &[FreeState],
        min: Order,
        max: Order,
    ) -> Option<(Order, FreeState)> {
        // Orders min..=max as a bit mask.
        let window = (u32::MAX << min.get()) & (u32::MAX >> (31 - max.get()));
        let mask = states.iter().fold(0, |m, s| m | self.nonempty[s.index()]) & window;
        if mask == 0 {
            return None;
        }
        // Lowest set bit = smallest order with a block: fewer splits, bigger blocks saved.
        let order = u8::try_from(mask.trailing_zeros())
            .ok()
            .and_then(|o| Order::new(o).ok())?;
        let state = states
            .iter()
            .copied()
            .find(|s| self.nonempty[s.index()] & (1 << order.get()) != 0)?;
        Some((order, state))
    }

    /// Walks list (order, state) in order; used by the invariant checker.
    pub fn walk<'a>(&self, links: &'a [Link], order: Order, state: FreeState) -> ListWalk<'a> {
        ListWalk {
            links,
            cur: self.heads[order.index()][state.index()],
            prev: NIL,
            steps: 0,
        }
    }
}

/// Iterator over a free list; yields `(idx, prev link as stored, expected prev)`.
pub(crate) struct ListWalk<'a> {
    links: &'a [Link],
    cur: u32,
    prev: u32,
    steps: usize,
}

impl Iterator for ListWalk<'_> {
    type Item = (u32, u32, u32);
    fn next(&mut self) -> Option<Self::Item> {
        // Bounded by the table size, so a corrupted (cyclic) list cannot loop forever.
        if self.cur == NIL || self.steps > self.links.len() {
            return None;
        }
        let idx = self.cur;
        let link = self.links.get(idx as usize)?;
        let item = (idx, link.prev, self.prev);
        self.prev = idx;
        self.cur = link.next;
        self.steps += 1;
        Some(item)
    }
}
