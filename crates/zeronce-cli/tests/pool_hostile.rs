//! `zeronce pool serve` against buggy, hostile and long-lived clients (issue 20): a
//! return by someone else than the taker, a return of a file another process still maps,
//! a take of 0 bytes, invalid UTF-8, a line without end, many idle clients, SIGTERM in
//! the middle of zeroing, thousands of take/return sessions. Each test speaks the
//! protocol as raw JSON lines where the library client would not send what it sends.
//! Needs a hugetlbfs mount of 2 MiB pages (`ZERONCE_HUGETLBFS_2M`): ignored by a plain
//! `cargo nextest run`; `.ci/run` mounts one and runs them.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use common::pool::{
    check_zero_then_write, counter, map, open, pool_as_nobody, refused, take, Daemon, Raw, PAGE,
    PAGES,
};

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn only_the_taker_may_return_a_file() {
    let mut daemon = Daemon::start("owner");
    daemon.wait_idle();
    let mut taker = Raw::connect(&daemon.socket);
    let taken = taker.request(&take(PAGE)).expect("a take reply");
    let path = taken["path"].as_str().expect("a path").to_owned();
    let token = taken["token"].as_str().unwrap_or("").to_owned();

    // Another connection, without the token or with a wrong one: refused, the file stays
    // the taker's.
    let mut other = Raw::connect(&daemon.socket);
    let reply = other.request(&json!({"op": "return", "path": path}));
    assert!(
        refused(&reply, "not_owner"),
        "return by a stranger: {reply:?}"
    );
    let reply = other.request(&json!({"op": "return", "path": path, "token": "00ff"}));
    assert!(refused(&reply, "not_owner"), "a wrong token: {reply:?}");
    let s = daemon.stats();
    assert_eq!(s["pages"]["in_use"], PAGES, "{s}");
    assert_eq!(counter(&s, "returns"), 0, "{s}");
    assert_eq!(counter(&s, "returns_refused"), 2, "{s}");

    // The token returns it from any connection (a VMM that restarted).
    let reply = other
        .request(&json!({"op": "return", "path": path, "token": token}))
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    daemon.wait_idle();
    // The taker's own connection needs no token (clients from before tokens).
    let taken = taker.request(&take(PAGE)).unwrap();
    let reply = taker
        .request(&json!({"op": "return", "path": taken["path"]}))
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(counter(&daemon.stats(), "returns"), 2);
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_returned_file_another_process_maps_is_not_zeroed_until_unmapped() {
    let mut daemon = Daemon::start("inuse");
    daemon.wait_idle();
    let mut taker = Raw::connect(&daemon.socket);
    let taken = taker.request(&take(PAGE)).unwrap();
    let path = std::path::PathBuf::from(taken["path"].as_str().unwrap());
    // This test process is "the VMM": it still maps the file when the taker returns it.
    let mut ram = map(open(&path));
    check_zero_then_write(&mut ram);
    let checks = counter(&daemon.stats(), "orphan_checks");
    let reply = taker
        .request(&json!({"op": "return", "path": path}))
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    // Either the daemon holds it (and has looked at its users twice since), or it zeroed
    // it: then the mapping below reads zero.
    daemon.wait_for(
        |d| {
            let s = d.stats();
            let held =
                s["pages"]["orphaned"] == PAGES && counter(&s, "orphan_checks") >= checks + 2;
            let zeroed = s["pages"]["free_zero"] == PAGES;
            held || zeroed
        },
        "the file held or zeroed",
    );
    assert!(
        !ram.is_zero(0, ram.len()).unwrap(),
        "the daemon zeroed a returned file another process still maps"
    );
    assert_eq!(reply["in_use"], true, "{reply}");
    assert_eq!(counter(&daemon.stats(), "returns_in_use"), 1);
    drop(ram);
    daemon.wait_for(
        |d| counter(&d.stats(), "orphans_reclaimed") == 1,
        "the reclaim once unmapped",
    );
    daemon.wait_idle();
    let taken = daemon.take_waiting();
    check_zero_then_write(&mut map(open(&taken.path)));
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_restart_that_lost_its_state_file_zeroes_no_file_in_use() {
    let mut daemon = Daemon::start("lostrecord");
    daemon.wait_idle();
    let taken = daemon.take_waiting();
    let mut ram = map(open(&taken.path));
    check_zero_then_write(&mut ram);
    // The daemon is killed and its record of the take is lost.
    let mut child = daemon.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_file(&daemon.state).unwrap();
    daemon.spawn();
    daemon.wait_for(
        |d| {
            let p = &d.stats()["pages"];
            p["orphaned"] == PAGES || (p["zeroable"] == 0 && p["zeroing"] == 0)
        },
        "the file held or zeroed",
    );
    assert!(
        !ram.is_zero(0, ram.len()).unwrap(),
        "the restarted daemon zeroed a file this process maps"
    );
    drop(ram);
    daemon.wait_for(
        |d| counter(&d.stats(), "orphans_reclaimed") == 1,
        "the reclaim once unmapped",
    );
    daemon.wait_idle();
    check_zero_then_write(&mut map(open(&daemon.take_waiting().path)));
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_take_of_zero_bytes_and_invalid_utf8_get_error_replies_on_a_live_connection() {
    let mut daemon = Daemon::start("badlines");
    daemon.wait_idle();
    let mut raw = Raw::connect(&daemon.socket);
    let reply = raw.request(&take(0));
    assert!(refused(&reply, "bad_request"), "take of 0 bytes: {reply:?}");
    assert_eq!(daemon.stats()["pages"]["in_use"], 0);
    raw.send(b"{\"op\":\"stats\xff\xfe\"}\n");
    let reply = raw.reply();
    assert!(refused(&reply, "bad_request"), "invalid UTF-8: {reply:?}");
    let reply = raw
        .request(&json!({"op": "stats"}))
        .expect("the connection lives");
    assert_eq!(reply["ok"], true);
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_line_without_end_does_not_grow_the_daemon() {
    let mut daemon = Daemon::start("longline");
    daemon.wait_idle();
    let rss_before = daemon.status("VmRSS");
    let mut raw = Raw::connect(&daemon.socket);
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..256 {
        raw.send(&chunk);
    }
    let rss_during = daemon.status("VmRSS");
    raw.send(b"\n");
    let reply = raw.reply();
    assert!(refused(&reply, "bad_request"), "256 MiB line: {reply:?}");
    let reply = raw
        .request(&json!({"op": "stats"}))
        .expect("the connection lives");
    assert_eq!(reply["ok"], true);
    assert!(
        rss_during < rss_before + 16 * 1024,
        "the daemon's RSS grew from {rss_before} kB to {rss_during} kB on one line"
    );
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_thousand_idle_clients_do_not_make_a_thousand_threads() {
    const MAX: u64 = 32;
    let mut daemon = Daemon::start_with(
        "idle",
        &["--max-connections", "32", "--idle-timeout-ms", "2000"],
    );
    daemon.wait_idle();
    let threads_before = daemon.status("Threads");
    // Sample the daemon's thread count while the clients sit there.
    let (stop, most) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let sampler = {
        let (stop, most, pid) = (Arc::clone(&stop), Arc::clone(&most), daemon.pid());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    let n = s
                        .lines()
                        .find_map(|l| l.strip_prefix("Threads:"))
                        .and_then(|n| n.trim().parse().ok())
                        .unwrap_or(0);
                    most.fetch_max(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let mut idle: Vec<Raw> = (0..1000).map(|_| Raw::connect(&daemon.socket)).collect();
    // Each gets one line: refused at once, or closed when idle too long.
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for raw in &mut idle {
        let reply = raw.reply();
        let kind = reply.map_or("(closed without a reply)".into(), |r| {
            r["error"].to_string()
        });
        *kinds.entry(kind).or_default() += 1;
        assert!(
            most.load(Ordering::Relaxed) <= threads_before + MAX + 2,
            "{} daemon threads for idle clients ({threads_before} before)",
            most.load(Ordering::Relaxed)
        );
    }
    drop(idle);
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(
        kinds.get("\"too_many_connections\""),
        Some(&(1000 - MAX as usize)),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.get("\"idle_timeout\""),
        Some(&(MAX as usize)),
        "{kinds:?}"
    );
    // A real client is served.
    let taken = daemon.take_waiting();
    daemon
        .client()
        .give_back(&taken.path)
        .expect_err("another connection, no token");
    let c = &daemon.stats()["connections"];
    assert_eq!(
        (c["refused"].as_u64(), c["timed_out"].as_u64()),
        (Some(1000 - MAX), Some(MAX))
    );
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn sigterm_in_the_middle_of_zeroing_loses_nothing_and_hands_out_no_half_zeroed_file() {
    // Background zeroing capped at 2 pages a second: SIGTERM lands in the middle.
    let mut daemon = Daemon::start_with("sigterm", &["--max-rate", "4M"]);
    daemon.wait_idle();
    let mut taker = daemon.client();
    let taken = taker.take(PAGE as u64, Default::default()).unwrap();
    check_zero_then_write(&mut map(open(&taken.path)));
    taker.give_back(&taken.path).unwrap();
    daemon.wait_for(
        |d| counter(&d.stats(), "pages_zeroed_background") >= 1,
        "the first page zeroed",
    );
    let s = daemon.stats();
    assert!(
        counter(&s, "pages_zeroed_background") < PAGES as u64,
        "too late: {s}"
    );
    let status = daemon.terminate();
    assert!(status.success(), "daemon exit on SIGTERM: {status}");
    let state = std::fs::read_to_string(&daemon.state).unwrap();
    assert!(
        state.contains("\"dirty\""),
        "half-zeroed, recorded: {state}"
    );

    // Restarted: the file is zeroed again before anyone gets it.
    daemon.spawn();
    let taken = daemon.take_waiting();
    check_zero_then_write(&mut map(open(&taken.path)));
    // A file held across SIGTERM and a restart: still held, returned with its token.
    let status = daemon.terminate();
    assert!(status.success(), "daemon exit on SIGTERM: {status}");
    daemon.spawn();
    assert_eq!(daemon.stats()["pages"]["in_use"], PAGES);
    let mut raw = Raw::connect(&daemon.socket);
    let reply = raw.request(&json!({"op": "return", "path": taken.path}));
    assert!(refused(&reply, "not_owner"), "{reply:?}");
    daemon
        .client()
        .return_with_token(&taken.path, &taken.token)
        .unwrap();
    daemon.wait_idle();
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn thousands_of_take_return_sessions_keep_descriptors_threads_and_memory_flat() {
    // Four clients at once, each a new session per cycle; six one-page files, so some
    // are zeroed while four are taken.
    const CLIENTS: usize = 4;
    const WARM_UP: usize = 100;
    const CYCLES: usize = 1250;
    let size = PAGE.to_string();
    let mut daemon =
        Daemon::start_args("soak", &["--files", "6", "--size", &size, "--workers", "1"]);
    daemon.wait_idle();
    let run = |d: &Daemon, cycles: usize| {
        std::thread::scope(|s| {
            for _ in 0..CLIENTS {
                s.spawn(|| {
                    for _ in 0..cycles {
                        let mut c = d.client();
                        let how = zeronce_pool::client::TakeOptions {
                            wait: true,
                            ..Default::default()
                        };
                        let taken = c.take(PAGE as u64, how).expect("take");
                        c.give_back(&taken.path).expect("return");
                    }
                });
            }
        })
    };
    let settle = |d: &mut Daemon| {
        d.wait_idle();
        // Client threads end just after their connection's last reply (the last one
        // is wait_idle's own): counted by name, not through another connection.
        d.wait_for(|d| d.client_threads() == 0, "client threads done");
        (d.fds(), d.status("Threads"), d.status("VmRSS"))
    };
    run(&daemon, WARM_UP);
    let before = settle(&mut daemon);
    let (start, cpu) = (std::time::Instant::now(), daemon.cpu_ticks());
    run(&daemon, CYCLES);
    let (elapsed, cpu) = (start.elapsed(), daemon.cpu_ticks() - cpu);
    let after = settle(&mut daemon);
    let total = CLIENTS * CYCLES;
    eprintln!(
        "soak: {total} sessions in {elapsed:?}, daemon CPU {cpu} ticks; (fds, threads, RSS kB) {before:?} -> {after:?}"
    );
    let returns = counter(&daemon.stats(), "returns");
    assert_eq!(returns, (CLIENTS * (WARM_UP + CYCLES)) as u64);
    assert!(
        after.0 <= before.0,
        "descriptors grew: {before:?} -> {after:?}"
    );
    assert!(after.1 <= before.1, "threads grew: {before:?} -> {after:?}");
    assert!(
        after.2 <= before.2 + 1024,
        "RSS grew by more than 1 MiB: {before:?} -> {after:?}"
    );
}

/// The samples of the pool's Prometheus page, by name (with labels), its form checked by
/// [`zeronce_daemon::prometheus::parse`]; every name starts `zeronce_pool_`.
fn parse_metrics(page: &str) -> std::collections::BTreeMap<String, f64> {
    let samples = zeronce_daemon::prometheus::parse(page).unwrap_or_else(|e| panic!("{e}"));
    for name in samples.keys() {
        assert!(name.starts_with("zeronce_pool_"), "{name}");
    }
    samples
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_peer_of_another_user_is_refused_unless_allowed_and_the_metrics_page_counts_it() {
    let metrics = std::env::temp_dir().join(format!("zeronce-pm-{}.sock", std::process::id()));
    let metrics_arg = metrics.to_str().unwrap();
    let args = ["--socket-mode", "0666", "--metrics", metrics_arg];
    let mut daemon = Daemon::start_with("peer", &args);
    daemon.wait_idle();
    let out = pool_as_nobody(&["stats"], &daemon.socket);
    assert!(!out.status.success(), "nobody was answered: {out:?}");
    let addr = zeronce_daemon::endpoint::MetricsAddr::Unix(metrics.clone());
    let page = zeronce_daemon::endpoint::scrape(&addr).expect("the metrics page");
    let m = parse_metrics(&page);
    assert_eq!(m["zeronce_pool_refused_peers_total"], 1.0, "{page}");
    drop(daemon);
    // Allowed by uid: answered.
    let daemon = Daemon::start_with(
        "peer-allowed",
        &["--socket-mode", "0666", "--allow-uid", "65534"],
    );
    let out = pool_as_nobody(&["stats"], &daemon.socket);
    assert!(out.status.success(), "{out:?}");
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn the_metrics_page_parses_and_counts_takes_returns_refusals_and_zeroing() {
    let metrics = std::env::temp_dir().join(format!("zeronce-pm2-{}.sock", std::process::id()));
    let mut daemon = Daemon::start_with("metrics", &["--metrics", metrics.to_str().unwrap()]);
    daemon.wait_idle();
    let mut taker = Raw::connect(&daemon.socket);
    let taken = taker.request(&take(PAGE)).unwrap();
    let mut other = Raw::connect(&daemon.socket);
    let reply = other.request(&json!({"op": "return", "path": taken["path"]}));
    assert!(refused(&reply, "not_owner"), "{reply:?}");
    let reply = taker.request(&json!({"op": "return", "path": taken["path"]}));
    assert_eq!(reply.unwrap()["ok"], true);
    drop((taker, other));
    daemon.wait_idle();
    let addr = zeronce_daemon::endpoint::MetricsAddr::Unix(metrics.clone());
    let m = parse_metrics(&zeronce_daemon::endpoint::scrape(&addr).unwrap());
    let s = daemon.stats();
    let page_bytes = PAGE as f64;
    assert_eq!(m["zeronce_pool_takes_total"], 1.0, "{m:?}");
    assert_eq!(m["zeronce_pool_returns_total"], 1.0, "{m:?}");
    assert_eq!(m["zeronce_pool_returns_refused_total"], 1.0, "{m:?}");
    assert_eq!(m["zeronce_pool_returns_in_use_total"], 0.0, "{m:?}");
    assert_eq!(
        m["zeronce_pool_pages{state=\"free_zero\"}"], PAGES as f64,
        "{m:?}"
    );
    assert_eq!(m["zeronce_pool_pages{state=\"in_use\"}"], 0.0, "{m:?}");
    assert_eq!(m["zeronce_pool_page_bytes"], page_bytes);
    let zeroed = m["zeronce_pool_zeroed_background_bytes_total"]
        + m["zeronce_pool_zeroed_inline_bytes_total"]
        + m["zeronce_pool_repopulated_bytes_total"];
    assert!(zeroed >= 2.0 * PAGES as f64 * page_bytes, "{m:?}");
    assert_eq!(
        m["zeronce_pool_zeroed_background_bytes_total"],
        counter(&s, "pages_zeroed_background") as f64 * page_bytes
    );
    assert!(m["zeronce_pool_zeroing_seconds_total"] >= 0.0);
    assert!(m["zeronce_pool_zeroing_bytes_per_second"] >= 0.0);
    assert!(m["zeronce_pool_connections_total"] >= 3.0, "{m:?}");
    assert_eq!(m["zeronce_pool_refused_peers_total"], 0.0);
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn one_process_reconnecting_cannot_take_every_connection() {
    let mut daemon = Daemon::start_with(
        "perpid",
        &["--max-connections", "8", "--max-connections-per-pid", "3"],
    );
    daemon.wait_idle();
    // wait_idle's own connections are this process's too.
    daemon.wait_no_clients();
    let mut mine: Vec<Raw> = (0..3).map(|_| Raw::connect(&daemon.socket)).collect();
    for raw in &mut mine {
        assert_eq!(raw.request(&json!({"op": "stats"})).unwrap()["ok"], true);
    }
    let reply = Raw::connect(&daemon.socket).reply();
    assert!(refused(&reply, "too_many_connections"), "{reply:?}");
    let message = reply.unwrap()["message"].to_string();
    assert!(
        message.contains(&format!("process {}", std::process::id())),
        "{message}"
    );
    // Another process is served.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(["pool", "stats", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["connections"]["refused_per_pid"], 1, "{v}");
    // A slot given back is this process's again.
    mine.pop();
    daemon.wait_for(|d| d.client().stats().is_ok(), "a slot for this process");
}
