//! The daemon's counters as a Prometheus page (`--metrics`): the device counters summed
//! over every front-end session (each session has a fresh device; the counts of ended
//! ones are kept in the hub so the totals only grow), and the daemon's own connection
//! counters. Names follow Prometheus conventions: `zeronce_…_total` for counters, the
//! unit in the name.

use zeronce_balloon::MalformedKind;
use zeronce_daemon::prometheus::{Exposition, Kind};

use crate::hub::Hub;
use crate::totals::DEVICE;

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
