//! vmstat-like counters and per-zone snapshots.

use crate::types::{FreeState, Order, PageRange, ZoneId, NR_ORDERS};

/// A count per [`FreeState`] (blocks or pages, as documented where used).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeCounts {
    /// Not known zero, not reported.
    pub dirty: u64,
    /// Known zero, not reported.
    pub zero: u64,
    /// Reported, not known zero.
    pub reported_dirty: u64,
    /// Reported and known zero.
    pub reported_zero: u64,
}

impl FreeCounts {
    /// The count for `state`.
    pub fn get(&self, state: FreeState) -> u64 {
        match (state.known_zero, state.reported) {
            (false, false) => self.dirty,
            (true, false) => self.zero,
            (false, true) => self.reported_dirty,
            (true, true) => self.reported_zero,
        }
    }

    /// Sets the count for `state`.
    pub fn set(&mut self, state: FreeState, value: u64) {
        match (state.known_zero, state.reported) {
            (false, false) => self.dirty = value,
            (true, false) => self.zero = value,
            (false, true) => self.reported_dirty = value,
            (true, true) => self.reported_zero = value,
        }
    }

    /// Sum over the four states.
    pub fn total(&self) -> u64 {
        self.dirty + self.zero + self.reported_dirty + self.reported_zero
    }

    /// Blocks not yet reported (what the reporting engine can isolate).
    pub fn unreported(&self) -> u64 {
        self.dirty + self.zero
    }

    /// Adds `other` into `self`, scaled by `factor` (e.g. pages per block).
    pub fn add_scaled(&mut self, other: &FreeCounts, factor: u64) {
        for state in FreeState::ALL {
            self.set(state, self.get(state) + other.get(state) * factor);
        }
    }
}

/// Snapshot of one zone, taken under its lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneInfo {
    /// The zone.
    pub id: ZoneId,
    /// Its pages.
    pub range: PageRange,
    /// Its largest order.
    pub max_order: Order,
    /// Pages in free blocks on the free lists (isolated blocks excluded, as Linux's
    /// `NR_FREE_PAGES` after `__isolate_free_page`).
    pub free_pages: u64,
    /// Pages isolated for reporting.
    pub isolated_pages: u64,
    /// Pages allocated (per-thread cache pages excluded).
    pub allocated_pages: u64,
    /// Pages held free by per-thread caches, as of their last refill/drain (Linux counts
    /// pcp pages per CPU the same way; exact once the caches are drained).
    pub cached_pages: u64,
    /// Low watermark in pages: the reporting engine should skip the zone while
    /// `free_pages < low_watermark + one batch` (docs/ARCHITECTURE.md §4).
    pub low_watermark: u64,
    /// Number of free *blocks* per order, per state (Linux `nr_free`, split by state).
    pub nr_free: [FreeCounts; NR_ORDERS],
}

impl ZoneInfo {
    /// Free blocks of `order`, all states.
    pub fn nr_free(&self, order: Order) -> u64 {
        self.nr_free[order.index()].total()
    }
}

/// Manager-wide counters (sums over zones), like `/proc/vmstat`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Successful allocations per order.
    pub allocs: [u64; NR_ORDERS],
    /// Successful frees per order.
    pub frees: [u64; NR_ORDERS],
    /// Allocations that failed (out of memory, order too large, verify failure).
    pub alloc_failures: u64,
    /// Zero-requests served.
    pub zero_requests: u64,
    /// Zero-requests served without writing a byte (known zero to the free lists, or to
    /// the zeroer).
    pub zero_requests_skipped: u64,
    /// Bytes zeroed by the allocator (what its zeroer wrote).
    pub bytes_zeroed: u64,
    /// Bytes of zero-requests not written because they were known zero (whole known-zero
    /// blocks, and the pages a zeroer knew read zero).
    pub bytes_zeroing_skipped: u64,
    /// Verify-mode failures (a known-zero claim that was false).
    pub verify_failures: u64,
    /// Free *pages* per order, per state.
    pub free_pages: [FreeCounts; NR_ORDERS],
    /// Pages isolated for reporting.
    pub isolated_pages: u64,
    /// Pages allocated (per-thread cache pages excluded).
    pub allocated_pages: u64,
    /// Pages held free by per-thread caches, as of their last refill/drain.
    pub cached_pages: u64,
    /// Pages managed.
    pub total_pages: u64,
}

impl Stats {
    /// Free pages, all orders and states.
    pub fn free_pages_total(&self) -> u64 {
        self.free_pages.iter().map(FreeCounts::total).sum()
    }

    /// Free pages known zero, all orders.
    pub fn known_zero_pages(&self) -> u64 {
        self.free_pages
            .iter()
            .map(|c| c.zero + c.reported_zero)
            .sum()
    }

    /// Free pages reported, all orders.
    pub fn reported_pages(&self) -> u64 {
        self.free_pages
            .iter()
            .map(|c| c.reported_dirty + c.reported_zero)
            .sum()
    }
}
