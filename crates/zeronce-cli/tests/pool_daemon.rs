//! End to end: `zeronce pool serve` as a daemon process, this test process as its
//! clients over the control socket. Needs a hugetlbfs mount of 2 MiB pages
//! (`ZERONCE_HUGETLBFS_2M`): ignored by a plain `cargo nextest run`; `.ci/run` mounts one
//! and runs it; without the mount it fails saying what to set up.

use std::path::Path;
use std::process::Command;

use zeronce_mem::DiscardOp;
use zeronce_pool::client::TakeOptions;

mod common;

use common::pool::{check_zero_then_write, counter, map, open, Daemon, PAGE, PAGES};

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn clients_get_zero_files_and_punched_pages_come_back_without_daemon_zeroing() {
    let mut daemon = Daemon::start("e2e");
    daemon.wait_idle();

    // Client 1: descriptor passed over the socket, mapped shared, written, returned.
    let mut client = daemon.client();
    let taken = client
        .take(
            PAGE as u64,
            TakeOptions {
                fd: true,
                wait: true,
                lease: false,
            },
        )
        .unwrap();
    assert_eq!(taken.bytes, (PAGES * PAGE) as u64);
    let mut ram = map(taken.fd.expect("SCM_RIGHTS descriptor"));
    check_zero_then_write(&mut ram);
    drop(ram);
    client.give_back(&taken.path).unwrap();
    daemon.wait_idle();
    let after_first = daemon.stats();
    assert_eq!(
        counter(&after_first, "pages_zeroed_background"),
        PAGES as u64
    );

    // Client 2 (the only file, so the one just written): zero everywhere again. It
    // punches two pages, as a balloon would, and returns the file.
    let taken = daemon.take_waiting();
    assert_eq!(taken.served, "prezeroed");
    let mut ram = map(open(&taken.path));
    check_zero_then_write(&mut ram);
    for page in [1, 3] {
        let z = ram
            .discard(page * PAGE, PAGE, DiscardOp::PunchHole)
            .unwrap();
        assert!(z.is_zeroed());
    }
    drop(ram);
    // Another connection than the take's: the token returns it.
    daemon
        .client()
        .return_with_token(&taken.path, &taken.token)
        .unwrap();
    daemon.wait_idle();
    let after_holes = daemon.stats();
    let delta = |name| counter(&after_holes, name) - counter(&after_first, name);
    assert_eq!(delta("pages_repopulated"), 2, "punched pages repopulated");
    assert_eq!(
        delta("pages_zeroed_background"),
        2,
        "only the written pages zeroed"
    );

    // Client 3: everything allocated and zero.
    let taken = daemon.take_waiting();
    let mut ram = map(open(&taken.path));
    assert_eq!(
        ram.file_allocated_bytes().unwrap().unwrap(),
        (PAGES * PAGE) as u64
    );
    check_zero_then_write(&mut ram);
    drop(ram);
    // Another connection than the take's: the token returns it.
    daemon
        .client()
        .return_with_token(&taken.path, &taken.token)
        .unwrap();

    // Clean shutdown on SIGTERM: exit 0, socket removed, state written.
    let mut child = daemon.child.take().unwrap();
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "daemon exit: {status}");
    assert!(!daemon.socket.exists(), "socket removed");
    let state = std::fs::read_to_string(&daemon.state).unwrap();
    assert!(
        state.contains("\"dirty\"") || state.contains("\"zero\""),
        "{state}"
    );
}

/// Waits until `path` holds a process id, and returns it.
fn wait_for_pid(daemon: &mut Daemon, path: &Path) -> i32 {
    daemon.wait_for(
        |_| std::fs::read_to_string(path).is_ok_and(|s| s.trim().parse::<i32>().is_ok()),
        "the VMM's pid file",
    );
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_leased_file_is_reclaimed_only_once_no_process_has_it_open_or_mapped() {
    let mut daemon = Daemon::start("lease");
    daemon.wait_idle();
    let pages = PAGES as u64;
    let orphaned = |d: &Daemon| d.stats()["pages"]["orphaned"].as_u64().unwrap();
    // Two more checks of the orphans' users than `now` (the daemon checks about once a
    // second): the state seen after them is what the checks decided.
    let after_two_checks = |d: &mut Daemon| {
        let now = counter(&d.stats(), "orphan_checks");
        d.wait_for(
            |d| counter(&d.stats(), "orphan_checks") >= now + 2,
            "two checks of the orphans",
        );
        d.stats()
    };

    // A leased file returned on its connection is not orphaned when the connection ends.
    let mut client = daemon.client();
    let lease = TakeOptions {
        lease: true,
        wait: true,
        ..TakeOptions::default()
    };
    let taken = client.take(PAGE as u64, lease).unwrap();
    client.give_back(&taken.path).unwrap();
    drop(client);
    daemon.wait_idle();
    assert_eq!(counter(&daemon.stats(), "leases_orphaned"), 0);

    // 1. A launcher (`pool take --fd --lease -- CMD`) starts a "VMM" holding the
    // descriptor, and is killed. The file is orphaned, the VMM still has it open: the
    // daemon must not touch it.
    let pid_file = std::env::temp_dir().join(format!("zeronce-lease-{}.pid", std::process::id()));
    let _ = std::fs::remove_file(&pid_file);
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(["pool", "take", "--fd", "--lease", "--wait", "--size"])
        .arg(PAGE.to_string())
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 600", pid_file.display()))
        .spawn()
        .expect("spawning zeronce pool take");
    let vmm = wait_for_pid(&mut daemon, &pid_file);
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    daemon.wait_for(|d| orphaned(d) == pages, "the file orphaned");
    let s = after_two_checks(&mut daemon);
    assert_eq!(s["pages"]["orphaned"], pages, "reclaimed while open: {s}");
    assert_eq!(counter(&s, "orphans_reclaimed"), 0, "{s}");
    assert_eq!(counter(&s, "leases_orphaned"), 1, "{s}");

    // The VMM exits: nobody has the file any more; it is reclaimed and re-zeroed.
    let vmm = rustix::process::Pid::from_raw(vmm).expect("a pid");
    rustix::process::kill_process(vmm, rustix::process::Signal::KILL).unwrap();
    let _ = std::fs::remove_file(&pid_file);
    daemon.wait_for(
        |d| counter(&d.stats(), "orphans_reclaimed") == 1,
        "the reclaim",
    );
    daemon.wait_idle();

    // 2. A client maps its leased file and closes its connection while still running on
    // the mapping: the file is orphaned but not reclaimed until the mapping is gone.
    let mut client = daemon.client();
    let taken = client
        .take(PAGE as u64, TakeOptions { fd: true, ..lease })
        .unwrap();
    let mut ram = map(taken.fd.expect("SCM_RIGHTS descriptor"));
    check_zero_then_write(&mut ram);
    drop(client);
    daemon.wait_for(|d| orphaned(d) == pages, "the file orphaned");
    let s = after_two_checks(&mut daemon);
    assert_eq!(s["pages"]["orphaned"], pages, "reclaimed while mapped: {s}");
    assert!(
        !ram.is_zero(0, PAGE).unwrap(),
        "the daemon zeroed a mapped file"
    );
    drop(ram);
    daemon.wait_for(
        |d| counter(&d.stats(), "orphans_reclaimed") == 2,
        "the reclaim",
    );
    daemon.wait_idle();

    // The next client gets it zero everywhere.
    let taken = daemon.take_waiting();
    let mut ram = map(open(&taken.path));
    check_zero_then_write(&mut ram);
}
