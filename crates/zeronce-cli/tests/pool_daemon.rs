//! End to end: `zeronce pool serve` as a daemon process, this test process as its
//! clients over the control socket. Needs a hugetlbfs mount of 2 MiB pages
//! (`ZERONCE_HUGETLBFS_2M`): ignored by a plain `cargo nextest run`; `.ci/run` mounts one
//! and runs it; without the mount it fails saying what to set up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;
use zeronce_mem::{BackingKind, DiscardOp, GuestRam, HugePageSize};
use zeronce_pool::client::Client;
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
    let taken = client.take(PAGE as u64, true, true).unwrap();
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
    let taken = daemon.client().take(PAGE as u64, false, true).unwrap();
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
    let taken = daemon.client().take(PAGE as u64, false, true).unwrap();
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
