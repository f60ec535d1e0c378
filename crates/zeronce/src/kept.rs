//! Blocks their owners freed dirty, kept for the next allocation of their order on the
//! same slot, with the block's reference to its owner: the fastest path of
//! [`crate::ProcessMemory`] and [`crate::VmMemory`] (see [`crate::caches`] for the whole
//! fast path).
//!
//! A freed block of order up to [`PCP_MAX_ORDER`], or of the huge-page order, stays
//! allocated in the manager and claimed, and moves as a whole ([`Entry`]: owner reference,
//! allocation, claimed bytes) into a list of the freeing thread's slot; the next non-zero
//! allocation of that order on the slot moves it out again into a new
//! [`crate::PageBlock`]. So taking and keeping a
//! block costs one atomic swap (the slot's try-lock) and no reference counting. The lists
//! are static (every owner's entries share them) because an owner cannot hold a list its
//! entries' references are moved into while they are borrowed from it.
//!
//! Entries keep their owner alive, so an owner closes when its last handle goes
//! ([`crate::managed::Owners`]): its entries are given back and no block is kept for it
//! again. Each slot keeps at most the owner's limit per order; entries go back to the
//! manager through [`take_all`] (reporting passes, flush, counters, an allocation that
//! would fail, close).

use try_lock::{Locked, TryLock};
use zeronce_mm::{Order, PCP_MAX_ORDER};

use crate::caches::{lock_slot, ThreadCaches, HUGE_ORDER};
use crate::managed::{Held, OwnerRef};
use crate::threads::{slot_index, Padded, NUMBERS};

/// A kept block: everything a [`crate::PageBlock`] holds, moved in and out as it is.
pub(crate) type Entry = Held;

/// Kept lists of one slot, most recent last: one per order up to [`PCP_MAX_ORDER`], then
/// one of [`HUGE_ORDER`].
pub(crate) const LISTS: usize = PCP_MAX_ORDER.index() + 2;

/// The kept list of `order`, if blocks of that order are kept.
#[inline]
fn list_of(order: Order) -> Option<usize> {
    if order <= PCP_MAX_ORDER {
        Some(order.index())
    } else if order == HUGE_ORDER {
        Some(LISTS - 1)
    } else {
        None
    }
}

/// The order of the blocks of kept list `list`.
pub(crate) fn list_order(list: usize) -> Order {
    match u8::try_from(list).ok().and_then(|o| Order::new(o).ok()) {
        Some(o) if list < LISTS - 1 => o,
        _ => HUGE_ORDER,
    }
}

type Lists = [Vec<Entry>; LISTS];

/// Every slot's lists.
static SLOTS: [Padded<TryLock<Lists>>; NUMBERS] =
    [const { Padded(TryLock::new([const { Vec::new() }; LISTS])) }; NUMBERS];

/// The calling thread's slot and its lists, if no other thread holds them now.
#[inline]
fn try_mine() -> Option<(usize, Locked<'static, Lists>)> {
    let slot = slot_index();
    SLOTS[slot].0.try_lock().map(|lists| (slot, lists))
}

/// A kept block of `order` of `owner` for the calling thread, if its slot's most recent
/// one of that order is `owner`'s.
#[inline]
pub(crate) fn take(owner: &OwnerRef, order: Order) -> Option<Entry> {
    pop_mine(owner, order, |caches, slot, list| {
        caches.count_kept_alloc(slot, list)
    })
}

/// [`take`] for a block going back to the manager (which counts its free).
pub(crate) fn take_back(owner: &OwnerRef, order: Order) -> Option<Entry> {
    pop_mine(owner, order, |caches, slot, list| {
        caches.uncount_kept_frees(slot, list, 1)
    })
}

/// Pops the calling thread's slot's most recent block of `order` if it is `owner`'s,
/// counting it with `count` (caches, slot, list) under the slot's lock.
#[inline]
fn pop_mine(
    owner: &OwnerRef,
    order: Order,
    count: impl FnOnce(&ThreadCaches, usize, usize),
) -> Option<Entry> {
    let list = list_of(order)?;
    let (slot, mut lists) = try_mine()?;
    let last = lists[list].last()?;
    if !last.owner.same_owner(owner) {
        return None;
    }
    count(last.owner.caches(), slot, list);
    lists[list].pop()
}

/// Keeps a block its owner freed dirty on the calling thread's slot; back to the caller
/// when its order is not kept, its owner is closed, the slot keeps enough of that order or
/// is busy.
#[inline]
pub(crate) fn keep(mut entry: Entry) -> Result<(), Entry> {
    let order = entry.alloc.block().order;
    let Some(list) = list_of(order) else {
        return Err(entry);
    };
    let Some((slot, mut lists)) = try_mine() else {
        return Err(entry);
    };
    let caches = entry.owner.caches();
    // Checked under the slot's lock: closing sets the flag, then empties every slot.
    if caches.is_closed() || lists[list].len() >= caches.kept_limit(list) {
        return Err(entry);
    }
    caches.count_kept_free(slot, list, order);
    // What the next owner gets: a dirty block, not zeroed for it (written only when it
    // differs: a block kept before already says so, and the line stays clean).
    let reused = entry.alloc.reused();
    if entry.alloc != reused {
        entry.alloc = reused;
    }
    if order > PCP_MAX_ORDER {
        // Schedules a reporting pass (which gives the block back first) as its free to
        // the zone would have; the pass comes after the reporting delay.
        caches.kept_block();
    }
    lists[list].push(entry);
    Ok(())
}

/// Takes every entry of the owner whose fast path is `caches` out of every slot (waiting
/// for each slot's holder, who holds it for one list operation).
pub(crate) fn take_all(caches: &ThreadCaches) -> Vec<Entry> {
    let mut out = Vec::new();
    for (i, slot) in SLOTS.iter().enumerate().take(caches.slots()) {
        let mut lists = lock_slot(&slot.0);
        for (list, entries) in lists.iter_mut().enumerate() {
            let before = out.len();
            let mut k = 0;
            while k < entries.len() {
                if std::ptr::eq(entries[k].owner.caches(), caches) {
                    out.push(entries.remove(k));
                } else {
                    k += 1;
                }
            }
            caches.uncount_kept_frees(i, list, (out.len() - before) as u64);
        }
    }
    out
}
