//! The manager's calls on batches of blocks, one zone lock for many (Linux
//! `rmqueue_bulk` and `free_pcppages_bulk`): what a kept list's refill and drain use.

use super::{lock, Allocation, FreeHint, MemoryManager};
use crate::error::FreeError;
use crate::types::{Block, FreeState, Order};

impl MemoryManager {
    /// Allocates up to `out.len()` blocks of `order` that are resident and dirty (freed
    /// dirty, not reported), under one zone lock per zone (Linux `rmqueue_bulk`), for a
    /// caller that wants their contents unspecified: each as [`MemoryManager::alloc`]
    /// with [`AllocRequest::DIRTY`] would have handed it out (no zeroing), but known-zero
    /// and reported blocks stay for the requests that want them. Fills `out` from the
    /// start; how many were allocated (0 is not a failure: the caller falls back to
    /// [`MemoryManager::alloc`]).
    pub fn alloc_resident_dirty(&self, order: Order, out: &mut [Allocation]) -> usize {
        if order > self.config.max_order {
            return 0;
        }
        let mut filled = 0;
        for slot in &self.zones {
            if filled == out.len() {
                break;
            }
            filled += lock(slot).take_resident_dirty(order, &mut out[filled..]);
        }
        filled
    }

    /// [`MemoryManager::free`] of every block of `blocks` with `hint`, one zone lock for
    /// each run of blocks of one zone (Linux `free_pcppages_bulk`): the same checks, state
    /// and notification as freeing them one by one. Two buddies side by side in `blocks`
    /// (lower first) go onto the lists as their merged block, with no list push and
    /// removal between (a caller freeing neighbours sorts them by address); only buddies
    /// of an order above [`crate::PCP_MAX_ORDER`] and below the largest pair up, and not
    /// known-zero ones in verify mode, which reads each on its own. A block that
    /// cannot be freed is passed to `failed` with its error (outside the lock) and
    /// changes nothing.
    pub fn free_each(
        &self,
        blocks: &[Block],
        hint: FreeHint,
        mut failed: impl FnMut(Block, FreeError),
    ) {
        let state = match hint {
            FreeHint::Dirty => FreeState::DIRTY,
            FreeHint::KnownZero => FreeState::ZERO,
        };
        let mut rest = blocks;
        while let Some(&first) = rest.first() {
            let Some(slot) = self.slot_of(first.pfn) else {
                failed(first, FreeError::NotOwned(first.pfn));
                rest = &rest[1..];
                continue;
            };
            let run = rest
                .iter()
                .take_while(|b| slot.range.contains(b.pfn))
                .count();
            let mut errors: Vec<(Block, FreeError)> = Vec::new();
            let mut reportable = false;
            {
                let mut zone = lock(slot);
                // Verify mode reads each known-zero block on its own.
                let pairs = hint == FreeHint::Dirty || !self.config.verify;
                let mut run = &rest[..run];
                while let Some((&block, after)) = run.split_first() {
                    // Buddies side by side go back as their merged block, as the two
                    // frees one after the other would leave it.
                    let buddies = match after.first() {
                        Some(&upper) if pairs => zone.free_buddies(block, upper, state),
                        _ => None,
                    };
                    if let Some((merged, merged_state)) = buddies {
                        // Counted as the two frees count: the lower block as it went
                        // back on its own, then the block the upper one merged into.
                        reportable |= self.count_reportable(slot, block, state);
                        reportable |= self.count_reportable(slot, merged, merged_state);
                        run = &after[1..];
                        continue;
                    }
                    match self.free_locked(slot, &mut zone, block, hint, state) {
                        Ok(r) => reportable |= r,
                        Err(e) => errors.push((block, e)),
                    }
                    run = after;
                }
            }
            if reportable {
                self.notify_reportable(slot);
            }
            for (block, e) in errors {
                failed(block, e);
            }
            rest = &rest[run..];
        }
    }
}
