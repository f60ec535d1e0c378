//! The kept lists of every slot, their [`SlotGuard`], and the kept counters that only a
//! slot's guard writes ([`SlotCounters`]): the pieces of [`super`] that its rules rest on.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use zeronce_mem::{BiasedGuard, BiasedLock};
use zeronce_mm::{Order, Stats, PAGE_SIZE, PCP_MAX_ORDER};
use zeronce_types::HUGE_PAGE_2M;

use crate::threads::{alone_on_my_slot, slot_index, Padded, PerThread, NUMBERS};

/// The huge-page order: 2 MiB blocks.
pub(crate) const HUGE_ORDER: Order =
    match Order::new((HUGE_PAGE_2M / PAGE_SIZE as usize).ilog2() as u8) {
        Ok(o) => o,
        Err(_) => panic!("2 MiB is a valid order"),
    };

/// Kept lists of one slot, most recent last: one per order up to [`PCP_MAX_ORDER`], then
/// one of [`HUGE_ORDER`].
pub(super) const LISTS: usize = PCP_MAX_ORDER.index() + 2;

/// The kept list of [`HUGE_ORDER`].
pub(super) const HUGE_LIST: usize = LISTS - 1;

/// The kept list of `order`, if blocks of that order are kept.
#[inline]
pub(super) fn list_of(order: Order) -> Option<usize> {
    if order <= PCP_MAX_ORDER {
        Some(order.index())
    } else if order == HUGE_ORDER {
        Some(HUGE_LIST)
    } else {
        None
    }
}

/// The order of the blocks of kept list `list`.
pub(super) fn list_order(list: usize) -> Order {
    match u8::try_from(list).ok().and_then(|o| Order::new(o).ok()) {
        Some(o) if list < HUGE_LIST => o,
        _ => HUGE_ORDER,
    }
}

/// The kept lists of one slot, and its husks.
struct Lists<E> {
    kept: [Vec<E>; LISTS],
    /// Entries of huge blocks that went back to the manager, their claims taken out,
    /// whose owner references carry the next blocks taken together (see [`super::drain`]),
    /// most recent last; an entry is taken only by its own owner, never as a block.
    husks: Vec<E>,
}

/// Every slot's kept lists (a `static` per entry type; see [`super`]'s docs).
pub(crate) struct Slots<E>([Padded<BiasedLock<Lists<E>>>; NUMBERS]);

impl<E> Slots<E> {
    /// Empty lists.
    pub(crate) const fn new() -> Self {
        Slots(
            [const {
                Padded(BiasedLock::new(Lists {
                    kept: [const { Vec::new() }; LISTS],
                    husks: Vec::new(),
                }))
            }; NUMBERS],
        )
    }
}

/// One slot's kept lists, taken: the only way to reach them and the kept counters of
/// that slot.
pub(crate) struct SlotGuard<E: 'static> {
    slot: usize,
    lists: BiasedGuard<'static, Lists<E>>,
}

impl<E> SlotGuard<E> {
    /// The calling thread's slot of `slots`, if no other thread holds it now.
    #[inline(always)]
    pub(super) fn try_mine(slots: &'static Slots<E>) -> Option<Self> {
        let slot = slot_index();
        let lists = slots.0[slot].0.try_lock_favouring_if(alone_on_my_slot)?;
        Some(SlotGuard { slot, lists })
    }

    /// Slot `slot` of `slots`, waiting out its holder (who holds it for one list
    /// operation); the slot stays biased to its thread (see [`BiasedLock::lock`]).
    pub(super) fn wait(slots: &'static Slots<E>, slot: usize) -> Self {
        SlotGuard {
            slot,
            lists: slots.0[slot].0.lock(),
        }
    }

    /// The slot's kept list `list`.
    #[inline]
    pub(super) fn list(&mut self, list: usize) -> &mut Vec<E> {
        &mut self.lists.kept[list]
    }

    /// The slot's husks.
    #[inline]
    pub(super) fn husks(&mut self) -> &mut Vec<E> {
        &mut self.lists.husks
    }

    /// The slot's kept list `list` and its husks, together.
    #[inline]
    pub(super) fn list_and_husks(&mut self, list: usize) -> (&mut Vec<E>, &mut Vec<E>) {
        let lists = &mut *self.lists;
        (&mut lists.kept[list], &mut lists.husks)
    }
}

/// Counters of one slot's kept blocks of one owner.
#[derive(Default)]
struct KeptCounters {
    /// Allocations served from a kept list, and frees into one that have not reached
    /// the manager: the manager does not count them.
    allocs: [AtomicU64; LISTS],
    frees: [AtomicU64; LISTS],
    /// Bytes in kept lists freed by their owners (the zero map counts them once they
    /// reach the manager).
    freed_bytes: AtomicU64,
    /// Huge blocks the slot may keep beyond the base limit (see [`super`], "Bounds").
    huge_extra: AtomicU64,
}

/// Adds `by` to a counter only one thread writes at a time.
#[inline]
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
}

/// Each slot's kept counters of one owner. Written only with that slot's
/// [`SlotGuard`], so a plain load and store each (no read-modify-write); read by
/// anyone.
pub(super) struct SlotCounters(PerThread<KeptCounters>);

impl SlotCounters {
    /// Zero counters for every slot.
    pub(super) fn new() -> Self {
        SlotCounters(PerThread::new(KeptCounters::default))
    }

    /// Number of slots.
    pub(super) fn slots(&self) -> usize {
        self.0.len()
    }

    /// The guarded slot's counters.
    #[inline]
    fn of<E>(&self, guard: &SlotGuard<E>) -> Option<&KeptCounters> {
        self.0.get(guard.slot)
    }

    /// An allocation served from the guarded slot's list `list`.
    #[inline]
    pub(super) fn count_take<E>(&self, guard: &SlotGuard<E>, list: usize) {
        if let Some(c) = self.of(guard) {
            bump(&c.allocs[list], 1);
        }
    }

    /// A block of `order` freed into the guarded slot's list `list`.
    #[inline]
    pub(super) fn count_keep<E>(&self, guard: &SlotGuard<E>, list: usize, order: Order) {
        if let Some(c) = self.of(guard) {
            bump(&c.frees[list], 1);
            bump(&c.freed_bytes, order.bytes());
        }
    }

    /// `n` blocks the manager just allocated (and counted) went onto the guarded slot's
    /// list `list` without a free: their take from the list is the allocation the manager
    /// counted (so it is taken back here), and one given back unused is a free the
    /// manager counts against the kept free [`SlotCounters::count_given_back`] takes back.
    /// A counter may so dip below zero for a while: the sums wrap.
    pub(super) fn count_refill<E>(&self, guard: &SlotGuard<E>, list: usize, n: u64) {
        if let Some(c) = self.of(guard) {
            bump(&c.allocs[list], n.wrapping_neg());
        }
    }

    /// `n` blocks of the guarded slot's list `list` go back to the manager, which
    /// counts their frees and the zero map their bytes.
    pub(super) fn count_given_back<E>(&self, guard: &SlotGuard<E>, list: usize, n: u64) {
        if let Some(c) = self.of(guard) {
            bump(&c.frees[list], n.wrapping_neg());
            bump(
                &c.freed_bytes,
                (n * list_order(list).bytes()).wrapping_neg(),
            );
        }
    }

    /// Huge blocks the guarded slot may keep beyond the base limit.
    #[inline]
    pub(super) fn huge_extra<E>(&self, guard: &SlotGuard<E>) -> usize {
        self.of(guard)
            .map_or(0, |c| c.huge_extra.load(Relaxed) as usize)
    }

    /// An allocation of a huge block on the guarded slot found none kept: the slot may
    /// keep one more, up to `most` beyond the base limit (Linux raises `pcp->high` by a
    /// batch at each refill, up to `high_max`).
    pub(super) fn raise_huge_extra<E>(&self, guard: &SlotGuard<E>, most: usize) {
        if let Some(c) = self.of(guard) {
            let now = c.huge_extra.load(Relaxed);
            if now < most as u64 {
                c.huge_extra.store(now + 1, Relaxed);
            }
        }
    }

    /// The guarded slot's kept lists were emptied: back to the base limit (Linux decays
    /// `pcp->high` towards `high_min`).
    pub(super) fn reset_huge_extra<E>(&self, guard: &SlotGuard<E>) {
        if let Some(c) = self.of(guard) {
            c.huge_extra.store(0, Relaxed);
        }
    }

    /// Adds the allocations and frees kept blocks served to the manager's `stats`.
    pub(super) fn add_to(&self, stats: &mut Stats) {
        for c in self.0.iter() {
            for list in 0..LISTS {
                let o = list_order(list).index();
                stats.allocs[o] = stats.allocs[o].wrapping_add(c.allocs[list].load(Relaxed));
                stats.frees[o] = stats.frees[o].wrapping_add(c.frees[list].load(Relaxed));
            }
        }
    }

    /// Bytes freed into kept lists that have not reached the manager.
    pub(super) fn freed_bytes(&self) -> u64 {
        self.0
            .iter()
            .map(|c| c.freed_bytes.load(Relaxed))
            .fold(0, u64::wrapping_add)
    }
}
