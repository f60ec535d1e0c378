//! End to end: `zeronce pool serve` as a daemon process, this test process as its
//! clients over the control socket. Needs a hugetlbfs mount of 2 MiB pages
//! (`ZERONCE_HUGETLBFS_2M`): ignored by a plain `cargo nextest run`; `.ci/run` mounts one
//! and runs it; without the mount it fails saying what to set up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;
use zeronce_mem::{BackingKind, DiscardOp, GuestRam, HugePageSize};
use zeronce_pool::client::{Client, TakeOptions, TakenFile};
use zeronce_pool::files::mount_from_env;

const PAGE: usize = 2 << 20;
const PAGES: usize = 4;
/// Readiness waits give up after this (a hung daemon fails the test, it is no timing).
const PATIENCE: Duration = Duration::from_secs(120);

/// The daemon process and its files; killed and removed on drop.
struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
    state: PathBuf,
}

impl Daemon {
    fn start(name: &str) -> Daemon {
        let mount = mount_from_env().unwrap_or_else(|e| panic!("{e}"));
        let id = format!("{name}-{}", std::process::id());
        let dir = mount.join(&id);
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = std::env::temp_dir();
        let socket = tmp.join(format!("zeronce-{id}.sock"));
        let state = tmp.join(format!("zeronce-{id}.state"));
        let child = Command::new(env!("CARGO_BIN_EXE_zeronce"))
            .args(["pool", "serve", "--files", "1", "--workers", "1"])
            .arg("--size")
            .arg(format!("{}", PAGES * PAGE))
            .arg("--dir")
            .arg(&dir)
            .arg("--socket")
            .arg(&socket)
            .arg("--state")
            .arg(&state)
            .spawn()
            .expect("spawning zeronce pool serve");
        let mut d = Daemon {
            child: Some(child),
            dir,
            socket,
            state,
        };
        d.wait_for(|d| Client::connect(&d.socket).is_ok(), "the control socket");
        d
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connecting to the daemon")
    }

    fn stats(&self) -> Value {
        self.client().stats().expect("stats")
    }

    /// Takes a file by path on a fresh connection, waiting until one is ready.
    fn take_waiting(&self) -> TakenFile {
        let wait = TakeOptions {
            wait: true,
            ..TakeOptions::default()
        };
        self.client().take(PAGE as u64, wait).expect("take")
    }

    /// Polls until `ready` (the daemon must still be running).
    fn wait_for(&mut self, ready: impl Fn(&Daemon) -> bool, what: &str) {
        let start = Instant::now();
        while !ready(self) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("the daemon exited ({status}) while waiting for {what}");
            }
            assert!(start.elapsed() < PATIENCE, "no {what} after {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the daemon has no zeroing work left.
    fn wait_idle(&mut self) {
        self.wait_for(
            |d| {
                let p = &d.stats()["pages"];
                p["zeroable"] == 0 && p["zeroing"] == 0
            },
            "idle pool",
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.state);
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn map(file: std::os::fd::OwnedFd) -> GuestRam {
    GuestRam::map_file(file, BackingKind::Hugetlb(HugePageSize::Size2M)).expect("mmap MAP_SHARED")
}

fn open(path: &Path) -> std::os::fd::OwnedFd {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    f.into()
}

/// What a VMM does: every page reads zero; the guest writes all of it.
fn check_zero_then_write(ram: &mut GuestRam) {
    for page in 0..ram.len() / PAGE {
        assert!(
            ram.is_zero(page * PAGE, PAGE).unwrap(),
            "page {page} of a taken file is not zero"
        );
    }
    let len = ram.len();
    ram.fill(0, len, 0x5A).unwrap();
}

fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name].as_u64().unwrap()
}

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
    daemon.client().give_back(&taken.path).unwrap();
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
    daemon.client().give_back(&taken.path).unwrap();

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
