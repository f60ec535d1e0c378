//! [`ThreadCaches`]: the fast path of [`crate::ProcessMemory`] and [`crate::VmMemory`],
//! Linux's per-CPU page lists in user space. This module owns every rule of the fast
//! path; they are stated here once.
//!
//! **Slots.** A handful of slots, one per CPU the process may run on; a thread always uses
//! the same slot ([`crate::threads::slot_index`]), live threads are spread over them. As
//! Linux's `pcp_spin_trylock`, a slot is only ever *tried*: a thread that finds its slot
//! busy (another thread on it, or a drain) goes to the manager for that call instead of
//! waiting, so no thread spins or sleeps on a slot on the allocation path. A slot's kept
//! lists are behind a [`zeronce_mem::BiasedLock`] (its [`PcpCache`] behind a plain
//! test-and-set one): the thread alone on the slot that took it 64 times in a row is
//! *favoured* and takes and gives it back with plain stores (no locked
//! instruction, which on x86 waits for the store buffer); any other thread takes it with
//! one atomic swap and, while a thread is favoured, one `membarrier` that waits the
//! favoured thread out. A second user of the slot takes the favour away; a drain (the
//! reporting thread's, `flush`, `stats`, close) leaves it.
//!
//! **Two layers per slot.**
//! - *Kept blocks*: blocks their owners freed dirty, of an order up to [`PCP_MAX_ORDER`]
//!   or of [`HUGE_ORDER`] (Linux keeps orders up to `PAGE_ALLOC_COSTLY_ORDER` and
//!   `pageblock_order` on its per-CPU lists). A kept block stays allocated in the manager
//!   and claimed, and moves as a whole ([`Keep`]: its owner reference, allocation and
//!   claimed bytes) into a list of the freeing thread's slot; the next non-zero
//!   allocation of that order on the slot moves it out again. No manager call, no byte
//!   claim, no chunk-state change, no reference counting. A kept block is in use as far
//!   as everything else knows: its chunk stays `Used` and its pages written, so no zeroer
//!   touches it, no zero claim is made for it and a vouched-for zero tail is forgotten.
//!   Zero-requests never take one.
//! - *Cached blocks*: a [`PcpCache`] per slot, free blocks of orders up to
//!   [`PCP_MAX_ORDER`] taken from and given back to the zone in batches. Only dirty
//!   blocks enter and zero-requests bypass it, so a cached block never carries a "known
//!   zero" it could lose.
//!
//! **The kept lists are static** ([`Slots`], one set shared by every owner; an entry is
//! taken only by its own owner), because an owner cannot hold a list its entries'
//! references are moved into while they are borrowed from it. The lists of a slot are
//! reached only through a [`SlotGuard`], and the counters of that slot's kept blocks are
//! written only with it: each owner's counters per slot ([`SlotCounters`]) can be written
//! only by methods that take the guard, so a plain load and store each (no
//! read-modify-write). Both live in [`slots`], where nothing else can reach inside them.
//!
//! **Bounds.** Kept and cached blocks are neither merged nor reported, so both are
//! bounded per slot: per small order one cache batch (`pcp_batch_pages`, at most 1/64 of
//! the memory) kept and `pcp_high_pages` cached; [`KEPT_HUGE_BYTES`] of huge blocks kept
//! (at most 1/64 of the memory, none while a background zeroer runs: there a freed chunk
//! is meant to be zeroed off the allocation path at once). The huge limit adapts as
//! Linux's `pcp->high` does (auto-tuned between `high_min` and `high_max`): every huge
//! allocation that finds none of its owner's kept on its slot lets the slot keep one
//! more, up to an eighth of the memory shared by the slots (Linux's `high_max`), and
//! every drain of the slot takes it back to the base. A free into a full huge list gives
//! the list's blocks (up to a batch, oldest first) back to the manager together, under
//! one zone lock ([`drain`], Linux's `free_pcppages_bulk` in its `free_high` mode), and
//! keeps the freed block.
//! The other way, a dirty huge allocation that finds none kept takes up to as many
//! resident dirty blocks from the manager under one zone lock as its slot has room for
//! beside the one it returns, and keeps those ([`refill`], Linux's `rmqueue_bulk`).
//! Both change their blocks' chunk states and byte claims together (one atomic step for
//! the 2 MiB blocks of one 16 MiB-aligned stretch), and a drained entry stays on its slot
//! as a *husk* (claim taken out, owner reference kept; never a block, taken only by its
//! owner's refill, at most as many as the list keeps), so the blocks a refill takes move
//! into husks with no owner reference counted up or down. A drain of a whole list onto
//! no husks, and a refill of an empty list from husks all its owner's, swap the list's
//! and the husks' vectors instead of moving entries one by one.
//!
//! **The way back.** Every allocated block reaches the manager through one function,
//! [`ThreadCaches::give_back`], whoever frees it: a handle's free, or a kept block going
//! back as if its owner freed it then (chunks `Dirty`, zeroer woken). Kept blocks go
//! back before every reporting pass (keeping a huge block schedules one, as its free to
//! the zone could have, whatever the reporting order), on [`ThreadCaches::drain`] (flush,
//! stats: counts are then exact, and prezero), when an allocation would otherwise fail,
//! and when the owner closes.
//!
//! **Closing.** Kept entries hold references to their owner, so the owner closes when its
//! last handle goes ([`ThreadCaches::close`]): every kept block goes back and none is kept
//! again (checked under the slot's guard: closing sets the flag, then empties every
//! slot of its kept blocks and its husks). Closing and the reporting thread's give-back
//! are serialized, so the reporting thread never drops the last reference (which would
//! join it from itself).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

use zeronce_mem::BiasedLock;
use zeronce_mem::SharedRam;
use zeronce_mm::reporting::{ManagerHooks, Notifier};
use zeronce_mm::sync::lock;
use zeronce_mm::{
    AllocError, AllocRequest, Allocation, Block, FreeError, FreeHint, MemoryManager, Order,
    PcpCache, Stats, Zeroing, PAGE_SIZE, PCP_MAX_ORDER,
};

use crate::claimed::ClaimedBytes;
use crate::threads::PerThread;
use crate::zeroing::Lifecycle;

mod drain;
mod refill;
mod slots;
use slots::{list_of, list_order, SlotCounters, SlotGuard, HUGE_LIST, LISTS};
pub(crate) use slots::{Slots, HUGE_ORDER};

/// Most bytes of huge blocks one slot keeps (at most 1/64 of the memory).
pub(crate) const KEPT_HUGE_BYTES: u64 = 16 << 20;

/// What a kept list holds: an allocated, claimed block with its owner reference, moved in
/// and out as it is (the handle module's block contents).
pub(crate) trait Keep: Send + Sized + 'static {
    /// Every slot's kept lists of this type.
    fn slots() -> &'static Slots<Self>;
    /// The owner's fast path (its identity, too: one per owner).
    fn caches(&self) -> &ThreadCaches<Self>;
    /// The block's order.
    fn order(&self) -> Order;
    /// Forgets how it was allocated: the next owner gets a dirty block, not zeroed for it.
    fn reuse(&mut self);
    /// The block and its claimed bytes, on their way back to the manager.
    fn into_claim(self) -> (Block, ClaimedBytes);
    /// The block and its claimed bytes, taken out (the owner reference stays: a husk).
    fn take_claim(&mut self) -> (Block, ClaimedBytes);
    /// A husk carries a new block: `alloc`, its claimed `bytes`.
    fn refill(&mut self, alloc: Allocation, bytes: ClaimedBytes);
}

/// Whether [`ThreadCaches::give_back`] looks a freed block up in the page tables: the
/// pages with no page of the process's own behind them read zero, whatever the holder
/// was allowed to do ([`crate::zeroing::Lifecycle::freed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageTables {
    /// Some pages may have had none when the block was handed out (fresh, reported, or
    /// known zero without a write: the zero map's or the zeroer's), so may still have none.
    Look,
    /// Every page had one when the block was handed out (zeroed on the allocation path, or
    /// resident dirty), and a page keeps it: a look would find them all.
    Skip,
}

impl PageTables {
    /// What `alloc` tells of its block's pages when it was handed out.
    pub(crate) fn of(alloc: &Allocation) -> PageTables {
        let backed = match alloc.zeroing {
            Zeroing::Done => true,
            Zeroing::Skipped => false,
            Zeroing::NotRequested => !alloc.prior.known_zero && !alloc.prior.reported,
        };
        if backed {
            PageTables::Skip
        } else {
            PageTables::Look
        }
    }
}

/// Where [`ThreadCaches::give_back`] sends a block.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// The calling thread's cache if it takes the block (small, dirty, slot free), else
    /// the manager.
    Cache,
    /// The manager (a drain, or a block the caches must not hold again).
    Manager,
}

/// Per-thread caches in front of one manager (see the module docs); `E` is what its kept
/// lists hold.
pub(crate) struct ThreadCaches<E> {
    pcp: PerThread<BiasedLock<PcpCache<Arc<MemoryManager>>>>,
    /// Most blocks kept per slot, per kept list, at first (the base limit).
    kept_limit: [usize; LISTS],
    /// Most huge blocks a slot may keep beyond its base limit.
    huge_extra_max: usize,
    /// Counters of the kept blocks, per slot.
    counters: SlotCounters,
    /// Set when the owner's last handle is gone: no block is kept for it any more.
    closed: AtomicBool,
    /// Held while kept blocks go back from the reporting thread, and while closing.
    giving_back: Mutex<()>,
    mm: Arc<MemoryManager>,
    ram: Arc<SharedRam>,
    /// The zero-once lifecycle (process mode): every free goes through it.
    life: Option<Arc<Lifecycle>>,
    /// Wakes the reporting worker when a huge block is kept, with the reporting order.
    report: OnceLock<(Notifier, Order)>,
    kept: PhantomData<fn() -> E>,
}

impl<E: Keep> ThreadCaches<E> {
    /// One slot per CPU this process may run on, in front of `mm` over `ram`.
    pub(crate) fn new(
        mm: &Arc<MemoryManager>,
        ram: &Arc<SharedRam>,
        life: Option<Arc<Lifecycle>>,
    ) -> Self {
        let total = mm.total_pages();
        let small = mm.config().pcp_batch_pages.min(total / 64);
        let keep_huge =
            life.as_ref().is_none_or(|l| l.zeroer.is_none()) && HUGE_ORDER <= mm.config().max_order;
        let huge = if keep_huge {
            KEPT_HUGE_BYTES.min(total * PAGE_SIZE / 64) / HUGE_ORDER.bytes()
        } else {
            0
        };
        let fit = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let counters = SlotCounters::new();
        // Linux's `high_max`: an eighth of the memory, shared by the slots.
        let huge_max = if huge == 0 {
            0
        } else {
            (total * PAGE_SIZE / 8 / counters.slots() as u64 / HUGE_ORDER.bytes()).max(huge)
        };
        ThreadCaches {
            pcp: PerThread::new(|| BiasedLock::new(PcpCache::new(Arc::clone(mm)))),
            kept_limit: std::array::from_fn(|list| match list_order(list) {
                o if o == HUGE_ORDER => fit(huge),
                o => fit(small >> o.get()).max(1),
            }),
            huge_extra_max: fit(huge_max - huge),
            counters,
            closed: AtomicBool::new(false),
            giving_back: Mutex::new(()),
            mm: Arc::clone(mm),
            ram: Arc::clone(ram),
            life,
            report: OnceLock::new(),
            kept: PhantomData,
        }
    }

    /// The manager.
    pub(crate) fn manager(&self) -> &Arc<MemoryManager> {
        &self.mm
    }

    /// The RAM the blocks are claimed from.
    #[inline]
    pub(crate) fn ram(&self) -> &Arc<SharedRam> {
        &self.ram
    }

    /// The zero-once lifecycle (process mode).
    #[inline]
    pub(crate) fn life(&self) -> Option<&Lifecycle> {
        self.life.as_deref()
    }

    /// Wakes `notifier`, whose reporting order is `order`, when a huge block is kept.
    pub(crate) fn set_report_notifier(&self, notifier: Notifier, order: Order) {
        if self.report.set((notifier, order)).is_err() {
            tracing::error!("a second reporting notifier for one cache was ignored");
        }
    }

    /// A kept block of `order` for the calling thread, if its slot's most recent one of
    /// that order is this owner's; counted as an allocation.
    #[inline(always)]
    pub(crate) fn take(&self, order: Order) -> Option<E> {
        let list = list_of(order)?;
        let mut guard = SlotGuard::try_mine(E::slots())?;
        let Some(entry) = Self::pop_mine_from(&mut guard, list, self) else {
            if list == HUGE_LIST {
                self.missed_huge(&guard);
            }
            return None;
        };
        self.counters.count_take(&guard, list);
        Some(entry)
    }

    /// An allocation of a huge block found none kept on the guarded slot: it may keep one
    /// more (see the module docs, "Bounds").
    #[inline(never)]
    fn missed_huge(&self, guard: &SlotGuard<E>) {
        self.counters.raise_huge_extra(guard, self.huge_extra_max);
    }

    /// Most blocks of this owner's the guarded slot keeps on list `list`.
    #[inline]
    fn limit(&self, guard: &SlotGuard<E>, list: usize) -> usize {
        let base = self.kept_limit[list];
        if list == HUGE_LIST && base > 0 {
            base + self.counters.huge_extra(guard)
        } else {
            base
        }
    }

    /// Pops the calling thread's slot's most recent kept block of `order` if it is this
    /// owner's, with the slot still held and the block's list.
    #[inline]
    fn pop_mine(&self, order: Order) -> Option<(SlotGuard<E>, usize, E)> {
        let list = list_of(order)?;
        let mut guard = SlotGuard::try_mine(E::slots())?;
        let entry = Self::pop_mine_from(&mut guard, list, self)?;
        Some((guard, list, entry))
    }

    /// Pops the most recent kept block of list `list` of the guarded slot if it is
    /// `owner`'s.
    #[inline]
    fn pop_mine_from(guard: &mut SlotGuard<E>, list: usize, owner: &Self) -> Option<E> {
        owner.pop_mine_of(guard.list(list))
    }

    /// Pops the most recent entry of `entries` (a kept list or the husks) if it is this
    /// owner's.
    #[inline]
    fn pop_mine_of(&self, entries: &mut Vec<E>) -> Option<E> {
        if !std::ptr::eq(entries.last()?.caches(), self) {
            return None;
        }
        entries.pop()
    }

    /// Whether blocks of `order` may be kept (and so go to a next holder with no map
    /// call).
    #[inline]
    pub(crate) fn keeps(order: Order) -> bool {
        list_of(order).is_some()
    }

    /// Keeps the block `slot` holds, which its owner freed dirty, on the calling thread's
    /// slot, and empties `slot`; whether it did (not when its order is not kept, its owner
    /// is closed, the slot keeps enough of that order or is busy: `slot` still holds it).
    ///
    /// Decided on the entry where it is and moved once, from there onto the list: a copy
    /// of it taken out first, some words read and written back one by one, made the
    /// push read them back in other pieces than written (a store-forwarding stall a free).
    #[inline(always)]
    pub(crate) fn keep(slot: &mut Option<E>) -> bool {
        let Some(entry) = slot.as_mut() else {
            return false;
        };
        let order = entry.order();
        let Some(list) = list_of(order) else {
            return false;
        };
        let Some(mut guard) = SlotGuard::try_mine(E::slots()) else {
            return false;
        };
        let caches = entry.caches();
        if caches.is_closed() {
            return false;
        }
        if guard.list(list).len() >= caches.kept_limit[list] {
            // Full at the base limit: a huge list may keep more, or makes room.
            if order <= PCP_MAX_ORDER {
                return false;
            }
            if guard.list(list).len() >= caches.limit(&guard, list) {
                let Some(entry) = slot.take() else {
                    return false;
                };
                let kept = Self::keep_draining(guard, list, entry);
                return kept.map_err(|back| *slot = Some(back)).is_ok();
            }
        }
        caches.counters.count_keep(&guard, list, order);
        if order > PCP_MAX_ORDER {
            // Schedules a reporting pass (which gives the block back first) as its free
            // to the zone would have; the pass comes after the reporting delay.
            caches.kept_huge_block();
        }
        entry.reuse();
        if let Some(entry) = slot.take() {
            guard.list(list).push(entry);
        }
        true
    }

    /// Gives the calling thread's kept blocks of `order` of this owner back to the
    /// manager (a zero-request's search order then sees them).
    pub(crate) fn give_back_mine(&self, order: Order) {
        while let Some((guard, list, entry)) = self.pop_mine(order) {
            self.counters.count_given_back(&guard, list, 1);
            drop(guard);
            self.give_back_kept(entry);
        }
    }

    /// A huge block was kept: requests a reporting pass (one atomic load unless the
    /// reporting engine is idle), which gives it back first. Whatever the reporting order:
    /// in the zone the block could have merged into a reportable one.
    #[inline]
    fn kept_huge_block(&self) {
        if let Some((notifier, reporting)) = self.report.get() {
            notifier.freed(*reporting);
        }
    }

    /// Takes every kept entry of this owner out of every slot (waiting for each slot's
    /// holder) and gives it back to the manager; its husks go too.
    fn give_back_all_kept(&self) {
        let (mut out, mut spent) = (Vec::new(), Vec::new());
        for slot in 0..self.counters.slots() {
            let mut guard = SlotGuard::wait(E::slots(), slot);
            for list in 0..LISTS {
                let n = self.take_mine(guard.list(list), &mut out);
                self.counters.count_given_back(&guard, list, n as u64);
            }
            self.counters.reset_huge_extra(&guard);
            self.take_mine(guard.husks(), &mut spent);
        }
        for entry in out {
            self.give_back_kept(entry);
        }
        // Husks hold no block: their owner references go, outside the slots.
        drop(spent);
    }

    /// Moves this owner's entries of `entries` to `out`, the others staying in order; how
    /// many.
    fn take_mine(&self, entries: &mut Vec<E>, out: &mut Vec<E>) -> usize {
        let before = out.len();
        let mut k = 0;
        while k < entries.len() {
            if std::ptr::eq(entries[k].caches(), self) {
                out.push(entries.remove(k));
            } else {
                k += 1;
            }
        }
        out.len() - before
    }

    /// Gives a kept block back to the manager as if its owner freed it now.
    fn give_back_kept(&self, entry: E) {
        let (block, mut bytes) = entry.into_claim();
        // A kept block went to its last holder dirty (its pages were written before).
        let (hint, pages) = (FreeHint::Dirty, PageTables::Skip);
        if let Err(e) = self.give_back(block, &mut bytes, hint, u64::MAX, pages, Via::Manager) {
            tracing::error!(%e, %block, "giving a kept block back failed");
        }
    }

    /// The one way back to the manager for an allocated `block` whose claimed `bytes` are
    /// released here first, freed with `hint`, its pages from `zero_from` on known to read
    /// zero, the others looked up in the page tables or not (`pages`). The zero map learns
    /// of it before the manager (a zeroer must not see the block free before), and counts
    /// it once freed. On a failed free the block is still
    /// allocated: the map says so again (in use, every page written, or a later
    /// zero-request would skip pages its holder wrote) and after a failed known-zero free
    /// the bytes are claimed again, so the holder can free it dirty.
    pub(crate) fn give_back(
        &self,
        block: Block,
        bytes: &mut ClaimedBytes,
        hint: FreeHint,
        zero_from: u64,
        pages: PageTables,
        via: Via,
    ) -> Result<(), FreeError> {
        let life = self.life();
        if let Some(l) = life {
            let zero_from = match hint {
                FreeHint::KnownZero => 0,
                FreeHint::Dirty => zero_from.min(block.order.pages()),
            };
            l.freed(&self.ram, block, zero_from, pages);
        }
        // The claim goes before the manager (or the verify read) may touch the block.
        bytes.release(&self.ram);
        let freed = match via {
            Via::Cache => self.free(block, hint),
            Via::Manager => self.mm.free(block, hint),
        };
        match freed {
            Ok(()) => {
                if let Some(l) = life {
                    l.map.count_freed(block.order.bytes());
                    l.after_free(block, hint);
                }
                Ok(())
            }
            Err(e) => {
                if let Some(l) = life {
                    l.map.handed_out(block);
                }
                if hint == FreeHint::KnownZero {
                    if let Ok(b) = ClaimedBytes::claim(&self.ram, block.pfn, block.order) {
                        *bytes = b;
                    }
                }
                Err(e)
            }
        }
    }

    /// Allocates from the calling thread's cache (small non-zero requests, its slot free)
    /// or the manager; out of memory, every cache is drained and the manager tried again.
    pub(crate) fn alloc(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<Allocation, AllocError> {
        let first = {
            // The slot is tried only for an order it caches (a try is a locked swap: the
            // caches are not `static`, so their locks favour no thread).
            let cached = !req.zeroed && order <= PCP_MAX_ORDER;
            match cached
                .then(|| self.pcp.mine().try_lock_unfavoured())
                .flatten()
            {
                // Nothing to zero: the prefix does not matter.
                Some(mut pcp) => pcp.alloc(order, req),
                None => self.mm.alloc_prefix(order, req, used_pages),
            }
        };
        match first {
            Err(AllocError::OutOfMemory(_)) => {
                self.drain();
                self.mm.alloc_prefix(order, req, used_pages)
            }
            other => other,
        }
    }

    /// Frees an unclaimed block into the calling thread's cache (small dirty blocks, its
    /// slot free) or to the manager.
    pub(crate) fn free(&self, block: Block, hint: FreeHint) -> Result<(), FreeError> {
        if hint == FreeHint::Dirty && block.order <= PCP_MAX_ORDER {
            if let Some(mut pcp) = self.pcp.mine().try_lock_unfavoured() {
                return pcp.free(block, hint);
            }
        }
        self.mm.free(block, hint)
    }

    /// Whether the owner's last handle is gone.
    #[inline]
    fn is_closed(&self) -> bool {
        self.closed.load(Acquire)
    }

    /// The owner's last handle is gone: its kept blocks go back and none is kept again
    /// (their owner references would keep it alive).
    pub(crate) fn close(&self) {
        let _serial = lock(&self.giving_back);
        self.closed.store(true, Release);
        self.give_back_all_kept();
    }

    /// Gives every kept and cached block back to the manager (waiting for each slot). Not
    /// on the reporting thread (see [`ManagerHooks::before_pass`] below).
    pub(crate) fn drain(&self) {
        self.give_back_all_kept();
        for pcp in self.pcp.iter() {
            pcp.lock().drain();
        }
    }

    /// The manager's counters after a [`ThreadCaches::drain`], with the allocations and
    /// frees the kept blocks served added.
    pub(crate) fn stats(&self) -> Stats {
        self.drain();
        let mut stats = self.mm.stats();
        self.counters.add_to(&mut stats);
        stats
    }

    /// Bytes freed into kept lists that have not reached the manager (not counted by the
    /// zero map yet).
    pub(crate) fn kept_freed_bytes(&self) -> u64 {
        self.counters.freed_bytes()
    }
}

impl<E> Drop for ThreadCaches<E> {
    fn drop(&mut self) {
        // Every kept entry holds a reference to its owner, so none is left: only the
        // cached blocks go back.
        for pcp in self.pcp.iter() {
            pcp.lock().drain();
        }
    }
}

/// The reporting engine's view: the manager, with every cache given back to it before a
/// pass, so blocks freed into a cache are reported like blocks freed to the zone (Linux
/// reports only what reached the buddy lists; its per-CPU lists are small).
impl<E: Keep> ManagerHooks for ThreadCaches<E> {
    fn manager(&self) -> &MemoryManager {
        &self.mm
    }
    fn before_pass(&self) {
        // Serialized with `close`: until it has run, the owner's handles hold references,
        // so the kept blocks' references dropped here are not the last (the last would
        // drop the reporter, which joins this very thread).
        let _serial = lock(&self.giving_back);
        if !self.is_closed() {
            self.drain();
        }
    }
}
