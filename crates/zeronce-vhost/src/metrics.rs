//! The daemon's counters as a Prometheus page (`--metrics`): the device counters summed
//! over every front-end session (each session has a fresh device; the counts of ended
//! ones are kept in the hub so the totals only grow), and the daemon's own connection
//! counters. Names follow Prometheus conventions: `zeronce_…_total` for counters, the
//! unit in the name.

use zeronce_balloon::{BalloonMetrics, MalformedKind};
use zeronce_daemon::prometheus::{Exposition, Kind};

use crate::hub::Hub;

/// The device counters exported, with their names and help lines.
const DEVICE: [(&str, &str); 8] = [
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
    counts: [u64; DEVICE.len()],
    malformed: [u64; MalformedKind::COUNT],
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

/// The page: the daemon's counters and the device totals (ended sessions + the current).
pub(crate) fn render(hub: &Hub) -> String {
    let (totals, connected) = hub.device_totals();
    let mut e = Exposition::new();
    e.counter("zeronce_vhost_connections_total", "Front-end connections served.", hub.connections())
        .counter(
            "zeronce_vhost_rejected_connections_total",
            "Connections to the vhost-user socket that were not a front-end (a control request, or no header within the handshake timeout).",
            hub.rejected(),
        )
        .counter(
            "zeronce_vhost_refused_peers_total",
            "Connections closed because their peer's user is not allowed (SO_PEERCRED), both sockets.",
            hub.refused_peers(),
        )
        .counter(
            "zeronce_vhost_refused_control_connections_total",
            "Control connections refused because the limit was reached.",
            hub.control_slots.refused(),
        )
        .gauge("zeronce_vhost_connected", "1 while a front-end is connected.", f64::from(u8::from(connected)))
        .gauge("zeronce_balloon_target_pages", "The balloon target (num_pages, 4 KiB pages).", f64::from(hub.target()));
    for ((name, help), v) in DEVICE.iter().zip(totals.counts) {
        e.counter(name, help, v);
    }
    let by_class: Vec<(String, f64)> = MalformedKind::ALL
        .iter()
        .zip(totals.malformed)
        .map(|(k, v)| (format!("{k:?}"), v as f64))
        .collect();
    let samples: Vec<(&str, f64)> = by_class.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    e.by_label(
        Kind::Counter,
        "zeronce_balloon_malformed_total",
        "Guest requests refused as malformed, by class (RELIABILITY.md).",
        "class",
        &samples,
    );
    e.finish()
}
