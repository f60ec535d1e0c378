//! [`MemoryManager`]: zones behind locks, zero-aware allocation, and the primitives the
//! reporting engine is built on.

use crate::error::{AllocError, ConfigError, FreeError, InvariantViolation};
use crate::stats::Stats;
use crate::types::{
    Block, FreeState, Order, PageRange, Pfn, ZoneId, DEFAULT_MAX_ORDER, DEFAULT_REPORTING_ORDER,
    NR_ORDERS,
};
use crate::zeroing::Zeroer;
use crate::zone::tags::TagTable;
use crate::zone::{ReportedNotZero, Search, Zone};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, Release},
};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

mod batch;
mod grow;
mod report;

/// Configuration of a [`MemoryManager`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmConfig {
    /// One range per zone, in fallback order (allocation tries zone 0 first). Must not
    /// overlap; need not be aligned to anything.
    pub zones: Vec<PageRange>,
    /// Largest block order (default 10; at most [`crate::MAX_ORDER_LIMIT`]).
    pub max_order: Order,
    /// Smallest order worth reporting (default 9); frees that leave an unreported block of
    /// this order or above bump the zone's reportable-free generation.
    pub reporting_order: Order,
    /// Verify mode: every skipped zeroing and every claim of zero is checked with
    /// [`Zeroer::is_zero`]; a false claim is a typed error.
    pub verify: bool,
    /// State of every page at start. [`FreeState::DIRTY`] is always safe; memory just
    /// mapped from the kernel and never touched is [`FreeState::REPORTED_ZERO`].
    pub initial_state: FreeState,
    /// Low watermark in pages for every zone; `None`: Linux's formula per zone
    /// (`min_free_kbytes = sqrt(16 × zone KiB)` clamped to 128 KiB–256 MiB, low = min × 5/4).
    pub low_watermark_pages: Option<u64>,
    /// Per-thread cache ([`crate::PcpCache`]): most pages one cache list (one zone, one
    /// order) may hold before it gives a batch back (Linux `pcp->high`). Default 512.
    pub pcp_high_pages: u64,
    /// Pages a per-thread cache list takes from or gives back to its zone at once (Linux
    /// `pcp->batch`). Default 128.
    pub pcp_batch_pages: u64,
    /// Where the host keeps reported blocks it did not promise zero; decides whether a
    /// zero-request takes them before or after reported known-zero blocks.
    pub reported_not_zero: ReportedNotZero,
}

impl MmConfig {
    /// Defaults (max order 10, reporting order 9, no verify, all pages dirty) over `zones`.
    pub fn new(zones: Vec<PageRange>) -> MmConfig {
        MmConfig {
            zones,
            max_order: DEFAULT_MAX_ORDER,
            reporting_order: DEFAULT_REPORTING_ORDER,
            verify: false,
            initial_state: FreeState::DIRTY,
            low_watermark_pages: None,
            pcp_high_pages: 512,
            pcp_batch_pages: 128,
            reported_not_zero: ReportedNotZero::Discarded,
        }
    }

    /// Linux-like low watermark for a zone of `pages` pages.
    pub fn default_low_watermark(pages: u64) -> u64 {
        let kib = pages * (crate::PAGE_SIZE / 1024);
        let min_kib = (kib * 16).isqrt().clamp(128, 256 * 1024);
        let min_pages = min_kib / (crate::PAGE_SIZE / 1024);
        (min_pages + min_pages / 4).min(pages)
    }
}

/// What the caller wants besides a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocRequest {
    /// The block must read zero when handed out (`__GFP_ZERO`).
    pub zeroed: bool,
    /// Page the caller touches first: zeroed last so it is cache-hot.
    pub hint: Option<Pfn>,
}

impl AllocRequest {
    /// A request without zeroing.
    pub const DIRTY: AllocRequest = AllocRequest {
        zeroed: false,
        hint: None,
    };
    /// A zero-request without hint.
    pub const ZEROED: AllocRequest = AllocRequest {
        zeroed: true,
        hint: None,
    };
}

/// What happened about zeroing an allocated block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zeroing {
    /// Zero-request: no byte written, the block was known zero (to the free lists, or to
    /// the zeroer, which wrote nothing).
    Skipped,
    /// Zero-request: the block was zeroed with [`Zeroer::zero`] (all of it, or the pages
    /// the zeroer did not know read zero).
    Done,
    /// No zero-request: contents are whatever they were.
    NotRequested,
}

/// A successful allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The block; free it with exactly this block.
    pub block: Block,
    /// Zone it came from.
    pub zone: ZoneId,
    /// Whether it was zeroed.
    pub zeroing: Zeroing,
    /// The state the block had on the free list (`reported`: the first touch may fault
    /// the backing back in).
    pub prior: FreeState,
}

impl Allocation {
    /// Whether the block had been reported to the host (its backing may be gone).
    pub fn was_reported(&self) -> bool {
        self.prior.reported
    }
}

/// What the caller knows about a block it frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeHint {
    /// Contents unknown (the normal case).
    Dirty,
    /// The block reads zero (e.g. balloon deflate of host-zeroed pages, FPI_ZEROED).
    KnownZero,
}

/// The host's answer for one reported block (did it zero it?): the same answer a discard
/// gives, one type from the allocator through the reporting engine to the guest driver.
pub use zeronce_types::ZeroGuarantee;

/// How an isolated block goes back to its free list ([`MemoryManager::put_back`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutBack {
    /// The host took it: reported, known zero iff the verdict says so.
    Reported(ZeroGuarantee),
    /// The report call failed: back in the state it was isolated in (unreported stays
    /// unreported), never lost.
    Failed,
}

/// Called (outside any lock) with the zone after a free left an unreported block of
/// reporting order or above (Linux `page_reporting_notify_free`).
pub type ReportNotifier = Box<dyn Fn(ZoneId) + Send + Sync>;

/// Manager-wide counters updated outside the zone locks.
#[derive(Default)]
pub(crate) struct Counters {
    /// Allocations served by per-thread caches (flushed at their batch points).
    pub(crate) cached_allocs: [AtomicU64; NR_ORDERS],
    /// Frees into per-thread caches (flushed at their batch points).
    pub(crate) cached_frees: [AtomicU64; NR_ORDERS],
    pub(crate) alloc_failures: AtomicU64,
    zero_requests: AtomicU64,
    zero_requests_skipped: AtomicU64,
    bytes_zeroed: AtomicU64,
    bytes_zeroing_skipped: AtomicU64,
    verify_failures: AtomicU64,
}

/// A zone and what is read about it without its lock.
pub(crate) struct ZoneSlot {
    /// The zone's pages.
    pub(crate) range: PageRange,
    /// The zone itself.
    pub(crate) zone: Mutex<Zone>,
    /// The zone's frame tags, also reachable without the lock (per-thread caches).
    pub(crate) tags: Arc<TagTable>,
    /// Pages held by per-thread caches as of their last batch point (two's complement sum
    /// of signed deltas).
    pub(crate) cached_pages: AtomicU64,
    /// Frees of a reportable order so far (the engine's wake-up generation).
    reportable_frees: AtomicU64,
}

impl ZoneSlot {
    /// Frame-table index of `pfn` (which must be in the zone).
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a zone has fewer than 2^32 frames (MemoryManager::new refuses larger ones), so frame indices and block sizes fit in u32"
    )]
    pub(crate) fn idx(&self, pfn: Pfn) -> u32 {
        (pfn.0 - self.range.start.0) as u32
    }
}

/// The memory manager: buddy zones whose free blocks carry known-zero and reported state.
/// `Send + Sync`; one mutex per zone. See the crate docs for the rules.
pub struct MemoryManager {
    config: MmConfig,
    pub(crate) zones: Vec<ZoneSlot>,
    zeroer: Arc<dyn Zeroer>,
    pub(crate) counters: Counters,
    notifier: OnceLock<ReportNotifier>,
}

/// Locks a zone. A panic while holding it (only possible in a user `Zeroer` in verify mode,
/// which runs between consistent states) does not make the state unusable.
pub(crate) fn lock(slot: &ZoneSlot) -> MutexGuard<'_, Zone> {
    crate::sync::lock(&slot.zone)
}

impl MemoryManager {
    /// Builds the zones, all pages free in `config.initial_state`.
    pub fn new(config: MmConfig, zeroer: Arc<dyn Zeroer>) -> Result<Self, ConfigError> {
        if config.zones.is_empty() {
            return Err(ConfigError::NoZones);
        }
        if config.reporting_order > config.max_order {
            return Err(ConfigError::ReportingOrder {
                reporting: config.reporting_order,
                max: config.max_order,
            });
        }
        for (i, r) in config.zones.iter().enumerate() {
            if r.pages == 0 {
                return Err(ConfigError::EmptyZone(ZoneId(i)));
            }
            if r.pages >= u64::from(u32::MAX) || r.start.0.checked_add(r.pages).is_none() {
                return Err(ConfigError::ZoneTooLarge(ZoneId(i)));
            }
            if let Some(j) = config.zones[..i].iter().position(|o| o.overlaps(r)) {
                return Err(ConfigError::Overlap(ZoneId(j), ZoneId(i)));
            }
        }
        let zones = config
            .zones
            .iter()
            .enumerate()
            .map(|(i, &range)| {
                let wmark = config
                    .low_watermark_pages
                    .unwrap_or_else(|| MmConfig::default_low_watermark(range.pages));
                let zone = Zone::new(
                    ZoneId(i),
                    range,
                    config.max_order,
                    wmark,
                    config.initial_state,
                );
                ZoneSlot {
                    range,
                    tags: zone.tags().clone(),
                    cached_pages: AtomicU64::new(0),
                    zone: Mutex::new(zone),
                    reportable_frees: AtomicU64::new(0),
                }
            })
            .collect();
        Ok(MemoryManager {
            config,
            zones,
            zeroer,
            counters: Counters::default(),
            notifier: OnceLock::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MmConfig {
        &self.config
    }

    /// Number of zones (ids are `0..zone_count()`).
    pub(crate) fn zone_count(&self) -> usize {
        self.zones.len()
    }

    /// Pages managed, all zones.
    pub fn total_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.range.pages).sum()
    }

    /// The zone holding `pfn`.
    pub fn zone_of(&self, pfn: Pfn) -> Option<ZoneId> {
        self.zones
            .iter()
            .position(|z| z.range.contains(pfn))
            .map(ZoneId)
    }

    /// The slot of the zone holding `pfn`.
    fn slot_of(&self, pfn: Pfn) -> Option<&ZoneSlot> {
        self.zones.iter().find(|z| z.range.contains(pfn))
    }

    /// Allocates a block of `order`: zones in order, in each the search policy of
    /// [`AllocRequest`] (see the crate docs); zeroes it unless not requested or known zero.
    pub fn alloc(&self, order: Order, req: AllocRequest) -> Result<Allocation, AllocError> {
        self.alloc_prefix(order, req, order.pages())
    }

    /// [`MemoryManager::alloc`] for a caller that uses only the first `used_pages` pages
    /// of the block (a size that is not a power of two): a zero-request zeroes only those,
    /// so the tail is neither written nor faulted in. The tail's contents are unspecified.
    pub fn alloc_prefix(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<Allocation, AllocError> {
        if order > self.config.max_order {
            self.counters.alloc_failures.fetch_add(1, Relaxed);
            return Err(AllocError::OrderTooLarge {
                order,
                max: self.config.max_order,
            });
        }
        let search = Search::of(req.zeroed, self.config.reported_not_zero);
        for (i, slot) in self.zones.iter().enumerate() {
            let taken = lock(slot).take(order, search);
            if let Some((block, prior)) = taken {
                return self.prepare(slot, ZoneId(i), block, prior, req, used_pages);
            }
        }
        self.counters.alloc_failures.fetch_add(1, Relaxed);
        Err(AllocError::OutOfMemory(order))
    }

    /// Verify mode caught a false zero claim on `block`, taken from `slot` with `prior`:
    /// gives it back as not known zero (keeping `reported`, which is about the backing,
    /// not the contents), counts the failure, and returns the error to fail loudly with.
    fn false_zero_claim(&self, slot: &ZoneSlot, block: Block, prior: FreeState) -> AllocError {
        lock(slot).untake(
            block,
            FreeState {
                known_zero: false,
                ..prior
            },
        );
        self.counters.verify_failures.fetch_add(1, Relaxed);
        self.counters.alloc_failures.fetch_add(1, Relaxed);
        AllocError::VerifyFailed { block }
    }

    /// `post_alloc_hook`: zero (outside the lock) the first `used` pages unless not
    /// requested or known zero.
    pub(crate) fn prepare(
        &self,
        slot: &ZoneSlot,
        zone: ZoneId,
        block: Block,
        prior: FreeState,
        req: AllocRequest,
        used: u64,
    ) -> Result<Allocation, AllocError> {
        let zeroing = if !req.zeroed {
            // Flags dropped: the caller gets whatever the pages hold.
            Zeroing::NotRequested
        } else if prior.known_zero {
            if self.config.verify && !self.zeroer.is_zero(block.range()) {
                return Err(self.false_zero_claim(slot, block, prior));
            }
            self.counters
                .bytes_zeroing_skipped
                .fetch_add(block.order.bytes(), Relaxed);
            self.counters.zero_requests_skipped.fetch_add(1, Relaxed);
            Zeroing::Skipped
        } else {
            let range = PageRange::new(block.pfn, used.clamp(1, block.order.pages()));
            // Only a hint inside the range means anything to the zeroer.
            let hint = req.hint.filter(|h| range.contains(*h));
            let written = self.zeroer.zero(range, hint).min(range.bytes());
            if written < range.bytes() && self.config.verify && !self.zeroer.is_zero(range) {
                // The zeroer skipped pages it wrongly knew zero.
                return Err(self.false_zero_claim(slot, block, prior));
            }
            self.counters.bytes_zeroed.fetch_add(written, Relaxed);
            self.counters
                .bytes_zeroing_skipped
                .fetch_add(range.bytes() - written, Relaxed);
            if written == 0 {
                // Known zero to the zeroer, if not to the free lists: nothing written.
                self.counters.zero_requests_skipped.fetch_add(1, Relaxed);
                Zeroing::Skipped
            } else {
                Zeroing::Done
            }
        };
        if req.zeroed {
            self.counters.zero_requests.fetch_add(1, Relaxed);
        }
        Ok(Allocation {
            block,
            zone,
            zeroing,
            prior,
        })
    }

    /// Frees an allocated block: dirty and unreported, or known zero with
    /// [`FreeHint::KnownZero`] (checked in verify mode). Merges with free buddies. Every
    /// misuse is a typed error and changes nothing.
    pub fn free(&self, block: Block, hint: FreeHint) -> Result<(), FreeError> {
        let slot = self
            .slot_of(block.pfn)
            .ok_or(FreeError::NotOwned(block.pfn))?;
        let state = match hint {
            FreeHint::Dirty => FreeState::DIRTY,
            FreeHint::KnownZero => FreeState::ZERO,
        };
        let reportable = self.free_locked(slot, &mut lock(slot), block, hint, state)?;
        if reportable {
            self.notify_reportable(slot);
        }
        Ok(())
    }

    /// The part of a free under the zone lock: checks, frees `block` in `state` (the
    /// state of `hint`) and counts it; whether the merged block is reportable.
    fn free_locked(
        &self,
        slot: &ZoneSlot,
        zone: &mut Zone,
        block: Block,
        hint: FreeHint,
        state: FreeState,
    ) -> Result<bool, FreeError> {
        if hint == FreeHint::KnownZero && self.config.verify {
            // Check ownership first so we never read pages that are not the caller's.
            zone.check_allocated(block)?;
            if !self.zeroer.is_zero(block.range()) {
                self.counters.verify_failures.fetch_add(1, Relaxed);
                return Err(FreeError::VerifyFailed(block));
            }
        }
        let (merged, merged_state) = zone.free(block, state)?;
        Ok(self.count_reportable(slot, merged, merged_state))
    }

    /// Whether a free that produced `merged` in `state` is reportable (Linux
    /// `page_reporting_notify_free`: unreported, order >= reporting order); if so, bumps
    /// the zone's generation. Must be called with the zone lock held: the lock serialises
    /// the writers, so a plain load and store suffice (no locked instruction on the hot
    /// path).
    pub(crate) fn count_reportable(
        &self,
        slot: &ZoneSlot,
        merged: Block,
        state: FreeState,
    ) -> bool {
        let reportable = merged.order >= self.config.reporting_order && !state.reported;
        if reportable {
            let generation = slot.reportable_frees.load(Relaxed);
            slot.reportable_frees.store(generation + 1, Release);
        }
        reportable
    }

    /// Calls the notifier (outside the zone lock) after a reportable free.
    pub(crate) fn notify_reportable(&self, slot: &ZoneSlot) {
        if let Some(notify) = self.notifier.get() {
            if let Some(i) = self.zones.iter().position(|z| std::ptr::eq(z, slot)) {
                notify(ZoneId(i));
            }
        }
    }

    /// Manager-wide counters and free pages per (order, state).
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let mut s = Stats {
            allocs: std::array::from_fn(|o| c.cached_allocs[o].load(Relaxed)),
            frees: std::array::from_fn(|o| c.cached_frees[o].load(Relaxed)),
            alloc_failures: c.alloc_failures.load(Relaxed),
            zero_requests: c.zero_requests.load(Relaxed),
            zero_requests_skipped: c.zero_requests_skipped.load(Relaxed),
            bytes_zeroed: c.bytes_zeroed.load(Relaxed),
            bytes_zeroing_skipped: c.bytes_zeroing_skipped.load(Relaxed),
            verify_failures: c.verify_failures.load(Relaxed),
            total_pages: self.total_pages(),
            ..Stats::default()
        };
        for slot in &self.zones {
            let zone = lock(slot);
            let info = zone.info();
            for (o, counts) in info.nr_free.iter().enumerate() {
                s.free_pages[o].add_scaled(counts, 1 << o);
                s.allocs[o] += zone.counters.allocs[o];
                s.frees[o] += zone.counters.frees[o];
            }
            drop(zone);
            let info = self.with_cached(slot, info);
            s.isolated_pages += info.isolated_pages;
            s.allocated_pages += info.allocated_pages;
            s.cached_pages += info.cached_pages;
        }
        s
    }

    /// Checks every zone's invariants: allocated + free + isolated + cached = total, each
    /// frame in exactly one aligned block, free lists / counters / tags consistent, no two
    /// free buddies of equal order unmerged, cached blocks never known zero. O(frames);
    /// call it while no [`crate::PcpCache`] is in use (caches retag frames without the
    /// zone lock).
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.zones.iter().try_for_each(|slot| lock(slot).check())
    }

    /// The free block containing `pfn` and its state, `None` if that page is not free.
    pub fn free_state_of(&self, pfn: Pfn) -> Option<(Block, FreeState)> {
        lock(self.slot_of(pfn)?).state_of(pfn)
    }
}
