//! zeronce-pool: pre-zeroed huge pages for VMMs, as files on a hugetlbfs mount.
//!
//! A VMM whose guest RAM is a hugetlbfs file (QEMU `-object memory-backend-file,
//! mem-path=FILE,share=on`; cloud-hypervisor `--memory-zone file=FILE,shared=on`) waits
//! at start while the kernel zeroes every huge page it faults in. A [`Pool`] keeps N
//! files of size S whose pages are all allocated and zero, so the VMM maps one and runs:
//!
//! * [`Pool::take`] hands out a ready file (or, when none is, zeroes a dirty one on the
//!   request, counted); [`Pool::give_back`] takes it back **dirty**;
//! * zeroing workers ([`WorkerConfig`]: threads, CPU list, nice, bandwidth cap) re-zero
//!   returned files in the background, page by page, stopping between pages at shutdown,
//!   never touching a file a client holds;
//! * pages a client punched out of its file (balloon, free page reporting) come back as
//!   holes: they read zero, so the daemon does not zero them — the kernel repopulates
//!   them ([`PoolCounters::pages_repopulated`], apart from the daemon's own zeroing);
//! * the state file ([`persist`]) records a file as zero only once it is zeroed and
//!   free: after a crash, every file not recorded zero is checked and zeroed again, and a
//!   file recorded held stays its client's until returned;
//! * a take may be a lease on the client's connection ([`Pool::lease`]): if the
//!   connection closes without a return, the file is orphaned — never zeroed while a
//!   process still has it open or mapped ([`usage`]), reclaimed once none has
//!   ([`Pool::reclaim_orphans`]);
//! * "zeroable pages appeared" events, rate-limited ([`Pool::subscribe`]).
//!
//! How this fits the rest of zeronce (the huge-page pre-zeroing design, the words used)
//! is in the repository's `docs/ARCHITECTURE.md` and `docs/GLOSSARY.md`.
//!
//! [`server::Server`] puts a pool behind a Unix socket speaking the JSON-lines protocol of
//! [`proto`] (`docs/POOL_PROTOCOL.md`); [`client::Client`] speaks it. The `zeronce pool`
//! command is a thin layer over both.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
mod daemon;
pub mod files;
pub mod pacer;
pub mod persist;
pub mod proto;
pub mod server;
pub mod state;
pub mod usage;
mod worker;

pub use daemon::{Pool, PoolConfig, PoolError, PrezeroReport, Served, Taken};
pub use state::{PageCounts, PoolCounters};
pub use worker::WorkerConfig;

use serde_json::{json, Value};

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
                "returns": c.returns,
                "pages_zeroed_background": c.pages_zeroed_background,
                "pages_zeroed_inline": c.pages_zeroed_inline,
                "pages_repopulated": c.pages_repopulated,
                "jobs_interrupted": c.jobs_interrupted,
                "leases_orphaned": c.leases_orphaned,
                "orphans_reclaimed": c.orphans_reclaimed,
                "orphan_checks": self.orphan_checks,
                "events": self.events,
            },
            "zeroing_gb_per_s": self.zeroing_gb_per_s(),
        })
    }
}

/// Parses a CPU list: `0-3,6,8-9`.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("{text:?} is not a CPU list (e.g. 0-3,6)");
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: usize = lo.trim().parse().map_err(|_| bad())?;
        let hi: usize = hi.trim().parse().map_err(|_| bad())?;
        if lo > hi || hi >= 1 << 16 {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    if cpus.is_empty() {
        return Err(bad());
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-2,5"), Ok(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3"), Ok(vec![3]));
        for bad in ["", "a", "3-1", "1-", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }
}
