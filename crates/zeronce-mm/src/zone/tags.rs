//! The role of every frame, one atomic word each, readable outside the zone lock.
//!
//! The zone writes tags under its lock. Per-thread caches ([`crate::PcpCache`]) write
//! only two transitions without it: `Allocated → Cached` by compare-and-swap when a block
//! is freed into a cache (so two racing frees of one block cannot both succeed), and
//! `Cached → Allocated` with a store when the owning cache hands out one of its blocks
//! (nobody else may touch a cached block).

use crate::types::{FreeState, Order};
use std::sync::atomic::{AtomicU32, Ordering};

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
    /// First frame of a free block held by a per-thread cache (not on the zone's lists).
    Cached {
        /// Block size.
        order: Order,
        /// What is known about the block.
        state: FreeState,
    },
}

impl Tag {
    /// Block order of a head tag, `None` for a tail.
    #[inline]
    pub fn order(self) -> Option<Order> {
        match self {
            Tag::Tail => None,
            Tag::Free { order, .. }
            | Tag::Allocated { order }
            | Tag::Isolated { order, .. }
            | Tag::Cached { order, .. } => Some(order),
        }
    }

    /// Packs into one word: bits 0-2 kind, 3-7 order, 8 known_zero, 9 reported.
    #[inline]
    fn pack(self) -> u32 {
        let (kind, order, state) = match self {
            Tag::Tail => (0, 0, FreeState::DIRTY),
            Tag::Free { order, state } => (1, order.get(), state),
            Tag::Allocated { order } => (2, order.get(), FreeState::DIRTY),
            Tag::Isolated { order, state } => (3, order.get(), state),
            Tag::Cached { order, state } => (4, order.get(), state),
        };
        kind | (u32::from(order) << 3)
            | (u32::from(state.known_zero) << 8)
            | (u32::from(state.reported) << 9)
    }

    /// Inverse of [`Tag::pack`] (only packed values are ever stored).
    #[inline]
    fn unpack(word: u32) -> Tag {
        let order = Order::new(((word >> 3) & 0x1f) as u8).unwrap_or(Order::ZERO);
        let state = FreeState {
            known_zero: word & (1 << 8) != 0,
            reported: word & (1 << 9) != 0,
        };
        match word & 7 {
            1 => Tag::Free { order, state },
            2 => Tag::Allocated { order },
            3 => Tag::Isolated { order, state },
            4 => Tag::Cached { order, state },
            _ => Tag::Tail,
        }
    }
}

/// One tag per frame of a zone.
pub(crate) struct TagTable(Box<[AtomicU32]>);

impl TagTable {
    /// `frames` tails. [`Tag::Tail`] packs to 0, so the table is a zeroed allocation: for a
    /// large zone, fresh anonymous memory backed only where a tag is written (a 64 GiB
    /// range has 64 MiB of tags, of which a new zone writes one per max-order block).
    #[inline]
    pub fn new(frames: usize) -> TagTable {
        TagTable(bytemuck::zeroed_slice_box(frames))
    }

    /// Number of frames.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The tag of frame `idx`.
    #[inline]
    pub fn get(&self, idx: u32) -> Tag {
        Tag::unpack(self.0[idx as usize].load(Ordering::Acquire))
    }

    /// Sets the tag of frame `idx`.
    #[inline]
    pub fn set(&self, idx: u32, tag: Tag) {
        self.0[idx as usize].store(tag.pack(), Ordering::Release);
    }

    /// Replaces `old` by `new` atomically; on mismatch returns the tag found.
    #[inline]
    pub fn swap_if(&self, idx: u32, old: Tag, new: Tag) -> Result<(), Tag> {
        self.0[idx as usize]
            .compare_exchange(old.pack(), new.pack(), Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(Tag::unpack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_table_is_tails_and_tail_packs_to_zero() {
        assert_eq!(Tag::Tail.pack(), 0, "TagTable::new relies on it");
        let table = TagTable::new(3);
        assert!((0..3).all(|i| table.get(i) == Tag::Tail));
    }

    #[test]
    fn every_tag_round_trips() {
        let mut tags = vec![Tag::Tail];
        for o in 0..=crate::MAX_ORDER_LIMIT {
            let order = Order::new(o).unwrap();
            tags.push(Tag::Allocated { order });
            for state in FreeState::ALL {
                tags.extend([
                    Tag::Free { order, state },
                    Tag::Isolated { order, state },
                    Tag::Cached { order, state },
                ]);
            }
        }
        for t in tags {
            assert_eq!(Tag::unpack(t.pack()), t);
        }
    }
}
