//! The daemon over thousands of front-end sessions: nothing it holds grows with their
//! number (open descriptors, threads, resident memory). Each session is a connection,
//! `SET_OWNER` and `GET_FEATURES` (answered), then a disconnect; the daemon runs in this
//! process, so `/proc/self` is the daemon's.

use std::os::unix::net::UnixStream;

use crate::protocol_tests::{reply, send, Daemon, GET_FEATURES, SET_OWNER};

/// Sessions of the soak (issue 20: at least 5000).
const SESSIONS: usize = 5000;
/// Sessions before the first measurement (thread stacks, allocator arenas settle).
const WARM_UP: usize = 200;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn status_field(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("{name} in /proc/self/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// One session, still connected: returned once the daemon answered, so every previous
/// session has ended (the daemon serves one front-end at a time) and this one is not
/// being torn down while the caller measures.
fn session(d: &Daemon) -> UnixStream {
    let s = UnixStream::connect(&d.socket).unwrap();
    send(&s, SET_OWNER, 0, &[], &[]);
    send(&s, GET_FEATURES, 0, &[], &[]);
    let features = reply(&s, GET_FEATURES);
    assert_eq!(features.len(), 8);
    s
}

/// Descriptors, threads (`Threads`) and resident memory (`VmRSS`, KiB) now.
fn measure() -> (usize, u64, u64) {
    (open_fds(), status_field("Threads:"), status_field("VmRSS:"))
}

#[test]
fn five_thousand_sessions_leave_fds_threads_and_rss_flat() {
    let d = Daemon::start("soak");
    for _ in 0..WARM_UP {
        session(&d);
    }
    // Measured with one session connected and all others ended.
    let live = session(&d);
    let before = measure();
    drop(live);
    for _ in 0..SESSIONS {
        session(&d);
    }
    let live = session(&d);
    let after = measure();
    drop(live);
    eprintln!("{SESSIONS} sessions: (fds, threads, rss KiB) {before:?} -> {after:?}");
    assert!(
        after.0 <= before.0 + 2,
        "open descriptors grew over {SESSIONS} sessions: {} -> {}",
        before.0,
        after.0
    );
    assert!(
        after.1 <= before.1 + 2,
        "threads grew over {SESSIONS} sessions: {} -> {}",
        before.1,
        after.1
    );
    // Allocator noise, not a per-session cost: a leak of 1 KiB a session would be 5 MiB.
    assert!(
        after.2 <= before.2 + 2048,
        "resident memory grew over {SESSIONS} sessions: {} -> {} KiB",
        before.2,
        after.2
    );
}
