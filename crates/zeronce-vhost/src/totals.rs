//! The device counters summed over front-end sessions: each session has a fresh device,
//! and the hub keeps the counts of the ended ones here so the totals only grow. The
//! metrics page (`metrics`) names and prints them.

use zeronce_balloon::{BalloonMetrics, MalformedKind};

/// The device counters exported, with their names and help lines.
pub(crate) const DEVICE: [(&str, &str); 8] = [
    (
        "zeronce_balloon_inflated_pages_total",
        "4 KiB pages received on the inflate queue (Linux: balloon_inflate).",
    ),
    (
        "zeronce_balloon_deflated_pages_total",
        "4 KiB pages received on the deflate queue (Linux: balloon_deflate).",
    ),
    (
        "zeronce_balloon_reported_pages_total",
        "4 KiB pages received on the free page reporting queue.",
    ),
    (
        "zeronce_balloon_discarded_bytes_total",
        "Bytes handed to a discard operation that succeeded.",
    ),
    (
        "zeronce_balloon_zero_promises_total",
        "Pages the guest was told read zero (bit 6 used_len, bit 7 bitmaps).",
    ),
    (
        "zeronce_balloon_discard_errors_total",
        "Discard operations that failed.",
    ),
    (
        "zeronce_balloon_stats_updates_total",
        "Statistics buffers parsed.",
    ),
    (
        "zeronce_balloon_config_changes_total",
        "Configuration changes announced to the guest.",
    ),
];

/// Device counters of one or more sessions, in [`DEVICE`] order, then malformed input
/// per [`MalformedKind`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceTotals {
    pub(crate) counts: [u64; DEVICE.len()],
    pub(crate) malformed: [u64; MalformedKind::COUNT],
}

impl DeviceTotals {
    /// Adds the counters of `m`.
    pub(crate) fn add(&mut self, m: &BalloonMetrics) {
        let now = [
            m.pages_inflated.get(),
            m.pages_deflated.get(),
            m.pages_reported.get(),
            m.bytes_discarded.get(),
            m.zero_promises.get(),
            m.discard_errors.get(),
            m.stats_updates.get(),
            m.config_changes.get(),
        ];
        for (t, n) in self.counts.iter_mut().zip(now) {
            *t += n;
        }
        for (t, k) in self.malformed.iter_mut().zip(MalformedKind::ALL) {
            *t += m.malformed_count(k);
        }
    }
}
