//! The way an allocation of a huge block that finds none kept fills its slot's list
//! ([`ThreadCaches::alloc_refilling`]): several resident dirty blocks come from the
//! manager under one zone lock, all but one are kept on the slot, as Linux's
//! `rmqueue_bulk` refills a per-CPU list with a batch of pages — the mirror of [`super::drain`].

use zeronce_mm::{Allocation, Block, FreeHint, FreeState, Order, Pfn, Zeroing, ZoneId};

use super::slots::{SlotGuard, HUGE_LIST};
use super::{Keep, ThreadCaches};
use crate::claimed::ClaimedBytes;
use zeronce_mem::ClaimError;

/// Most huge blocks taken from the manager together (the allocation's and the ones
/// kept); as many as a full list gives back together.
const HUGE_REFILL: usize = super::drain::HUGE_DRAIN;

impl<E: Keep> ThreadCaches<E> {
    /// A dirty allocation of a huge block (`order`) that found none kept: takes up to
    /// [`HUGE_REFILL`] resident dirty blocks from the manager under one zone lock, as many
    /// as the calling thread's slot has room to keep beside the one returned, hands out
    /// and claims them together (one atomic step each for the blocks of one 16
    /// MiB-aligned stretch), builds each entry in a husk of this owner's or with `wrap`,
    /// keeps all but one on the slot and returns that one. `None` (nothing taken) when
    /// the slot is busy or has no room, the owner is closed, or the manager has no
    /// resident dirty block: the caller allocates the usual way.
    ///
    /// A kept block taken this way is what a freed one is (allocated, claimed, its chunks
    /// `Used`), counted so that the manager's allocation plus the kept list's later one
    /// make one; a reporting pass is requested, which gives it back first, so blocks
    /// taken ahead are not kept from the host longer than a free would.
    #[inline(never)]
    pub(crate) fn alloc_refilling(
        &self,
        order: Order,
        mut wrap: impl FnMut(Allocation, ClaimedBytes) -> E,
    ) -> Option<E> {
        let mut guard = SlotGuard::try_mine(E::slots())?;
        if self.is_closed() {
            return None;
        }
        let room = self
            .limit(&guard, HUGE_LIST)
            .saturating_sub(guard.list(HUGE_LIST).len());
        if room == 0 {
            return None;
        }
        let none = Allocation {
            block: Block::new(Pfn(0), order),
            zone: ZoneId(0),
            zeroing: Zeroing::NotRequested,
            prior: FreeState::DIRTY,
        };
        let mut allocs = [none; HUGE_REFILL];
        let want = (room + 1).min(HUGE_REFILL);
        let taken = self.mm.alloc_resident_dirty(order, &mut allocs[..want]);
        // Pushed highest first and the lowest (pushed last) popped again as the
        // allocation's: the list hands the others out in address order and they come back
        // (freed in the order they were taken) with buddies side by side, so the drain's
        // sort finds them sorted. Claimed in that one descending run, the blocks of one
        // 16 MiB stretch stay neighbours: one atomic step a stretch (the lowest claimed
        // first and alone cost a step of its own, and split the next stretch's run).
        allocs[..taken].reverse();
        let allocs = &allocs[..taken];
        let mut blocks = [none.block; HUGE_REFILL];
        for (b, a) in blocks.iter_mut().zip(allocs) {
            *b = a.block;
        }
        let blocks = &blocks[..taken];
        // Handed out in the zero map before a byte is claimed, as one block's hand-out.
        if let Some(l) = self.life() {
            l.map.handed_out_each(blocks);
        }
        // An empty list takes the slot's husks as they lie when all are this owner's (what
        // a drain of the whole list leaves): the two vectors swap and the first blocks
        // fill those husks in place, no entry moved.
        let in_place = {
            let (list, husks) = guard.list_and_husks(HUGE_LIST);
            if list.is_empty()
                && !husks.is_empty()
                && husks.iter().all(|h| std::ptr::eq(h.caches(), self))
            {
                std::mem::swap(list, husks);
                list.len()
            } else {
                0
            }
        };
        let mut pushed = 0usize;
        ClaimedBytes::claim_each(
            &self.ram,
            blocks,
            |k, bytes| {
                if pushed < in_place {
                    if let Some(entry) = guard.list(HUGE_LIST).get_mut(pushed) {
                        entry.refill(allocs[k], bytes);
                    }
                    pushed += 1;
                    return;
                }
                // A husk of this owner's carries it if the slot has one (no reference
                // counted up), else a new entry. The husk moves onto the list as it is
                // and takes the block there: a kept entry is not read back from where
                // its new fields were just written (a store-forwarding stall a block).
                let husk = self.pop_mine_of(guard.husks());
                let list = guard.list(HUGE_LIST);
                match husk {
                    Some(husk) => {
                        list.push(husk);
                        if let Some(entry) = list.last_mut() {
                            entry.refill(allocs[k], bytes);
                        }
                    }
                    None => list.push(wrap(allocs[k], bytes)),
                }
                pushed += 1;
            },
            |k, e| self.unclaimable(blocks[k], e),
        );
        if pushed < in_place {
            // Husks no block filled (fewer blocks claimed than husks) stay husks.
            let (list, husks) = guard.list_and_husks(HUGE_LIST);
            husks.extend(list.drain(pushed..));
        }
        // The last one pushed (the lowest claimed) is the allocation's, the others stay
        // kept: nothing else reaches the list while the slot is held.
        let first = if pushed > 0 {
            guard.list(HUGE_LIST).pop()
        } else {
            None
        };
        let kept = pushed.saturating_sub(1) as u64;
        if kept > 0 {
            self.counters.count_refill(&guard, HUGE_LIST, kept);
            drop(guard);
            self.kept_huge_block();
        }
        first
    }

    /// `block`, taken and handed out, could not be claimed (a bug: the manager had it
    /// free): freed back dirty, the bug logged.
    #[cold]
    fn unclaimable(&self, block: Block, e: ClaimError) {
        tracing::error!(%e, %block, "claiming a block taken for a kept list failed");
        if let Some(l) = self.life() {
            l.map.freed(block, block.order.pages());
        }
        if let Err(e) = self.mm.free(block, FreeHint::Dirty) {
            tracing::error!(%e, %block, "giving back an unclaimed block failed");
        }
    }
}
