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

/// The [`Link`]s of every frame of a zone, stored as `[prev, next]` pairs: a table of plain
/// zeros is a zeroed allocation, which for a large zone is fresh anonymous memory that is
/// backed only where an entry is written (a 64 GiB range costs 128 MiB of links, all of
/// it address space until the frames are used). A frame's link is meaningful only while
/// it heads a listed block, and [`FreeLists::push`] writes it whole then, so the initial
/// zeros are never read.
pub(crate) struct Links(Vec<[u32; 2]>);

impl Links {
    /// Links of `frames` frames (zeroed, see the type docs).
    pub fn new(frames: usize) -> Links {
        Links(vec![[0; 2]; frames])
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The link of frame `idx`, if in the table.
    pub fn get(&self, idx: u32) -> Option<Link> {
        self.0
            .get(idx as usize)
            .map(|&[prev, next]| Link { prev, next })
    }

    /// Sets the link of frame `idx`.
    fn set(&mut self, idx: u32, link: Link) {
        self.0[idx as usize] = [link.prev, link.next];
    }

    /// Sets the previous-block link of frame `idx`.
    fn set_prev(&mut self, idx: u32, prev: u32) {
        self.0[idx as usize][0] = prev;
    }

    /// Sets the next-block link of frame `idx`.
    fn set_next(&mut self, idx: u32, next: u32) {
        self.0[idx as usize][1] = next;
    }
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
        links: &mut Links,
        idx: u32,
        order: Order,
        state: FreeState,
    ) {
        let (o, s) = (order.index(), state.index());
        let old = self.heads[o][s];
        tags.set(idx, Tag::Free { order, state });
        links.set(
            idx,
            Link {
                prev: NIL,
                next: old,
            },
        );
        if old != NIL {
            links.set_prev(old, idx);
        }
        self.heads[o][s] = idx;
        self.counts[o][s] += 1;
        self.nonempty[s] |= 1 << o;
    }

    /// Unlinks free block `idx` (which must be on list (order, state)) in O(1). Leaves its
    /// tag for the caller to overwrite.
    pub fn remove(&mut self, links: &mut Links, idx: u32, order: Order, state: FreeState) {
        let (o, s) = (order.index(), state.index());
        let Link { prev, next } = links.get(idx).unwrap_or(Link::NONE);
        if prev == NIL {
            // It was the head: the list now starts at its successor.
            self.heads[o][s] = next;
        } else {
            links.set_next(prev, next);
        }
        if next != NIL {
            links.set_prev(next, prev);
        }
        links.set(idx, Link::NONE);
        self.counts[o][s] -= 1;
        if self.counts[o][s] == 0 {
            self.nonempty[s] &= !(1 << o);
        }
    }

    /// Unlinks and returns the first block of list (order, state), if any.
    pub fn pop(&mut self, links: &mut Links, order: Order, state: FreeState) -> Option<u32> {
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
    pub fn walk<'a>(&self, links: &'a Links, order: Order, state: FreeState) -> ListWalk<'a> {
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
    links: &'a Links,
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
        let link = self.links.get(idx)?;
        let item = (idx, link.prev, self.prev);
        self.prev = idx;
        self.cur = link.next;
        self.steps += 1;
        Some(item)
    }
}
