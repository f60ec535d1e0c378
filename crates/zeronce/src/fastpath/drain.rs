//! The way a full kept list of huge blocks makes room ([`ThreadCaches::keep_draining`]):
//! its blocks go back to the manager together, oldest first, under one zone lock, as
//! Linux's `free_pcppages_bulk` gives a per-CPU list's pages back when it is over its high
//! mark. Linux frees as much as it can there when high-order pages are freed in a run
//! (`free_high`); a free into a full huge list is such a run, so the whole list goes.

use zeronce_mm::{Block, FreeHint, Order, Pfn};

use super::slots::{list_order, SlotGuard};
use super::{Keep, ThreadCaches};
use crate::claimed::ClaimedBytes;

/// Most kept huge blocks that go back to the manager together: a list at its largest
/// (an eighth of 1 GiB over two slots) goes back at once. With 8, a loop of 64 order-9
/// allocations and frees past the kept blocks went through the zone in four batches of 8
/// each way; with 32 and the older half of a full list in one of 32 out and two of 16
/// back, 5.5 % faster (`zeronce bench alloc --batch 64`, 25.6-26.0 against 27.1-27.2 M
/// pairs/s); with the whole list, one of 32 each way (2 % fewer instructions a pair).
pub(super) const HUGE_DRAIN: usize = 32;

impl<E: Keep> ThreadCaches<E> {
    /// [`ThreadCaches::keep`] of a huge block into a full list (`guard`'s list `list`):
    /// the list's blocks, oldest first, up to [`HUGE_DRAIN`] and as far as they are
    /// `entry`'s owner's, go back to the manager under one zone lock (Linux
    /// `free_pcppages_bulk`), and `entry` is kept in their place. Back to the caller when
    /// the oldest kept block is another owner's.
    #[inline(never)]
    pub(super) fn keep_draining(
        mut guard: SlotGuard<E>,
        list: usize,
        mut entry: E,
    ) -> Result<(), E> {
        let caches = entry.caches();
        let limit = caches.limit(&guard, list);
        let n = guard
            .list(list)
            .iter()
            .take(limit.clamp(1, HUGE_DRAIN))
            .take_while(|e| std::ptr::eq(e.caches(), caches))
            .count();
        if n == 0 {
            return Err(entry);
        }
        // Blocks and their bytes in arrays of their own: each moves as whole words (an
        // array of `Option<(Block, ClaimedBytes)>` packed the option's tag beside the
        // order and was read back across its stores, a store-forwarding stall a block).
        let mut blocks = [Block::new(Pfn(0), Order::ZERO); HUGE_DRAIN];
        let mut bytes: [ClaimedBytes; HUGE_DRAIN] = Default::default();
        // One drained entry holds the owner until the blocks are back. The others stay as
        // husks, their owner references kept for the next blocks taken together (a
        // reference counted down here and up again there is two locked instructions a
        // block), up to as many husks as the list keeps blocks; past that they go now:
        // not the last references, as the owner's handles hold theirs until its close
        // has taken this slot.
        let (kept, husks) = guard.list_and_husks(list);
        // The claims come out where the entries are, then the entries move as they are
        // (a claim read back from an entry just moved to the stack, in other pieces than
        // it was written, is a store-forwarding stall a block).
        for ((block, b), e) in blocks.iter_mut().zip(&mut bytes).zip(&mut kept[..n]) {
            (*block, *b) = e.take_claim();
        }
        let holder = if n == kept.len() && husks.is_empty() {
            // The whole list, and no husks: the two vectors swap, no entry moved.
            std::mem::swap(kept, husks);
            husks.pop()
        } else {
            let mut drained = kept.drain(..n);
            let holder = drained.next();
            let room = limit.saturating_sub(husks.len());
            husks.extend(drained.by_ref().take(room));
            holder
        };
        caches.counters.count_given_back(&guard, list, n as u64);
        caches.counters.count_keep(&guard, list, list_order(list));
        caches.kept_huge_block();
        entry.reuse();
        guard.list(list).push(entry);
        drop(guard);
        if let Some(owner) = &holder {
            // In address order, buddies side by side: the manager frees each pair as its
            // merged block (the claims need no order of theirs).
            sort_by_address(&mut blocks[..n]);
            owner
                .caches()
                .give_back_claims(&blocks[..n], &mut bytes[..n]);
        }
        Ok(())
    }

    /// Gives kept blocks taken out of their lists (`blocks`, each with its claimed
    /// `bytes`, all this owner's) back to the manager as if their owner freed them now,
    /// under one zone lock: [`ThreadCaches::give_back`]'s steps, in bulk (the chunk states
    /// and the claims of the blocks of one 16 MiB-aligned stretch change with one atomic
    /// step each).
    fn give_back_claims(&self, blocks: &[Block], bytes: &mut [ClaimedBytes]) {
        let life = self.life();
        if let Some(l) = life {
            l.map.freed_each(blocks);
        }
        // The claims go before the manager may touch the blocks.
        ClaimedBytes::release_each(&self.ram, bytes);
        let mut failed = Vec::new();
        self.mm.free_each(blocks, FreeHint::Dirty, |block, e| {
            tracing::error!(%e, %block, "giving a kept block back failed");
            if let Some(l) = life {
                // Still allocated: in use, every page written, as after a failed free.
                l.map.handed_out(block);
            }
            failed.push(block);
        });
        if let Some(l) = life {
            let mut bytes = 0;
            for &b in blocks.iter().filter(|b| !failed.contains(b)) {
                bytes += b.order.bytes();
                l.after_free(b, FreeHint::Dirty);
            }
            l.map.count_freed(bytes);
        }
    }
}

/// Sorts `blocks` by address: an insertion sort, as the standard library's sort does for
/// a handful of elements, without its setup (half the instructions of a drain of 8 blocks
/// that arrive nearly sorted, as a list's oldest blocks do: buddies swapped).
fn sort_by_address(blocks: &mut [Block]) {
    for i in 1..blocks.len() {
        let b = blocks[i];
        let mut j = i;
        while j > 0 && blocks[j - 1].pfn > b.pfn {
            blocks[j] = blocks[j - 1];
            j -= 1;
        }
        blocks[j] = b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_by_address_sorts_whatever_the_order() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..=HUGE_DRAIN {
            for _ in 0..200 {
                let mut blocks: Vec<Block> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        Block::new(Pfn((seed % 64) << 9), Order::new(9).unwrap())
                    })
                    .collect();
                let mut expected = blocks.clone();
                expected.sort_by_key(|b| b.pfn);
                sort_by_address(&mut blocks);
                assert_eq!(blocks, expected);
            }
        }
    }
}
