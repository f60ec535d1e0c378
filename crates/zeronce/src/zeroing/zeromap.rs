//! [`ZeroMap`]: what is known about the contents of each *chunk* (a naturally aligned
//! 2^`chunk_order`-page piece, the reporting order) of process memory, and the lock the
//! background zeroer holds while it writes one.
//!
//! The manager knows "known zero" per free block, and a merge with a dirty buddy forgets
//! it (known_zero = a ∧ b). The map remembers it per chunk, so work done on half of a block
//! is never done again: the allocation path zeroes only the chunks not known zero, and the
//! background zeroer only the chunks nobody zeroed since they were last handed out.
//! Blocks smaller than a chunk leave it `Used`; within a chunk that is not known zero, a
//! bit per page ([`WrittenPages`]) tells which pages were written since they were last
//! zeroed, so those blocks are not zeroed twice either.
//!
//! Protocol (every transition is one compare-and-swap; `Zeroing` is held by one zeroer at a
//! time and every other transition waits for it to end, at most one chunk's zeroing):
//! - handed out (any block overlapping the chunk) → `Used`;
//! - freed by a block covering it → `Dirty`, or `Zero` when freed known zero;
//! - the zeroer takes `Dirty` → `Zeroing`, checks under the zone lock that the chunk is
//!   inside a free, unreported, not-known-zero block, writes it, and sets `Zero` (or puts
//!   the old state back if the check failed). An allocation that took the block after the
//!   check waits for `Zeroing` to end before the caller can see a byte.

use std::sync::atomic::{AtomicU64, Ordering::*};

use zeronce_mem::{ScanError, SharedRam};
use zeronce_mm::{Block, Order, PageRange, Pfn, PAGE_SIZE};

use super::chunks::ChunkStates;
use super::written::WrittenPages;
use crate::threads::PerThread;

/// Some part was handed out since the chunk was last freed whole: contents unknown, and
/// perhaps in use (the zeroer leaves it alone).
const USED: u8 = 0;
/// Freed whole, contents unknown.
const DIRTY: u8 = 1;
/// Reads zero (zeroed in the background or at free, freed known zero, or never touched).
const ZERO: u8 = 2;
/// A zeroer is writing it.
const ZEROING: u8 = 3;

/// Counters of the zero-once lifecycle of a [`crate::ProcessMemory`], in bytes. Nothing is
/// zeroed twice: every byte zeroed was handed out (or was dirty at start) and freed since
/// it was last zeroed, so
/// `background + alloc_path + at_free <= freed + initially dirty`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroingStats {
    /// Zeroed by the background zeroer (or [`crate::ProcessMemory::prezero`]), off the
    /// allocation path.
    pub background: u64,
    /// Zeroed on the allocation path (a zero-request for memory not known zero).
    pub alloc_path: u64,
    /// Zeroed at free (`init_on_free`).
    pub at_free: u64,
    /// Bytes of zero-requests for blocks the manager thought dirty that were known zero
    /// here (merged with a dirty buddy after their zeroing, or never written since): not
    /// zeroed again.
    pub skipped_by_map: u64,
    /// Freed by their owners (any hint).
    pub freed: u64,
}

struct Counters {
    background: AtomicU64,
    alloc_path: AtomicU64,
    at_free: AtomicU64,
    skipped_by_map: AtomicU64,
    /// Per thread: every free adds to it, so threads do not share one cache line.
    freed: PerThread<AtomicU64>,
}

/// Chunk states of one RAM (see the module docs).
pub struct ZeroMap {
    chunk_order: Order,
    chunks: ChunkStates,
    written: WrittenPages,
    counters: Counters,
}

impl std::fmt::Debug for ZeroMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroMap")
            .field("chunk_order", &self.chunk_order)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

/// Which counter a zeroing goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Site {
    Background,
    AllocPath,
    AtFree,
}

impl ZeroMap {
    /// A map of `pages` pages in chunks of `chunk_order`; `zero`: everything reads zero.
    pub(crate) fn new(pages: u64, chunk_order: Order, zero: bool) -> ZeroMap {
        let n = pages.div_ceil(chunk_order.pages()) as usize;
        let init = if zero { ZERO } else { DIRTY };
        ZeroMap {
            chunk_order,
            chunks: ChunkStates::new(n, init),
            written: WrittenPages::new(pages, !zero),
            counters: Counters {
                background: AtomicU64::new(0),
                alloc_path: AtomicU64::new(0),
                at_free: AtomicU64::new(0),
                skipped_by_map: AtomicU64::new(0),
                freed: PerThread::new(|| AtomicU64::new(0)),
            },
        }
    }

    /// The chunk order.
    pub(crate) fn chunk_order(&self) -> Order {
        self.chunk_order
    }

    /// Number of chunks.
    pub(crate) fn len(&self) -> usize {
        self.chunks.len()
    }

    /// The pages of chunk `i`.
    pub(crate) fn chunk_range(&self, i: usize) -> PageRange {
        let pages = self.chunk_order.pages();
        PageRange::new(Pfn(i as u64 * pages), pages)
    }

    /// Indices of the chunks overlapping `range`.
    fn overlapping(&self, range: PageRange) -> std::ops::Range<usize> {
        let shift = self.chunk_order.get();
        let first = (range.start.0 >> shift) as usize;
        // A shift, not a division: on the path of every block handed out or freed.
        let end = ((range.end().0 + self.chunk_order.pages() - 1) >> shift) as usize;
        first.min(self.chunks.len())..end.min(self.chunks.len())
    }

    /// Waits out a zeroer on chunk `i` and swaps in `new`; the previous state.
    fn set(&self, i: usize, new: u8) -> u8 {
        self.chunks.set(i, new, ZEROING)
    }

    /// A block was handed out: its chunks become `Used` (after any zeroer on them ended),
    /// its pages written (its holder may write them).
    pub(crate) fn handed_out(&self, block: Block) {
        self.handed_out_prefix(block, block.order.pages());
    }

    /// [`ZeroMap::handed_out`] to a holder that writes only the first `written` pages
    /// (more only after [`ZeroMap::written`]): the rest keep their bits, so pages that read
    /// zero before the hand-out still do at the free and are not zeroed again.
    pub(crate) fn handed_out_prefix(&self, block: Block, written: u64) {
        if block.order <= self.chunk_order {
            // One chunk (a block is naturally aligned): no walk.
            if let Some(i) = self.chunk_of(block) {
                self.set(i, USED);
            }
        } else {
            for i in self.overlapping(block.range()) {
                self.set(i, USED);
            }
        }
        let range = block.range();
        self.written
            .mark(PageRange::new(range.start, written.min(range.pages)), true);
    }

    /// [`ZeroMap::handed_out`] of each of `blocks` (handed out together): the chunks of
    /// blocks no larger than a chunk become `Used` with one compare-and-swap per word of
    /// chunk states (the blocks of one 16 MiB-aligned stretch), the others one by one.
    pub(crate) fn handed_out_each(&self, blocks: &[Block]) {
        let single = |b: &&Block| b.order <= self.chunk_order;
        let chunks = blocks
            .iter()
            .filter(single)
            .filter_map(|&b| self.chunk_of(b));
        self.chunks.set_each(chunks.map(|i| (i, USED)), ZEROING);
        for &block in blocks {
            if block.order > self.chunk_order {
                self.handed_out(block);
            } else {
                self.written.mark(block.range(), true);
            }
        }
    }

    /// The holder of a block handed out with [`ZeroMap::handed_out_prefix`] writes the
    /// pages of `range` too.
    pub(crate) fn written(&self, range: PageRange) {
        self.written.mark(range, true);
    }

    /// The chunk holding `block`, a block of the chunk order or smaller, if the map has it.
    #[inline]
    fn chunk_of(&self, block: Block) -> Option<usize> {
        let i = usize::try_from(block.pfn.0 >> self.chunk_order.get()).ok()?;
        (i < self.chunks.len()).then_some(i)
    }

    /// Calls `f` on each run of pages of `range` written since they were last zeroed.
    pub(crate) fn for_each_written_run(&self, range: PageRange, f: impl FnMut(PageRange)) {
        self.written.for_each_written_run(range, f);
    }

    /// The pages of `range` were zeroed.
    pub(crate) fn zeroed(&self, range: PageRange) {
        self.written.mark(range, false);
    }

    /// Takes chunk `i` for zeroing on the allocation path (its block was just taken from
    /// the manager): whether it already reads zero. The chunk is `Used` afterwards.
    pub(crate) fn take_for_zeroing(&self, i: usize) -> bool {
        self.set(i, USED) == ZERO
    }

    /// A block is being freed by its owner, its pages from `zero_from` on reading zero
    /// (0: all of it; the block's page count: none): the chunks it covers whole become
    /// `Zero` where they read zero (from `zero_from` on, or no page written since its last
    /// zeroing), else `Dirty`; chunks shared with other blocks stay `Used`.
    pub(crate) fn freed(&self, block: Block, zero_from: u64) {
        let range = block.range();
        let zero_pages = range.pages.saturating_sub(zero_from);
        self.written.mark(
            PageRange::new(Pfn(range.end().0 - zero_pages), zero_pages),
            false,
        );
        if block.order < self.chunk_order {
            return;
        }
        if block.order == self.chunk_order {
            // One chunk (a 2 MiB block): zero only when all of it reads zero.
            if let Some(i) = self.chunk_of(block) {
                let zero = zero_from == 0 || !self.written.any_written(range);
                self.set(i, if zero { ZERO } else { DIRTY });
            }
            return;
        }
        let pages = self.chunk_order.pages();
        let first_zero = block.pfn.0 + zero_from.div_ceil(pages) * pages;
        for i in self.overlapping(block.range()) {
            let chunk = self.chunk_range(i);
            let zero = chunk.start.0 >= first_zero || !self.written.any_written(chunk);
            self.set(i, if zero { ZERO } else { DIRTY });
        }
    }

    /// [`ZeroMap::freed`], the pages before `zero_from` looked up in `ram`'s page tables
    /// first ([`SharedRam::for_each_maybe_written`]): the ones no page of the process's own
    /// backs (never touched, discarded, or only ever read) read zero whatever the holder
    /// was allowed to do, and are no longer counted written; the others are. So a chunk
    /// its holder only read goes back `Zero`: not zeroed again, not faulted in to be, and
    /// the next zero-request skips it. On a scan error the pages it had not reached keep
    /// their bits (written, as without a scan), and the error is returned.
    pub(crate) fn freed_scanned(
        &self,
        block: Block,
        zero_from: u64,
        ram: &SharedRam,
    ) -> Result<(), ScanError> {
        let range = block.range();
        let head_end = range.start.0 + zero_from.min(range.pages);
        let page = |offset: usize| offset as u64 / PAGE_SIZE;
        // The next page the scan has not settled.
        let mut at = range.start.0;
        let scanned = ram.for_each_maybe_written(
            range.start.byte_offset() as usize,
            ((head_end - at) * PAGE_SIZE) as usize,
            self.chunk_order.bytes() as usize,
            |offset, len| {
                let (first, pages) = (page(offset), page(len));
                self.written
                    .mark(PageRange::new(Pfn(at), first - at), false);
                self.written.mark(PageRange::new(Pfn(first), pages), true);
                at = first + pages;
            },
        );
        if scanned.is_ok() {
            self.written
                .mark(PageRange::new(Pfn(at), head_end - at), false);
        }
        self.freed(block, zero_from);
        scanned
    }

    /// [`ZeroMap::freed`] of each of `blocks`, freed dirty together (no page vouched
    /// for): the chunks of the blocks of one chunk change with one compare-and-swap per
    /// word of chunk states, the others one by one.
    pub(crate) fn freed_each(&self, blocks: &[Block]) {
        let whole = |b: &&Block| b.order == self.chunk_order;
        let chunks = blocks.iter().filter(whole).filter_map(|&b| {
            let zero = !self.written.any_written(b.range());
            Some((self.chunk_of(b)?, if zero { ZERO } else { DIRTY }))
        });
        self.chunks.set_each(chunks, ZEROING);
        for &block in blocks {
            if block.order > self.chunk_order {
                self.freed(block, block.order.pages());
            }
        }
    }

    /// Waits until no zeroer writes any chunk of `range` (a discard is about to claim it).
    pub(crate) fn wait_no_zeroing(&self, range: PageRange) {
        for i in self.overlapping(range) {
            while self.chunks.get(i, Acquire) == ZEROING {
                std::thread::yield_now();
            }
        }
    }

    /// Whether chunk `i` is `Dirty` (a candidate for the background zeroer).
    pub(crate) fn is_dirty(&self, i: usize) -> bool {
        self.chunks.get(i, Relaxed) == DIRTY
    }

    /// Locks a `Dirty` chunk for zeroing; `false` if it is not `Dirty` (any more).
    pub(crate) fn begin_zeroing(&self, i: usize) -> bool {
        self.chunks.replace(i, DIRTY, ZEROING)
    }

    /// Ends the zeroing of chunk `i`: `done` → `Zero`, else back to `Dirty`.
    pub(crate) fn end_zeroing(&self, i: usize, done: bool) {
        if done {
            self.zeroed(self.chunk_range(i));
        }
        // Only the zeroer that set `Zeroing` changes it: the swap cannot fail.
        let ended = self
            .chunks
            .replace(i, ZEROING, if done { ZERO } else { DIRTY });
        debug_assert!(ended, "chunk {i} was not being zeroed");
    }

    /// Whether every chunk of `range` reads zero (`range` covers whole chunks).
    pub(crate) fn all_zero(&self, range: PageRange) -> bool {
        self.overlapping(range)
            .all(|i| self.chunks.get(i, Acquire) == ZERO)
    }

    /// Counts `bytes` zeroed at `site`.
    pub(crate) fn count_zeroed(&self, site: Site, bytes: u64) {
        let c = match site {
            Site::Background => &self.counters.background,
            Site::AllocPath => &self.counters.alloc_path,
            Site::AtFree => &self.counters.at_free,
        };
        c.fetch_add(bytes, Relaxed);
    }

    /// Counts `bytes` their owners freed (blocks kept in a thread cache are counted there).
    pub(crate) fn count_freed(&self, bytes: u64) {
        self.counters.freed.mine().fetch_add(bytes, Relaxed);
    }

    /// Counts `bytes` a zero-request did not zero because the map knew them zero.
    pub(crate) fn count_skipped(&self, bytes: u64) {
        self.counters.skipped_by_map.fetch_add(bytes, Relaxed);
    }

    /// The counters.
    pub(crate) fn stats(&self) -> ZeroingStats {
        let c = &self.counters;
        ZeroingStats {
            background: c.background.load(Relaxed),
            alloc_path: c.alloc_path.load(Relaxed),
            at_free: c.at_free.load(Relaxed),
            skipped_by_map: c.skipped_by_map.load(Relaxed),
            freed: c.freed.iter().map(|f| f.load(Relaxed)).sum(),
        }
    }

    /// Indices of the chunks overlapping `range`, for the allocation-path zeroer.
    pub(crate) fn chunks_of(&self, range: PageRange) -> std::ops::Range<usize> {
        self.overlapping(range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every chunk's state and every page's written bit.
    fn snapshot(m: &ZeroMap, pages: u64) -> (Vec<u8>, Vec<bool>) {
        let chunks = (0..m.len()).map(|i| m.chunks.get(i, Acquire)).collect();
        let written = (0..pages)
            .map(|p| m.written.any_written(PageRange::new(Pfn(p), 1)))
            .collect();
        (chunks, written)
    }

    /// Distinct naturally aligned blocks of orders 0, 3, 9 and 10 in 64 MiB, from seeds.
    fn blocks(seeds: &[(u8, u16)]) -> Vec<Block> {
        let mut taken = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for &(o, at) in seeds {
            let order = Order::new([0, 3, 9, 10][o as usize % 4]).unwrap();
            let pfn = (u64::from(at) % (PAGES >> order.get())) << order.get();
            let range = pfn..pfn + order.pages();
            if range.clone().all(|p| !taken.contains(&p)) {
                taken.extend(range);
                out.push(Block::new(Pfn(pfn), order));
            }
        }
        out
    }

    const PAGES: u64 = 16384;

    proptest! {
        /// A batch hand-out or free leaves the map as the same blocks one by one do.
        #[test]
        fn batches_are_their_blocks_one_by_one(
            seeds in proptest::collection::vec((0u8..4, any::<u16>()), 1..24),
            written in proptest::collection::vec(any::<u16>(), 0..8),
            zero in any::<bool>(),
        ) {
            let order9 = Order::new(9).unwrap();
            let (bulk, single) = (ZeroMap::new(PAGES, order9, zero), ZeroMap::new(PAGES, order9, zero));
            let blocks = blocks(&seeds);
            bulk.handed_out_each(&blocks);
            for &b in &blocks {
                single.handed_out(b);
            }
            prop_assert_eq!(snapshot(&bulk, PAGES), snapshot(&single, PAGES));
            // Some blocks zeroed by their holders, so some free to `Zero`.
            for (k, &w) in written.iter().enumerate() {
                if let Some(b) = blocks.get(usize::from(w) % blocks.len().max(1)) {
                    if k % 2 == 0 {
                        bulk.zeroed(b.range());
                        single.zeroed(b.range());
                    }
                }
            }
            bulk.freed_each(&blocks);
            for &b in &blocks {
                single.freed(b, b.order.pages());
            }
            prop_assert_eq!(snapshot(&bulk, PAGES), snapshot(&single, PAGES));
        }
    }
}
