//! One zone: a buddy allocator over a PFN range (think NUMA node), with the frame table kept
//! apart from the pages. Not thread-safe by itself: [`crate::MemoryManager`] wraps each zone
//! in a mutex. Model: Linux `mm/page_alloc.c` (`__rmqueue_smallest`, `expand`,
//! `__free_one_page`) and `mm/page_reporting.c` (`__isolate_free_page`,
//! `__putback_isolated_page`).

mod batch;
mod check;
pub(crate) mod free_lists;
pub(crate) mod tags;

use crate::error::FreeError;
use crate::stats::{FreeCounts, ZoneInfo};
use crate::types::{Block, FreeState, Order, PageRange, Pfn, ZoneId, NR_ORDERS};
use free_lists::{FreeLists, Links};
use std::sync::Arc;
use tags::{Tag, TagTable};

/// What backs a reported block that is not known zero (see [`crate::MmConfig::reported_not_zero`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReportedNotZero {
    /// Its backing was discarded without a zero promise (a host without zero hints): the
    /// first touch faults, and the allocator zeroes it as well, so a zero-request takes
    /// it last, after reported known-zero blocks (which only fault).
    #[default]
    Discarded,
    /// The host keeps it resident (a hold not over yet, a lazy `MADV_FREE`): taking it
    /// back costs a memset and no fault, so a zero-request takes it before reported
    /// known-zero blocks (whose first touch faults every page in and grows RSS).
    Resident,
}

/// The order in which a request tries the four free states, one state at a time (each at
/// the smallest order that has one): resident blocks before reported ones — the first
/// touch of a discarded block faults it back in (the host zeroes it again), dearer than
/// zeroing resident memory, and Linux takes reported pages last too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Search([FreeState; 4]);

impl Search {
    /// A zero-request: known zero first within resident and within reported blocks.
    /// Reported blocks not known zero come before reported known-zero ones when the host
    /// keeps them resident (held, `MADV_FREE`): a memset without a fault beats faulting
    /// fresh pages in.
    const ZERO: Search = Search([
        FreeState::ZERO,
        FreeState::DIRTY,
        FreeState::REPORTED_ZERO,
        FreeState::REPORTED_DIRTY,
    ]);
    /// [`Search::ZERO`] when reported blocks that are not known zero are still resident.
    const ZERO_RESIDENT_HELD: Search = Search([
        FreeState::ZERO,
        FreeState::DIRTY,
        FreeState::REPORTED_DIRTY,
        FreeState::REPORTED_ZERO,
    ]);
    /// Any other request: dirty first within each (known-zero blocks are saved for
    /// zero-requests).
    pub(crate) const DIRTY: Search = Search([
        FreeState::DIRTY,
        FreeState::ZERO,
        FreeState::REPORTED_DIRTY,
        FreeState::REPORTED_ZERO,
    ]);

    /// The search of a request (`zeroed`: a zero-request) given what backs reported blocks
    /// that are not known zero.
    pub(crate) fn of(zeroed: bool, reported_not_zero: ReportedNotZero) -> Search {
        match (zeroed, reported_not_zero) {
            (false, _) => Search::DIRTY,
            (true, ReportedNotZero::Discarded) => Search::ZERO,
            (true, ReportedNotZero::Resident) => Search::ZERO_RESIDENT_HELD,
        }
    }
}

/// States a per-thread cache refill takes (dirty only), resident first.
const DIRTY_STATES: [FreeState; 2] = [FreeState::DIRTY, FreeState::REPORTED_DIRTY];
/// States the reporting engine isolates for a report: the unreported ones, dirty first.
pub(crate) const UNREPORTED_STATES: [FreeState; 2] = [FreeState::DIRTY, FreeState::ZERO];

/// A block isolated for reporting and the state it had on the free list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IsolatedBlock {
    /// The block (its pages are no longer on any free list).
    pub block: Block,
    /// Its state when it was isolated (never `reported`).
    pub state: FreeState,
}

/// Per-zone allocation counters, kept under the zone lock.
#[derive(Clone, Debug, Default)]
pub(crate) struct ZoneCounters {
    /// Successful allocations per order.
    pub allocs: [u64; NR_ORDERS],
    /// Successful frees per order (as given by the caller).
    pub frees: [u64; NR_ORDERS],
}

/// A buddy zone: frame table, free lists and page counts.
pub(crate) struct Zone {
    /// Which zone this is.
    pub id: ZoneId,
    /// The PFNs it manages.
    pub range: PageRange,
    /// Largest block order.
    pub max_order: Order,
    /// Low watermark in pages (the reporting engine skips the zone below it).
    pub low_watermark: u64,
    /// One entry per page of `range`.
    tags: Arc<TagTable>,
    /// List links, one per page (beside the pages, never in them).
    links: Links,
    /// Free lists threaded through `links`.
    lists: FreeLists,
    /// Pages in free blocks on the lists.
    free_pages: u64,
    /// Pages in isolated blocks.
    isolated_pages: u64,
    /// Counters for [`crate::Stats`].
    pub counters: ZoneCounters,
}

impl Zone {
    /// A zone whose pages are all free in `initial` state, carved into the largest aligned
    /// blocks that fit (edges not aligned to `max_order` become smaller blocks).
    pub fn new(
        id: ZoneId,
        range: PageRange,
        max_order: Order,
        low_watermark: u64,
        initial: FreeState,
    ) -> Zone {
        let frames = usize::try_from(range.pages).expect("a zone's frames fit in memory");
        let mut zone = Zone {
            id,
            range,
            max_order,
            low_watermark,
            tags: Arc::new(TagTable::new(frames)),
            links: Links::new(frames),
            lists: FreeLists::new(),
            free_pages: 0,
            isolated_pages: 0,
            counters: ZoneCounters::default(),
        };
        let mut pfn = range.start.0;
        let end = range.end().0;
        while pfn < end {
            // Largest order allowed by the alignment of `pfn` (absolute, as buddies are
            // found by XOR on the absolute PFN), by what remains, and by max_order.
            let align = if pfn == 0 { 63 } else { pfn.trailing_zeros() };
            let fit = 63 - (end - pfn).leading_zeros();
            let order = u8::try_from(align.min(fit).min(u32::from(max_order.get())))
                .ok()
                .and_then(|o| Order::new(o).ok())
                .unwrap_or(max_order);
            let idx = zone.idx(Pfn(pfn));
            zone.lists
                .push(&zone.tags, &mut zone.links, idx, order, initial);
            zone.free_pages += order.pages();
            pfn += order.pages();
        }
        zone
    }

    /// Frame-table index of `pfn` (which must be in the zone).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a zone has fewer than 2^32 frames (MemoryManager::new refuses larger ones), so frame indices and block sizes fit in u32"
    )]
    fn idx(&self, pfn: Pfn) -> u32 {
        (pfn.0 - self.range.start.0) as u32
    }

    /// PFN of frame-table index `idx`.
    fn pfn(&self, idx: u32) -> Pfn {
        Pfn(self.range.start.0 + idx as u64)
    }

    /// Takes a block of `order` off the free lists and marks it allocated: the states of
    /// `search` one after the other, each at the smallest order >= `order` that has one,
    /// splitting it if needed.
    pub fn take(&mut self, order: Order, search: Search) -> Option<(Block, FreeState)> {
        let (idx, state) = search
            .0
            .iter()
            .find_map(|&state| self.pop_split(&[state], order))?;
        self.tags.set(idx, Tag::Allocated { order });
        self.counters.allocs[order.index()] += 1;
        Some((Block::new(self.pfn(idx), order), state))
    }

    /// `__rmqueue_smallest`: takes the block of the smallest order >= `order` in one of
    /// `states` (first state wins at equal order) off its list and splits it down to
    /// `order`. Returns the head index (its tag is the caller's to set) and state.
    fn pop_split(&mut self, states: &[FreeState], order: Order) -> Option<(u32, FreeState)> {
        let (mut cur, state) = self.lists.smallest(states, order, self.max_order)?;
        let idx = self.lists.pop(&mut self.links, cur, state)?;
        // expand(): keep the lower half, give the upper half back; halves inherit the state.
        while cur > order {
            cur = cur.lower()?;
            let upper = idx + u32::try_from(cur.pages()).ok()?;
            self.lists
                .push(&self.tags, &mut self.links, upper, cur, state);
        }
        self.free_pages -= order.pages();
        Some((idx, state))
    }

    /// Undoes [`Zone::take`] for a block that must not be handed out after all (verify
    /// failure): back on the free lists in `state`, merged, allocation not counted.
    pub fn untake(&mut self, block: Block, state: FreeState) {
        self.counters.allocs[block.order.index()] -= 1;
        self.free_pages += block.order.pages();
        self.merge_insert(block, state);
    }

    /// The tag table, shared with per-thread caches.
    pub fn tags(&self) -> &Arc<TagTable> {
        &self.tags
    }

    /// Takes back a block from a per-thread cache (`free_pcppages_bulk`): it goes on the
    /// free lists in `state`, merged. Returns the merged block and state, or `None` (and
    /// changes nothing) if the frame is not a cached block of that order.
    pub fn return_from_cache(
        &mut self,
        pfn: Pfn,
        order: Order,
        state: FreeState,
    ) -> Option<(Block, FreeState)> {
        if !self.range.contains(pfn) {
            return None;
        }
        let idx = self.idx(pfn);
        self.tags
            .swap_if(idx, Tag::Cached { order, state }, Tag::Tail)
            .ok()?;
        self.free_pages += order.pages();
        Some(self.merge_insert(Block::new(pfn, order), state))
    }

    /// The block whose first frame is at or below `pfn` and covers it, with its tag.
    fn containing(&self, pfn: Pfn) -> Option<(Block, Tag)> {
        for order in Order::ZERO.up_to(self.max_order) {
            let head = Pfn(pfn.0 & !(order.pages() - 1));
            if head < self.range.start {
                break;
            }
            let tag = self.tags.get(self.idx(head));
            let Some(head_order) = tag.order() else {
                continue;
            };
            if head.0 + head_order.pages() > pfn.0 {
                return Some((Block::new(head, head_order), tag));
            }
        }
        None
    }

    /// Checks that `block` is exactly an allocated block of this zone.
    pub fn check_allocated(&self, block: Block) -> Result<(), FreeError> {
        if block.order > self.max_order {
            return Err(FreeError::OrderTooLarge {
                order: block.order,
                max: self.max_order,
            });
        }
        if !self.range.contains(block.pfn) {
            return Err(FreeError::NotOwned(block.pfn));
        }
        if !self.range.contains_range(&block.range()) {
            return Err(FreeError::OutOfZone(block));
        }
        if !block.is_aligned() {
            return Err(FreeError::Unaligned(block));
        }
        let (found, tag) = self
            .containing(block.pfn)
            .ok_or(FreeError::NotOwned(block.pfn))?;
        match tag {
            Tag::Allocated { order } if found.pfn == block.pfn && order == block.order => Ok(()),
            Tag::Allocated { order } if found.pfn == block.pfn => Err(FreeError::WrongOrder {
                block,
                allocated: order,
            }),
            Tag::Allocated { .. } => Err(FreeError::NotBlockStart {
                block,
                allocated: found,
            }),
            // Free on a list or in a per-thread cache: freed already.
            Tag::Free { .. } | Tag::Cached { .. } => {
                Err(FreeError::DoubleFree { block, free: found })
            }
            Tag::Isolated { .. } => Err(FreeError::Isolated {
                block,
                isolated: found,
            }),
            // `containing` never returns a tail.
            Tag::Tail => Err(FreeError::NotOwned(block.pfn)),
        }
    }

    /// Frees an allocated block with `state` (checked first: on error nothing changes).
    /// Returns the merged block and its state.
    pub fn free(
        &mut self,
        block: Block,
        state: FreeState,
    ) -> Result<(Block, FreeState), FreeError> {
        let allocated = Tag::Allocated { order: block.order };
        if !self.is_allocated_head(block) {
            // Not the head of an allocated block of its order: name what it is (a head
            // tag is what `check_allocated` finds first, so this is only the slow way).
            self.check_allocated(block)?;
        }
        let idx = self.idx(block.pfn);
        if block.order > crate::PCP_MAX_ORDER {
            // No cache ever writes the tag of such a block: the zone lock serialises it.
            self.tags.set(idx, Tag::Tail);
        } else if self.tags.swap_if(idx, allocated, Tag::Tail).is_err() {
            // A per-thread cache freed the same block concurrently (a caller bug): exactly
            // one of the two compare-and-swaps wins, the other reports the double free.
            self.check_allocated(block)?;
        }
        self.counters.frees[block.order.index()] += 1;
        self.free_pages += block.order.pages();
        Ok(self.merge_insert(block, state))
    }

    /// Whether `block` is exactly the head of an allocated block of its order (the fast
    /// check of [`Zone::free`]).
    #[inline]
    fn is_allocated_head(&self, block: Block) -> bool {
        block.order <= self.max_order
            && self.range.contains_range(&block.range())
            && block.is_aligned()
            && self.tags.get(self.idx(block.pfn)) == Tag::Allocated { order: block.order }
    }

    /// `__free_one_page`: merges `block` (no longer allocated/isolated) with free buddies of
    /// the same order as far as possible, then puts the result on its free list.
    fn merge_insert(&mut self, block: Block, state: FreeState) -> (Block, FreeState) {
        let (mut pfn, mut order, mut state) = (block.pfn, block.order, state);
        while order < self.max_order {
            // The buddy differs from the block only in the bit of its size.
            let buddy = Pfn(pfn.0 ^ order.pages());
            // Zone edges not aligned to this order: the buddy is outside, no merge.
            if !self
                .range
                .contains_range(&PageRange::new(buddy, order.pages()))
            {
                break;
            }
            let bidx = self.idx(buddy);
            let Tag::Free {
                order: b_order,
                state: b_state,
            } = self.tags.get(bidx)
            else {
                // Buddy allocated, isolated, or a tail of something: stop here.
                break;
            };
            if b_order != order {
                // Buddy's head is free but split smaller: its other parts are not free.
                break;
            }
            self.lists.remove(&mut self.links, bidx, b_order, b_state);
            // docs/ARCHITECTURE.md §3: known_zero = a ∧ b, reported = a ∧ b.
            state = state.merge(b_state);
            // The upper buddy's head frame becomes a tail of the merged block.
            let upper = pfn.max(buddy);
            let uidx = self.idx(upper);
            self.tags.set(uidx, Tag::Tail);
            pfn = pfn.min(buddy);
            order = order.higher().unwrap_or(order);
        }
        let idx = self.idx(pfn);
        self.lists
            .push(&self.tags, &mut self.links, idx, order, state);
        (Block::new(pfn, order), state)
    }

    /// `__isolate_free_page` for reporting: takes free blocks in one of `states` of orders
    /// `min_order..=max_order` off the free lists (ascending order, then `states` in the
    /// given order) until `out` holds `max_blocks`, marks them isolated and appends them to
    /// `out`. No allocation can get them until [`Zone::put_back`].
    pub fn isolate(
        &mut self,
        states: &[FreeState],
        min_order: Order,
        max_order: Order,
        max_blocks: usize,
        out: &mut Vec<IsolatedBlock>,
    ) {
        let max_order = max_order.min(self.max_order);
        if min_order > max_order {
            return;
        }
        for order in min_order.up_to(max_order) {
            for &state in states {
                while out.len() < max_blocks {
                    let Some(idx) = self.lists.pop(&mut self.links, order, state) else {
                        break;
                    };
                    self.tags.set(idx, Tag::Isolated { order, state });
                    self.free_pages -= order.pages();
                    self.isolated_pages += order.pages();
                    out.push(IsolatedBlock {
                        block: Block::new(self.pfn(idx), order),
                        state,
                    });
                }
            }
        }
    }

    /// State an isolated `block` had when isolated, or `None` if it is not exactly an
    /// isolated block.
    pub fn isolated_state(&self, block: Block) -> Option<FreeState> {
        if !self.range.contains_range(&block.range()) || !block.is_aligned() {
            return None;
        }
        match self.tags.get(self.idx(block.pfn)) {
            Tag::Isolated { order, state } if order == block.order => Some(state),
            _ => None,
        }
    }

    /// `__putback_isolated_page`: returns an isolated block (checked by the caller with
    /// [`Zone::isolated_state`]) to the free lists in `state`, merging with free buddies.
    pub fn put_back(&mut self, block: Block, state: FreeState) -> (Block, FreeState) {
        self.isolated_pages -= block.order.pages();
        self.free_pages += block.order.pages();
        self.merge_insert(block, state)
    }

    /// Free blocks lying entirely inside `range` that are not known zero (blocks only
    /// partly inside are not split: the hint is ignored for them).
    pub fn free_blocks_not_zero_in(&self, range: PageRange) -> Vec<(Block, FreeState)> {
        let mut found = Vec::new();
        let mut pfn = range.start;
        while pfn < range.end() {
            let Some((block, tag)) = self.containing(pfn) else {
                pfn = Pfn(pfn.0 + 1);
                continue;
            };
            if let Tag::Free { state, .. } = tag {
                if !state.known_zero && range.contains_range(&block.range()) {
                    found.push((block, state));
                }
            }
            pfn = block.range().end();
        }
        found
    }

    /// Sets `known_zero` on a free block returned by [`Zone::free_blocks_not_zero_in`]
    /// (reported unchanged). Moves it to the matching list.
    pub fn set_known_zero(&mut self, block: Block, state: FreeState) {
        let idx = self.idx(block.pfn);
        self.lists.remove(&mut self.links, idx, block.order, state);
        let zero = FreeState {
            known_zero: true,
            ..state
        };
        self.lists
            .push(&self.tags, &mut self.links, idx, block.order, zero);
    }

    /// Snapshot for the reporting engine and stats.
    pub fn info(&self) -> ZoneInfo {
        let mut nr_free = [FreeCounts::default(); NR_ORDERS];
        for order in Order::ZERO.up_to(self.max_order) {
            for state in FreeState::ALL {
                nr_free[order.index()].set(state, self.lists.count(order, state));
            }
        }
        ZoneInfo {
            id: self.id,
            range: self.range,
            max_order: self.max_order,
            free_pages: self.free_pages,
            isolated_pages: self.isolated_pages,
            allocated_pages: self.range.pages - self.free_pages - self.isolated_pages,
            cached_pages: 0,
            low_watermark: self.low_watermark,
            nr_free,
        }
    }

    /// Free state of the block containing `pfn`, if that block is free (for tests/tools).
    pub fn state_of(&self, pfn: Pfn) -> Option<(Block, FreeState)> {
        match self.containing(pfn)? {
            (block, Tag::Free { state, .. }) => Some((block, state)),
            _ => None,
        }
    }
}

impl Zone {
    /// Grows allocated `block` (checked, aligned to `order`, inside the zone) to `order`
    /// by taking its upper buddies off the free lists, if every one is a whole free block;
    /// whether it did (nothing changes otherwise).
    pub fn grow(&mut self, block: Block, order: Order) -> bool {
        let uppers: Vec<(u32, Order, FreeState)> = block
            .order
            .up_to(order)
            .take_while(|&o| o < order)
            .map_while(|o| {
                let idx = self.idx(Pfn(block.pfn.0 + o.pages()));
                match self.tags.get(idx) {
                    Tag::Free { order: b, state } if b == o => Some((idx, o, state)),
                    _ => None,
                }
            })
            .collect();
        if uppers.len() != (order.get() - block.order.get()) as usize {
            return false;
        }
        for (idx, o, state) in uppers {
            self.lists.remove(&mut self.links, idx, o, state);
            self.tags.set(idx, Tag::Tail);
            self.free_pages -= o.pages();
        }
        self.tags.set(self.idx(block.pfn), Tag::Allocated { order });
        // As if the block had been freed and the grown one allocated.
        self.counters.frees[block.order.index()] += 1;
        self.counters.allocs[order.index()] += 1;
        true
    }
}
