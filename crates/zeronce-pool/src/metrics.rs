//! The pool daemon's counters as a Prometheus page (`zeronce pool serve --metrics`,
//! served by [`zeronce_daemon::endpoint`], the same endpoint as `zeronce serve`'s): pages
//! by state, takes, returns (refused ones: `not_owner`; held ones: still in use),
//! zeroing bytes and time, orphans, connections and refused peers. Names follow
//! Prometheus conventions: `zeronce_pool_…_total` for counters, the unit in the name.

use std::sync::atomic::{AtomicU64, Ordering};

use zeronce_daemon::prometheus::{Exposition, Kind};

use crate::connection::Connections;
use crate::stats::Stats;

/// The page for `stats` (the pool), `conns` (its connections) and `refused_peers`.
pub(crate) fn render(stats: &Stats, conns: &Connections, refused_peers: u64) -> String {
    let (p, c) = (&stats.pages, &stats.counters);
    let mut e = Exposition::new();
    let pages = [
        ("free_zero", p.free_zero),
        ("zeroable", p.zeroable),
        ("in_use", p.in_use),
        ("zeroing", p.zeroing),
        ("orphaned", p.orphaned),
    ];
    let pages: Vec<(&str, f64)> = pages.iter().map(|&(s, n)| (s, n as f64)).collect();
    e.by_label(
        Kind::Gauge,
        "zeronce_pool_pages",
        "Huge pages of the pool's files, by state.",
        "state",
        &pages,
    )
    .gauge(
        "zeronce_pool_page_bytes",
        "Bytes per huge page.",
        stats.page_bytes as f64,
    )
    .gauge(
        "zeronce_pool_files",
        "Files in the pool.",
        stats.files as f64,
    );
    let bytes = |pages: u64| pages.saturating_mul(stats.page_bytes);
    let k = &conns.counters;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counters: [(&str, &str, u64); 24] = [
        ("zeronce_pool_takes_total", "Files handed out.", c.takes),
        ("zeronce_pool_takes_prezeroed_total", "Takes served with a file zeroed beforehand.", c.takes_prezeroed),
        ("zeronce_pool_takes_zeroed_inline_total", "Takes that waited while the file was zeroed on the request.", c.takes_zeroed_inline),
        ("zeronce_pool_take_failures_total", "Takes refused (too large, exhausted, shutting down).", c.take_failures),
        ("zeronce_pool_returns_total", "Files given back by their taker.", c.returns),
        ("zeronce_pool_returns_in_use_total", "Returns of a file another process still had open or mapped: held as orphaned, not zeroed, until unused.", c.returns_in_use),
        ("zeronce_pool_returns_refused_total", "Returns refused because the caller is not the file's taker (not_owner).", c.returns_refused),
        ("zeronce_pool_zeroed_background_bytes_total", "Bytes zeroed by the background workers.", bytes(c.pages_zeroed_background)),
        ("zeronce_pool_zeroed_inline_bytes_total", "Bytes zeroed on a take's request.", bytes(c.pages_zeroed_inline)),
        ("zeronce_pool_repopulated_bytes_total", "Bytes of pages a client punched out, left to the kernel to repopulate (read zero, not zeroed by the daemon).", bytes(c.pages_repopulated)),
        ("zeronce_pool_jobs_interrupted_total", "Zeroing jobs stopped between two pages (shutdown).", c.jobs_interrupted),
        ("zeronce_pool_leases_orphaned_total", "Leased files whose connection closed without a return.", c.leases_orphaned),
        ("zeronce_pool_orphans_reclaimed_total", "Orphaned files reclaimed once no process had them open or mapped.", c.orphans_reclaimed),
        ("zeronce_pool_jobs_found_in_use_total", "Zeroing jobs stopped because someone opened their file (its write lease broke): the file held as orphaned.", c.jobs_found_in_use),
        ("zeronce_pool_orphan_checks_total", "Checks of orphaned files' users (their write lease; /proc where leases are not available).", stats.orphan_checks),
        ("zeronce_pool_events_total", "\"Zeroable pages appeared\" events delivered.", stats.events),
        ("zeronce_pool_refused_peers_total", "Connections closed because their peer's user is not allowed (SO_PEERCRED).", refused_peers),
        ("zeronce_pool_connections_total", "Client connections served.", n(&k.accepted)),
        ("zeronce_pool_refused_connections_total", "Connections refused at --max-connections.", n(&k.refused)),
        ("zeronce_pool_refused_per_process_connections_total", "Connections refused because their process had --max-connections-per-pid already.", n(&k.refused_per_pid)),
        ("zeronce_pool_refused_per_user_connections_total", "Connections refused because their user had --max-connections-per-uid already.", n(&k.refused_per_uid)),
        ("zeronce_pool_idle_timeouts_total", "Connections closed after --idle-timeout-ms without a request.", n(&k.timed_out)),
        ("zeronce_pool_lines_too_long_total", "Request lines longer than the limit (skipped).", n(&k.lines_too_long)),
        ("zeronce_pool_bad_requests_total", "Requests answered bad_request.", n(&k.bad_requests)),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, v);
    }
    e.counter_f64(
        "zeronce_pool_zeroing_seconds_total",
        "Time spent zeroing (background and inline), seconds.",
        c.zeroing_nanos as f64 / 1e9,
    )
    .gauge(
        "zeronce_pool_zeroing_bytes_per_second",
        "Zeroing rate: bytes zeroed per second of zeroing time.",
        stats.zeroing_gb_per_s() * 1e9,
    )
    .gauge(
        "zeronce_pool_connections",
        "Client connections served now.",
        conns.open() as f64,
    );
    e.finish()
}
