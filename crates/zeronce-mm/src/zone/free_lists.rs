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

use crate::types::{FreeState, Order, NR_ORDERS};

/// "No frame": end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// What a frame is, seen from the buddy allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    /// Not the first frame of a block: its block is found by looking at aligned heads below.
    Tail,
    /// First frame of a free block on the free list (`order`, `state`).
    Free {
        /// Block size.
        order: Order,
        /// What is known about the block.
        state: FreeState,
    },
    /// First frame of a block handed out by `alloc`.
    Allocated {
        /// Block size.
        order: Order,
    },
    /// First frame of a free block taken off the free lists for reporting.
    Isolated {
        /// Block size.
        order: Order,
        /// State it had when isolated (kept for the put-back verdict).
        state: FreeState,
    },
}

/// One entry of the frame table: 12 bytes per 4 KiB page.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    /// Role of the frame.
    pub tag: Tag,
    /// Previous free block in the same list (only meaningful for `Tag::Free`).
    pub prev: u32,
    /// Next free block in the same list (only meaningful for `Tag::Free`).
    pub next: u32,
}

impl Frame {
    /// A frame inside some block.
    pub const TAIL: Frame = Frame {
        tag: Tag::Tail,
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
    pub fn push(&mut self, frames: &mut [Frame], idx: u32, order: Order, state: FreeState) {
        let (o, s) = (order.index(), state.index());
        let old = self.heads[o][s];
        frames[idx as usize] = Frame {
            tag: Tag::Free { order, state },
            prev: NIL,
            next: old,
        };
        if old != NIL {
            frames[old as usize].prev = idx;
        }
        self.heads[o][s] = idx;
        self.counts[o][s] += 1;
        self.nonempty[s] |= 1 << o;
    }

    /// Unlinks free block `idx` (which must be on list (order, state)) in O(1). Leaves its
    /// tag for the caller to overwrite.
    pub fn remove(&mut self, frames: &mut [Frame], idx: u32, order: Order, state: FreeState) {
        let (o, s) = (order.index(), state.index());
        let Frame { prev, next, .. } = frames[idx as usize];
        if prev == NIL {
            // It was the head: the list now starts at its successor.
            self.heads[o][s] = next;
        } else {
            frames[prev as usize].next = next;
        }
        if next != NIL {
            frames[next as usize].prev = prev;
        }
        frames[idx as usize].prev = NIL;
        frames[idx as usize].next = NIL;
        self.counts[o][s] -= 1;
        if self.counts[o][s] == 0 {
            self.nonempty[s] &= !(1 << o);
        }
    }

    /// Unlinks and returns the first block of list (order, state), if any.
    pub fn pop(&mut self, frames: &mut [Frame], order: Order, state: FreeState) -> Option<u32> {
        let head = self.heads[order.index()][state.index()];
        if head == NIL {
            return None;
        }
        self.remove(frames, head, order, state);
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
        let order = Order::new(mask.trailing_zeros() as u8).ok()?;
        let state = states
            .iter()
            .copied()
            .find(|s| self.nonempty[s.index()] & (1 << order.get()) != 0)?;
        Some((order, state))
    }

    /// Walks list (order, state) in order; used by the invariant checker.
    pub fn walk<'a>(&self, frames: &'a [Frame], order: Order, state: FreeState) -> ListWalk<'a> {
        ListWalk {
            frames,
            cur: self.heads[order.index()][state.index()],
            prev: NIL,
            steps: 0,
        }
    }
}

/// Iterator over a free list; yields `(idx, prev link as stored, expected prev)`.
pub(crate) struct ListWalk<'a> {
    frames: &'a [Frame],
    cur: u32,
    prev: u32,
    steps: usize,
}

impl Iterator for ListWalk<'_> {
    type Item = (u32, u32, u32);
    fn next(&mut self) -> Option<Self::Item> {
        // Bounded by the table size, so a corrupted (cyclic) list cannot loop forever.
        if self.cur == NIL || self.steps > self.frames.len() {
            return None;
        }
        let idx = self.cur;
        let frame = self.frames.get(idx as usize)?;
        let item = (idx, frame.prev, self.prev);
        self.prev = idx;
        self.cur = frame.next;
        self.steps += 1;
        Some(item)
    }
}
