//! `zeronce pool serve` as a daemon process for the tests that drive it over its socket.
//! They need a hugetlbfs mount of 2 MiB pages (`ZERONCE_HUGETLBFS_2M`). The binary is
//! the one built with the tests, or `ZERONCE_POOL_TEST_BIN` (to run a test against
//! another build, e.g. the code before a fix).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zeronce_mem::{BackingKind, GuestRam, HugePageSize};
use zeronce_pool::client::{Client, TakeOptions, TakenFile};
use zeronce_pool::files::mount_from_env;

/// Bytes per huge page.
pub const PAGE: usize = 2 << 20;
/// Pages per pool file.
pub const PAGES: usize = 4;
/// Readiness waits give up after this (a hung daemon fails the test, it is no timing).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// The daemon process and its files; killed and removed on drop.
pub struct Daemon {
    /// The daemon process (`None` once a test took it to stop it itself).
    pub child: Option<Child>,
    /// Its directory on the mount.
    pub dir: PathBuf,
    /// Its control socket.
    pub socket: PathBuf,
    /// Its state file.
    pub state: PathBuf,
    args: Vec<String>,
}

impl Daemon {
    /// One file of [`PAGES`] pages, one worker.
    pub fn start(name: &str) -> Daemon {
        Daemon::start_with(name, &[])
    }

    /// One file of [`PAGES`] pages, one worker, and `args`.
    pub fn start_with(name: &str, args: &[&str]) -> Daemon {
        let size = (PAGES * PAGE).to_string();
        let mut all = vec!["--files", "1", "--workers", "1", "--size", &size];
        all.extend_from_slice(args);
        Daemon::start_args(name, &all)
    }

    /// `zeronce pool serve` with `args` (besides its directory, socket and state file).
    pub fn start_args(name: &str, args: &[&str]) -> Daemon {
        let mount = mount_from_env().unwrap_or_else(|e| panic!("{e}"));
        let id = format!("{name}-{}", std::process::id());
        let dir = mount.join(&id);
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = std::env::temp_dir();
        let mut d = Daemon {
            child: None,
            dir,
            socket: tmp.join(format!("zeronce-{id}.sock")),
            state: tmp.join(format!("zeronce-{id}.state")),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        let _ = std::fs::remove_file(&d.state);
        d.spawn();
        d
    }

    /// Starts the daemon process (again: same directory, socket and state file).
    pub fn spawn(&mut self) {
        let bin = std::env::var_os("ZERONCE_POOL_TEST_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_zeronce").into());
        let child = Command::new(bin)
            .args(["pool", "serve", "--dir"])
            .arg(&self.dir)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state")
            .arg(&self.state)
            .args(&self.args)
            .spawn()
            .expect("spawning zeronce pool serve");
        self.child = Some(child);
        self.wait_for(|d| Client::connect(&d.socket).is_ok(), "the control socket");
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the daemon runs").id()
    }

    /// SIGTERM, and its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the daemon runs");
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        child.wait().unwrap()
    }

    /// A new connection.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connecting to the daemon")
    }

    /// The `stats` reply, on a new connection.
    pub fn stats(&self) -> Value {
        self.client().stats().expect("stats")
    }

    /// Takes a file by path on a fresh connection, waiting until one is ready.
    pub fn take_waiting(&self) -> TakenFile {
        let wait = TakeOptions {
            wait: true,
            ..TakeOptions::default()
        };
        self.client().take(PAGE as u64, wait).expect("take")
    }

    /// Polls until `ready` (the daemon must still be running).
    pub fn wait_for(&mut self, ready: impl Fn(&Daemon) -> bool, what: &str) {
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
    pub fn wait_idle(&mut self) {
        self.wait_for(
            |d| {
                let p = &d.stats()["pages"];
                p["zeroable"] == 0 && p["zeroing"] == 0
            },
            "idle pool",
        );
    }

    /// Waits until no thread serves a client connection: a closed connection counts
    /// against the connection limits until its thread ends, a moment after the close.
    pub fn wait_no_clients(&mut self) {
        self.wait_for(|d| d.client_threads() == 0, "no client connection left");
    }

    /// A `/proc/PID/status` field of the daemon (`Threads`, `VmRSS` in kB), and its
    /// number of open descriptors.
    pub fn status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in the daemon's status"));
        line.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// The daemon's threads serving a client connection (named `zeronce-pool-client`,
    /// which `comm` cuts to 15 bytes); a thread's connection is closed before it ends.
    pub fn client_threads(&self) -> usize {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid())).unwrap();
        tasks
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("zeronce-pool-cl"))
            })
            .count()
    }

    /// CPU time the daemon used so far (user and system, all threads), in clock ticks
    /// (`/proc/PID/stat` fields 14 and 15; 100 a second on Linux).
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // The fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')').expect("a /proc stat line") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }

    /// The daemon's open descriptors.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
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

/// A raw connection speaking JSON lines, for what [`Client`] never sends.
pub struct Raw {
    /// The socket.
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Raw {
    /// Connects to `socket`.
    pub fn connect(socket: &Path) -> Raw {
        let stream = UnixStream::connect(socket).expect("connecting to the daemon");
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Raw { stream, reader }
    }

    /// Sends `bytes` as they are.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("sending to the daemon");
    }

    /// Reads one reply line (`None`: the daemon closed the connection).
    pub fn reply(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&line).expect("a JSON reply line")),
        }
    }

    /// Sends one JSON request line and reads its reply.
    pub fn request(&mut self, request: &Value) -> Option<Value> {
        self.send(format!("{request}\n").as_bytes());
        self.reply()
    }
}

/// Maps a descriptor of a pool file, shared.
pub fn map(file: std::os::fd::OwnedFd) -> GuestRam {
    GuestRam::map_file(file, BackingKind::Hugetlb(HugePageSize::Size2M)).expect("mmap MAP_SHARED")
}

/// Opens a pool file read-write.
pub fn open(path: &Path) -> std::os::fd::OwnedFd {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    f.into()
}

/// What a VMM does: every page reads zero; the guest writes all of it.
pub fn check_zero_then_write(ram: &mut GuestRam) {
    for page in 0..ram.len() / PAGE {
        assert!(
            ram.is_zero(page * PAGE, PAGE).unwrap(),
            "page {page} of a taken file is not zero"
        );
    }
    let len = ram.len();
    ram.fill(0, len, 0x5A).unwrap();
}

/// A counter of a `stats` reply.
pub fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name].as_u64().unwrap()
}

/// A `take` request of `bytes`, waiting for a ready file.
pub fn take(bytes: usize) -> Value {
    json!({"op": "take", "bytes": bytes, "wait": true})
}

/// Whether `reply` is an error reply of `kind`.
pub fn refused(reply: &Option<Value>, kind: &str) -> bool {
    reply
        .as_ref()
        .is_some_and(|r| r["ok"] == false && r["error"] == kind)
}

/// `zeronce pool ARGS` run as user and group 65534 (nobody) through `setpriv`; fails the
/// test saying what is missing when it cannot change users (not root, or no `setpriv`).
pub fn pool_as_nobody(args: &[&str], socket: &std::path::Path) -> std::process::Output {
    let setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output();
    assert!(
        rustix::process::geteuid().is_root() && setpriv.is_ok(),
        "this test needs root and setpriv (util-linux) to connect as another user: run it as root, as .ci/run does"
    );
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_zeronce"))
        .arg("pool")
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    out
}
