//! Device metrics: lock-free counters the VMM can read from any thread
//! (`Arc<BalloonMetrics>` from [`crate::BalloonDevice::metrics`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::MalformedKind;

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds one and returns the new value.
    pub(crate) fn inc_get(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The doubling scheme of every rate-limited log line (defined once, in `zeronce-types`).
pub(crate) use zeronce_types::rate::log_this;

/// Message of a refused guest request (rate-limited by [`log_this`]).
pub(crate) const REFUSED: &str =
    "virtio-balloon: refused guest input (per class: first 10 logged, then at each doubling of count)";
/// Message of a failed discard or VMM-side failure (rate-limited by [`log_this`]).
pub(crate) const FAILED: &str =
    "virtio-balloon: request failed (first 10 logged, then at each doubling of count)";

/// Counters of everything the device does.
#[derive(Debug, Default)]
pub struct BalloonMetrics {
    /// 4 KiB pages received on the inflate queue.
    pub pages_inflated: Counter,
    /// 4 KiB pages received on the deflate queue.
    pub pages_deflated: Counter,
    /// 4 KiB pages received on the reporting queue.
    pub pages_reported: Counter,
    /// Bytes handed to a discard operation that succeeded.
    pub bytes_discarded: Counter,
    /// Zero promises made: inflate bitmap bits set + reporting buffers answered with
    /// their full length under bit 6.
    pub zero_promises: Counter,
    /// Discard operations that failed (the guest gets no promise).
    pub discard_errors: Counter,
    /// Reporting buffers not discarded because PAGE_POISON with a nonzero `poison_val`
    /// is in effect (discarding would replace the poison with zeros).
    pub reports_skipped_poison: Counter,
    /// 4 KiB pages hinted on free_page_vq while a run was current (each discarded).
    pub pages_hinted: Counter,
    /// Hint chains that arrived while no run was current (used, not discarded).
    pub hints_stale: Counter,
    /// Statistics buffers parsed.
    pub stats_updates: Counter,
    /// Configuration-change notifications sent.
    pub config_changes: Counter,
    malformed: [Counter; MalformedKind::COUNT],
}

/// The counters of [`BalloonMetrics`] read at one moment (each read separately).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// 4 KiB pages received on the reporting queue.
    pub pages_reported: u64,
    /// Bytes handed to a discard operation that succeeded.
    pub bytes_discarded: u64,
    /// Zero promises made (reporting buffers answered with their full length under
    /// bit 6, inflate bitmap bits set).
    pub zero_promises: u64,
    /// Discard operations that failed.
    pub discard_errors: u64,
    /// Reports not discarded because of a nonzero page poison.
    pub reports_skipped_poison: u64,
    /// 4 KiB pages hinted on free_page_vq while a run was current (each discarded).
    pub pages_hinted: u64,
    /// Hint chains that arrived while no run was current (used, not discarded).
    pub hints_stale: u64,
    /// Statistics buffers parsed.
    pub stats_updates: u64,
    /// Malformed requests of all kinds.
    pub malformed: u64,
}

impl BalloonMetrics {
    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            pages_reported: self.pages_reported.get(),
            bytes_discarded: self.bytes_discarded.get(),
            zero_promises: self.zero_promises.get(),
            discard_errors: self.discard_errors.get(),
            reports_skipped_poison: self.reports_skipped_poison.get(),
            pages_hinted: self.pages_hinted.get(),
            hints_stale: self.hints_stale.get(),
            stats_updates: self.stats_updates.get(),
            malformed: self.malformed_total(),
        }
    }

    /// Counts one malformed request of `kind`; returns the count of that kind so far.
    pub fn malformed(&self, kind: MalformedKind) -> u64 {
        self.malformed[kind.index()].inc_get()
    }

    /// Malformed requests of `kind` so far.
    pub fn malformed_count(&self, kind: MalformedKind) -> u64 {
        self.malformed[kind.index()].get()
    }

    /// Malformed requests of all kinds so far.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.iter().map(Counter::get).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeronce_types::rate::LOG_FIRST;

    #[test]
    fn malformed_counters_are_per_kind() {
        let m = BalloonMetrics::default();
        m.malformed(MalformedKind::BadChain);
        m.malformed(MalformedKind::BadChain);
        m.malformed(MalformedKind::Misaligned);
        assert_eq!(m.malformed_count(MalformedKind::BadChain), 2);
        assert_eq!(m.malformed_count(MalformedKind::Misaligned), 1);
        assert_eq!(m.malformed_count(MalformedKind::NotReady), 0);
        assert_eq!(m.malformed_total(), 3);
    }

    #[test]
    fn a_flood_logs_logarithmically() {
        let lines = (1..=100_000u64).filter(|&n| log_this(n)).count() as u64;
        assert!(lines <= LOG_FIRST + 17, "{lines}");
        assert!((1..=LOG_FIRST).all(log_this));
    }
}
