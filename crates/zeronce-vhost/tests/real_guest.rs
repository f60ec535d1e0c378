//! The daemon driven by a real Linux guest: User Mode Linux (Debian `user-mode-linux`,
//! whose `virtio_uml` transport is a vhost-user front-end) runs the kernel's own
//! `virtio_balloon` driver against `zeronce-vhost serve`. Everything is checked from the
//! host side: the guest's memory file (`fstat` st_blocks of the file UML maps), the
//! guest's /proc/meminfo as it prints it, the daemon's process.
//!
//! Needs `linux.uml` and `insmod` (`apt-get install user-mode-linux kmod`), so the tests
//! are ignored by a plain `cargo nextest run` (reported skipped, like the hugetlb tests);
//! `.ci/run` installs both and runs them with `--run-ignored all`, except on a host where
//! User Mode Linux cannot start its userspace (it says so). Run by hand, without them, a
//! test fails and says what to install.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zeronce_vhost::ServeProcess;

const MIB: u64 = 1 << 20;
/// Generous bound for things that have no required latency (boot, a config change).
const PATIENCE: Duration = Duration::from_secs(90);
/// The bound from the guest's free to the host's drop.
const REPORT_WITHIN: Duration = Duration::from_secs(6);
/// Linux's reporting delay (`PAGE_REPORTING_DELAY`, 2 s) plus 1 s: the hardened guest's
/// bound.
const DELAY_PLUS_ONE: Duration = Duration::from_secs(3);
/// `VIRTIO_BALLOON_F_PAGE_POISON` and `VIRTIO_BALLOON_F_REPORTING`.
const PAGE_POISON: u64 = 1 << 4;
const REPORTING: u64 = 1 << 5;
/// `VIRTIO_BALLOON_F_FREE_PAGE_HINT`.
const FREE_PAGE_HINT: u64 = 1 << 3;
/// The bound from `zeronce balloon hint` to the host's drop.
const HINT_WITHIN: Duration = Duration::from_secs(5);

fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|d| d.join(name).is_file())
}

fn require_uml() {
    let missing: Vec<_> = ["linux.uml", "insmod"]
        .into_iter()
        .filter(|n| !on_path(n))
        .collect();
    assert!(
        missing.is_empty(),
        "the real-guest test needs User Mode Linux: {missing:?} not found; install with \
         `apt-get install user-mode-linux kmod` (as root; .ci/run does it)"
    );
}

/// A running `zeronce-vhost serve` (SIGTERM when dropped; [`ServeProcess::kill`] for a
/// crash).
struct Daemon(ServeProcess);

impl Daemon {
    fn start(socket: &Path) -> Daemon {
        Daemon::start_with(socket, &[])
    }

    /// With `args` after `serve --socket SOCKET` (`--free-page-hint`, ...).
    fn start_with(socket: &Path, args: &[&str]) -> Daemon {
        let bin = Path::new(env!("CARGO_BIN_EXE_zeronce-vhost"));
        Daemon(ServeProcess::spawn(bin, socket, args).expect("start zeronce-vhost serve"))
    }

    fn request(&self, req: Value) -> Value {
        self.0.request(&req).expect("control request")
    }

    fn set_target(&self, bytes: u64) {
        self.request(json!({"op": "set", "pages": bytes / 4096}));
    }
}

/// A booted UML guest in its own process group, killed (the group) when dropped.
struct Guest {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<String>,
    console: Arc<Mutex<Vec<String>>>,
    memory: File,
}

impl Guest {
    fn boot(dir: &Path, socket: &Path) -> Guest {
        Guest::boot_with(dir, socket, &[])
    }

    /// Boots with `extra` on the kernel command line (`init_on_free=1`, ...).
    fn boot_with(dir: &Path, socket: &Path, extra: &[&str]) -> Guest {
        let init = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/guest/init.sh");
        let mut child = Command::new("linux.uml")
            .args([
                "mem=256M",
                "root=/dev/root",
                "rootfstype=hostfs",
                "rootflags=/",
                "rw",
            ])
            .args(extra)
            .arg(format!("init={}", init.display()))
            .args(["con=null", "con0=fd:0,fd:1"])
            .arg(format!("virtio_uml.device={}:5", socket.display()))
            // UML's memory file is an unlinked file in $TMPDIR: ours, so it can be found.
            .env("TMPDIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start linux.uml");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let console = Arc::new(Mutex::new(Vec::new()));
        let (tx, answers) = mpsc::channel();
        let log = Arc::clone(&console);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(answer) = line.strip_prefix("@guest ") {
                    let _ = tx.send(answer.trim().to_owned());
                }
                log.lock().unwrap().push(line);
            }
        });
        let pid = child.id();
        let mut g = Guest {
            child,
            stdin,
            answers,
            console,
            memory: File::open("/dev/null").unwrap(),
        };
        assert_eq!(g.answer(), "balloon-loaded", "{}", g.tail());
        assert_eq!(g.answer(), "ready");
        g.memory = memory_file(pid, dir).unwrap_or_else(|| panic!("no memory file\n{}", g.tail()));
        g
    }

    fn tail(&self) -> String {
        let c = self.console.lock().unwrap();
        c[c.len().saturating_sub(40)..].join("\n")
    }

    fn answer(&self) -> String {
        self.answers.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            let console = self.tail();
            let why = if console.contains("ptrace set fp regs failed") {
                "User Mode Linux cannot start its userspace on this host CPU (its ptrace \
                     of the FPU state fails, as on CPUs with AMX); .ci/run leaves these tests \
                     out on such a host. "
            } else {
                ""
            };
            panic!("{why}the guest did not answer; console:\n{console}")
        })
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("guest console");
        self.answer()
    }

    /// (MemTotal, MemFree) in bytes.
    fn meminfo(&mut self) -> (u64, u64) {
        let a = self.ask("meminfo");
        let v: Vec<u64> = a
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse::<u64>().unwrap() * 1024)
            .collect();
        (v[0], v[1])
    }

    /// Bytes allocated to the guest's memory file.
    fn allocated(&self) -> u64 {
        self.memory.metadata().unwrap().blocks() * 512
    }

    /// Waits until MemTotal is `total`; the seconds it took.
    fn wait_total(&mut self, total: u64) -> f64 {
        let t0 = Instant::now();
        loop {
            let (now, _) = self.meminfo();
            if now == total {
                return t0.elapsed().as_secs_f64();
            }
            assert!(
                t0.elapsed() < PATIENCE,
                "MemTotal {now}, want {total}\n{}",
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn halt(mut self) -> std::process::ExitStatus {
        writeln!(self.stdin, "halt").unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                t0.elapsed() < PATIENCE,
                "the guest did not halt\n{}",
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let pgid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
            let _ = self.child.wait();
        }
    }
}

/// The unlinked file in `dir` that UML maps as the guest's physical memory.
fn memory_file(pid: u32, dir: &Path) -> Option<File> {
    let fds = Path::new("/proc").join(pid.to_string()).join("fd");
    std::fs::read_dir(&fds).ok()?.flatten().find_map(|e| {
        let target = std::fs::read_link(e.path()).ok()?;
        let t = target.to_string_lossy();
        (t.starts_with(&*dir.to_string_lossy()) && t.ends_with("(deleted)"))
            .then(|| File::open(e.path()).ok())
            .flatten()
    })
}

/// Waits until the device is active and holds the guest's first statistics buffer.
fn wait_driver(d: &Daemon) {
    let t0 = Instant::now();
    while d.request(json!({"op": "status"}))["metrics"]["stats_updates"].as_u64() < Some(1) {
        assert!(t0.elapsed() < PATIENCE, "the guest's driver never came up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn test_dir(name: &str) -> PathBuf {
    // Short: a unix socket path holds 107 bytes.
    let dir = std::env::temp_dir().join(format!("zv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// 96 MiB written into the guest's tmpfs, deleted: asserts the host's memory file loses
/// >= 90 % of it within `within` of the free, and prints the figure.
fn freed_memory_returns(g: &mut Guest, daemon: &Daemon, what: &str, within: Duration) {
    let fill = 96 * MIB;
    assert_eq!(g.ask("fill 96"), "filled");
    let before = g.allocated();
    let pages_reported = || {
        daemon.request(json!({"op": "status"}))["metrics"]["pages_reported"]
            .as_u64()
            .unwrap()
    };
    let reported_before = pages_reported();
    assert_eq!(g.ask("drop"), "dropped");
    let freed_at = Instant::now();
    let (dropped, secs) = loop {
        let dropped = before.saturating_sub(g.allocated());
        if dropped * 10 >= fill * 9 || freed_at.elapsed() > within {
            break (dropped, freed_at.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        dropped * 10 >= fill * 9,
        "{what}: after {secs:.1} s the memory file lost {} MiB of the 96 MiB freed",
        dropped / MIB
    );
    println!(
        "figure: {what}: {} MiB of the 96 MiB freed ({:.0} %) left the memory file {secs:.2} s \
         after the free (the device counted {} MiB reported)",
        dropped / MIB,
        dropped as f64 * 100.0 / fill as f64,
        (pages_reported() - reported_before) * 4096 / MIB
    );
}

/// The negotiated feature bits, from the daemon's status.
fn negotiated(daemon: &Daemon) -> u64 {
    let status = daemon.request(json!({"op": "status"}));
    status["features"]
        .as_u64()
        .unwrap_or_else(|| panic!("{status}"))
}

/// Boots a guest with `cmdline`, checks the features it negotiated, measures a freed
/// 96 MiB coming back, and halts it.
fn hardened_guest(name: &str, cmdline: &str, want: u64, unwanted: u64, within: Duration) {
    require_uml();
    let dir = test_dir(name);
    let socket = dir.join("balloon.sock");
    let daemon = Daemon::start(&socket);
    let mut g = Guest::boot_with(&dir, &socket, &[cmdline]);
    wait_driver(&daemon);
    let features = negotiated(&daemon);
    println!("figure: {cmdline}: negotiated features {features:#x}");
    assert_eq!(features & want, want, "{cmdline}: {features:#x}");
    assert_eq!(features & unwanted, 0, "{cmdline}: {features:#x}");
    freed_memory_returns(&mut g, &daemon, cmdline, within);
    let status = daemon.request(json!({"op": "status"}));
    assert_eq!(
        status["metrics"]["reports_skipped_poison"], 0,
        "poison_val is 0: nothing kept back"
    );
    assert!(g.halt().success());
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `init_on_free=1` (freed pages zeroed): Linux keeps PAGE_POISON (bit 4), writes
/// `poison_val` 0 and keeps reporting (bit 5); a discarded page reads as that poison.
#[test]
#[ignore = "boots User Mode Linux: run by .ci/run (--run-ignored all) where it can start its userspace"]
fn a_guest_with_init_on_free_negotiates_page_poison_and_reports() {
    hardened_guest(
        "iof",
        "init_on_free=1",
        PAGE_POISON | REPORTING,
        0,
        DELAY_PLUS_ONE,
    );
}

/// `page_poison=1`: Debian's 6.1 UML kernel is built without CONFIG_PAGE_POISONING, so
/// the parameter does nothing there; the driver then drops PAGE_POISON (neither
/// poisoning nor init_on_free) and keeps reporting, and virtio_uml sends SET_FEATURES a
/// second time, without PAGE_POISON and without the vhost-user protocol bit. Memory
/// comes back as in a default guest.
#[test]
#[ignore = "boots User Mode Linux: run by .ci/run (--run-ignored all) where it can start its userspace"]
fn a_guest_with_page_poison_1_on_this_kernel_drops_page_poison_and_reports() {
    hardened_guest("pp", "page_poison=1", REPORTING, PAGE_POISON, REPORT_WITHIN);
}

/// Free page hinting with reporting off: 96 MiB written into the guest's tmpfs and
/// deleted stay in the memory file until `hint` starts a run; then >= 90 % of it leaves
/// the file within [`HINT_WITHIN`], and the run ends DONE at the guest's STOP.
#[test]
#[ignore = "boots User Mode Linux: run by .ci/run (--run-ignored all) where it can start its userspace"]
fn a_hint_run_returns_a_freed_tmpfs_with_reporting_off() {
    require_uml();
    let dir = test_dir("hint");
    let socket = dir.join("balloon.sock");
    let daemon = Daemon::start_with(&socket, &["--free-page-hint", "--no-page-reporting"]);
    let mut g = Guest::boot(&dir, &socket);
    wait_driver(&daemon);
    let features = negotiated(&daemon);
    println!("figure: hint: negotiated features {features:#x}");
    assert_eq!(features & (FREE_PAGE_HINT | REPORTING), FREE_PAGE_HINT);
    let fill = 96 * MIB;
    assert_eq!(g.ask("fill 96"), "filled");
    let before = g.allocated();
    assert_eq!(g.ask("drop"), "dropped");
    std::thread::sleep(Duration::from_secs(1));
    let kept = before.saturating_sub(g.allocated());
    assert!(
        kept * 10 < fill,
        "reporting is off: {} MiB left early",
        kept / MIB
    );
    let idle = daemon.request(json!({"op": "hint_status"}));
    assert_eq!(idle["state"], "idle", "{idle}");
    let started = daemon.request(json!({"op": "hint"}));
    let id = started["cmd_id"].as_u64().expect("a run");
    let t0 = Instant::now();
    let (dropped, secs, status) = loop {
        let dropped = before.saturating_sub(g.allocated());
        let status = daemon.request(json!({"op": "hint_status"}));
        let done = status["state"] == "done";
        if (dropped * 10 >= fill * 9 && done) || t0.elapsed() > HINT_WITHIN {
            break (dropped, t0.elapsed().as_secs_f64(), status);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "figure: hint: run {id}: {} MiB of the 96 MiB freed ({:.0} %) left the memory file {secs:.2} s after `hint`; device: {status}",
        dropped / MIB,
        dropped as f64 * 100.0 / fill as f64
    );
    assert!(
        dropped * 10 >= fill * 9,
        "hint: after {secs:.1} s the memory file lost {} MiB of the 96 MiB freed; {status}\n{}",
        dropped / MIB,
        g.tail()
    );
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["cmd_id"], id);
    assert!(status["bytes_discarded"].as_u64().unwrap() >= fill * 9 / 10);
    let counters = daemon.request(json!({"op": "status"}))["metrics"].clone();
    assert_eq!(
        counters["malformed"], 0,
        "the guest's chains are well-formed: {counters}"
    );
    // DONE: the guest gave its hinted blocks back; it can use the memory again.
    let (_, free) = g.meminfo();
    assert!(free >= fill, "MemFree {} MiB after DONE", free / MIB);
    assert_eq!(g.ask("fill 96"), "filled", "the hinted memory is usable");
    assert_eq!(g.ask("drop"), "dropped");
    assert!(g.halt().success());
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "boots User Mode Linux: run by .ci/run (--run-ignored all) where it can start its userspace"]
fn real_linux_guest_reports_inflates_deflates_and_sends_stats() {
    require_uml();
    let dir = test_dir("guest");
    let socket = dir.join("balloon.sock");
    let daemon = Daemon::start(&socket);
    let mut g = Guest::boot(&dir, &socket);
    wait_driver(&daemon);

    // (1) Free page reporting: 96 MiB written into the guest's tmpfs, deleted; the host's
    // file loses >= 90 % of it within 6 s of the free.
    freed_memory_returns(&mut g, &daemon, "reporting", REPORT_WITHIN);

    // (2) Inflate 64 MiB through the control socket: MemTotal drops by as much, and so
    // does the file (reporting is off meanwhile, so the balloon takes pages the guest
    // dirtied and freed, not pages already returned); deflate gives MemTotal back.
    assert_eq!(g.ask("report-order 11"), "order 11");
    assert_eq!(g.ask("fill 96"), "filled");
    assert_eq!(g.ask("drop"), "dropped");
    let (total, _) = g.meminfo();
    let before = g.allocated();
    let balloon = 64 * MIB;
    daemon.set_target(balloon);
    let secs = g.wait_total(total - balloon);
    let returned = before.saturating_sub(g.allocated());
    assert!(
        returned * 4 >= balloon * 3,
        "inflating 64 MiB returned only {} MiB of the memory file",
        returned / MIB
    );
    let status = daemon.request(json!({"op": "status"}));
    assert_eq!(status["actual"], balloon / 4096, "{status}");
    println!(
        "figure: inflate: {} pages in {secs:.2} s ({:.0} pages/s, control to guest MemTotal), \
         {} MiB of the memory file returned",
        balloon / 4096,
        (balloon / 4096) as f64 / secs,
        returned / MIB
    );
    daemon.set_target(0);
    let secs = g.wait_total(total);
    println!("figure: deflate: MemTotal back in {secs:.2} s");
    assert_eq!(g.ask("report-order 10"), "order 10");

    // (3) Statistics: the guest's free memory as the device parsed it, against the
    // guest's own MemFree.
    let s = daemon.request(json!({"op": "stats", "timeout_ms": 10_000}));
    assert_eq!(s["fresh"], true, "{s}");
    let (_, mem_free) = g.meminfo();
    let free = s["stats"]["free_memory"]
        .as_u64()
        .expect("free_memory sent");
    let diff = free.abs_diff(mem_free);
    assert!(
        diff * 10 <= mem_free,
        "device says {free} B free, guest MemFree {mem_free} B"
    );
    assert!(s["stats"]["total_memory"].as_u64().unwrap() > 0, "{s}");

    // (4) The daemon dies mid-run: the guest keeps running and shuts down cleanly.
    daemon.0.kill().expect("kill the daemon");
    let (total_after, _) = g.meminfo();
    assert_eq!(total_after, total, "the guest still answers");
    let status = g.halt();
    assert!(status.success(), "the guest's exit: {status}");

    // A fresh daemon (the killed one's socket files removed) serves the next guest.
    for stale in [&socket, &dir.join("balloon.sock.ctl")] {
        std::fs::remove_file(stale).unwrap();
    }
    let daemon = Daemon::start(&socket);
    let mut g = Guest::boot(&dir, &socket);
    wait_driver(&daemon);
    let (total, _) = g.meminfo();
    daemon.set_target(16 * MIB);
    g.wait_total(total - 16 * MIB);
    daemon.set_target(0);
    g.wait_total(total);
    let status = g.halt();
    assert!(status.success(), "the second guest's exit: {status}");
    let status = daemon.request(json!({"op": "status"}));
    assert_eq!(status["connections"], 1, "{status}");
    let exit = daemon.0.terminate().expect("SIGTERM the daemon");
    assert!(exit.success(), "SIGTERM: a clean exit, not {exit}");
    assert!(!socket.exists(), "the socket is removed at shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}
