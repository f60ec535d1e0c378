//! A snapshot of a pool's pages, counters and events, and its JSON form (the `stats`
//! reply of the protocol).

use serde_json::{json, Value};

use crate::state::{PageCounts, PoolCounters};

/// A snapshot of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Bytes per huge page.
    pub page_bytes: u64,
    /// Bytes per file.
    pub file_bytes: u64,
    /// Number of files.
    pub files: usize,
    /// Pages by state.
    pub pages: PageCounts,
    /// Counters.
    pub counters: PoolCounters,
    /// "Zeroable pages appeared" events delivered.
    pub events: u64,
    /// Checks of orphaned files' users done so far.
    pub orphan_checks: u64,
}

impl Stats {
    /// Background zeroing rate in GB/s (10^9 bytes per second of zeroing time).
    pub fn zeroing_gb_per_s(&self) -> f64 {
        let c = &self.counters;
        let bytes = (c.pages_zeroed_background + c.pages_zeroed_inline) * self.page_bytes;
        if c.zeroing_nanos == 0 {
            return 0.0;
        }
        bytes as f64 / c.zeroing_nanos as f64
    }

    /// As the `stats` reply of the protocol (without `ok`).
    pub fn to_json(&self) -> Value {
        let p = &self.pages;
        let c = &self.counters;
        json!({
            "page_bytes": self.page_bytes,
            "file_bytes": self.file_bytes,
            "files": self.files,
            "pages": {
                "total": p.total(), "free_zero": p.free_zero, "zeroable": p.zeroable,
                "in_use": p.in_use, "zeroing": p.zeroing, "orphaned": p.orphaned,
            },
            "counters": {
                "takes": c.takes, "takes_prezeroed": c.takes_prezeroed,
                "takes_zeroed_inline": c.takes_zeroed_inline, "take_failures": c.take_failures,
                "returns": c.returns, "returns_in_use": c.returns_in_use,
                "returns_refused": c.returns_refused,
                "pages_zeroed_background": c.pages_zeroed_background,
                "pages_zeroed_inline": c.pages_zeroed_inline,
                "pages_repopulated": c.pages_repopulated,
                "jobs_interrupted": c.jobs_interrupted,
                "leases_orphaned": c.leases_orphaned,
                "orphans_reclaimed": c.orphans_reclaimed,
                "jobs_found_in_use": c.jobs_found_in_use,
                "orphan_checks": self.orphan_checks,
                "events": self.events,
            },
            "zeroing_gb_per_s": self.zeroing_gb_per_s(),
        })
    }
}
