//! The control socket: accepts clients on a Unix stream socket, one thread per client,
//! and answers the [`proto`](crate::proto) requests from a [`Pool`]. Shuts down cleanly
//! on SIGINT / SIGTERM ([`Server::stop_on_signals`]) or [`Server::stop`].

use std::io::{BufRead, BufReader, IoSlice, Write};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde_json::{json, Value};

use crate::daemon::{Pool, PoolError};
use crate::proto::{error_reply, Request};

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another daemon answers on the socket.
    #[error("{0} is in use by a running pool daemon")]
    InUse(PathBuf),
    /// The socket path holds something other than a socket, or the mode is not one.
    #[error(transparent)]
    Bind(zeronce_daemon::BindError),
    /// Socket setup or polling failed.
    #[error("control socket {path}: {source}")]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The pool failed to shut down cleanly (state file).
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// A control socket bound to a pool.
#[derive(Debug)]
pub struct Server {
    pool: Arc<Pool>,
    listener: UnixListener,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    peers: zeronce_daemon::PeerGate,
}

impl Server {
    /// Binds `path` with [`zeronce_daemon::Access::default`]: mode 0600, only the daemon's
    /// user and root may talk to it.
    pub fn bind(pool: Arc<Pool>, path: &Path) -> Result<Server, ServeError> {
        Self::bind_with(pool, path, &zeronce_daemon::Access::default())
    }

    /// Binds `path` ([`zeronce_daemon::bind`]: a stale socket no daemon answers on is
    /// replaced, a live one or a non-socket refused, the file gets `access`' mode and
    /// group whatever the umask); peers are checked against `access` at accept.
    pub fn bind_with(
        pool: Arc<Pool>,
        path: &Path,
        access: &zeronce_daemon::Access,
    ) -> Result<Server, ServeError> {
        let sock_err = |source| ServeError::Socket {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(sock_err)?;
        }
        let listener = zeronce_daemon::bind(path, &access.socket).map_err(|e| match e {
            zeronce_daemon::BindError::Live(p) => ServeError::InUse(p),
            e => ServeError::Bind(e),
        })?;
        listener.set_nonblocking(true).map_err(sock_err)?;
        Ok(Server {
            pool,
            listener,
            path: path.to_owned(),
            stop: Arc::default(),
            peers: zeronce_daemon::PeerGate::new(access.peers.clone(), "pool"),
        })
    }

    /// A handle that makes [`Server::run`] return (checked every 100 ms).
    pub fn stop_handle(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Asks [`Server::run`] to return.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Makes SIGINT and SIGTERM stop [`Server::run`] (instead of killing the process).
    pub fn stop_on_signals(&self) -> Result<(), ServeError> {
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(signal, Arc::clone(&self.stop)).map_err(|source| {
                ServeError::Socket {
                    path: self.path.clone(),
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// Serves until [`Server::stop`] (or a signal, with [`Server::stop_on_signals`]);
    /// then removes the socket and shuts the pool down (workers stopped after their
    /// current page, state file written).
    pub fn run(self) -> Result<(), ServeError> {
        tracing::info!(socket = %self.path.display(), "serving");
        zeronce_daemon::notify::notify_or_log(zeronce_daemon::notify::READY);
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let mut ticks: u64 = 0;
        let mut backoff = zeronce_daemon::AcceptBackoff::new("pool");
        let result = loop {
            if self.stop.load(Ordering::Acquire) {
                tracing::info!("shutting down");
                zeronce_daemon::notify::notify_or_log(zeronce_daemon::notify::STOPPING);
                break Ok(());
            }
            let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
            match poll(&mut fds, Some(&tick)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    break Err(ServeError::Socket {
                        path: self.path.clone(),
                        source: e.into(),
                    })
                }
            }
            ticks += 1;
            // Orphaned files: look for their users about once a second.
            if ticks.is_multiple_of(10) && self.pool.stats().pages.orphaned > 0 {
                if let Err(e) = self.pool.reclaim_orphans() {
                    tracing::error!(%e, "checking orphaned files failed");
                }
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    if self.peers.admit(&stream).is_some() {
                        self.spawn_client(stream);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // Out of descriptors (EMFILE/ENFILE) or memory: sleep, doubling up to 1 s,
                // instead of a warning per poll.
                Err(e) => std::thread::sleep(backoff.failed(&e)),
            }
        };
        let _ = std::fs::remove_file(&self.path);
        self.pool.shutdown()?;
        tracing::info!("pool stopped; state file written");
        result
    }

    fn spawn_client(&self, stream: UnixStream) {
        let pool = Arc::clone(&self.pool);
        let spawned = std::thread::Builder::new()
            .name("zeronce-pool-client".into())
            .spawn(move || {
                if let Err(e) = serve_client(&pool, stream) {
                    tracing::debug!(%e, "client connection ended");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(%e, "no thread for a client");
        }
    }
}

/// Sends one reply line, with `fd` attached when given.
fn send_line(
    stream: &UnixStream,
    reply: &Value,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let line = format!("{reply}\n");
    let mut sent = 0;
    let fds;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if let Some(fd) = fd {
        fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    while sent < line.len() {
        let n = sendmsg(
            stream,
            &[IoSlice::new(&line.as_bytes()[sent..])],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        sent += n;
        // The descriptor went with the first bytes.
        control = SendAncillaryBuffer::default();
    }
    Ok(())
}

/// Serves one connection; files it leased and did not return are orphaned when it ends,
/// however it ends.
fn serve_client(pool: &Pool, stream: UnixStream) -> std::io::Result<()> {
    let mut leases = Vec::new();
    let result = serve_requests(pool, stream, &mut leases);
    for file in leases {
        if let Err(e) = pool.end_lease(file) {
            tracing::error!(%e, "ending a lease failed");
        }
    }
    result
}

fn serve_requests(
    pool: &Pool,
    stream: UnixStream,
    leases: &mut Vec<crate::state::FileId>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let reader = BufReader::new(stream.try_clone()?);
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let request = match Request::parse(&line) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%e, "bad request");
                send_line(&stream, &error_reply("bad_request", &e.to_string()), None)?;
                continue;
            }
        };
        match request {
            Request::Watch => return watch(pool, stream),
            Request::Take {
                bytes,
                fd,
                wait,
                lease,
            } => match pool.take(bytes, wait) {
                Ok(taken) => {
                    if lease {
                        // Before the client learns the path: a client dying from here
                        // on orphans the file.
                        match pool.lease(taken.file) {
                            Ok(()) => leases.push(taken.file),
                            Err(e) => tracing::error!(%e, "lease not recorded; the file is held"),
                        }
                    }
                    let reply = json!({
                        "ok": true, "path": taken.path, "bytes": taken.bytes,
                        "served": taken.served.name(), "fd": fd,
                    });
                    let dup = if fd { Some(pool.dup(taken.file)) } else { None };
                    match dup {
                        Some(Err(e)) => {
                            // The file is the client's (recorded held): it can open the path.
                            let reply = json!({
                                "ok": true, "path": taken.path, "bytes": taken.bytes,
                                "served": taken.served.name(), "fd": false,
                                "fd_error": e.to_string(),
                            });
                            send_line(&stream, &reply, None)?;
                        }
                        Some(Ok(owned)) => send_line(&stream, &reply, Some(owned.as_fd()))?,
                        None => send_line(&stream, &reply, None)?,
                    }
                }
                Err(e) => send_line(&stream, &pool_error(&e), None)?,
            },
            Request::Return { path } => {
                let reply = match pool.give_back(Path::new(&path)) {
                    Ok(p) => {
                        leases.retain(|&f| pool.path(f) != p);
                        json!({"ok": true, "path": p})
                    }
                    Err(e) => pool_error(&e),
                };
                send_line(&stream, &reply, None)?;
            }
            Request::Stats => {
                let mut v = pool.stats().to_json();
                v["ok"] = true.into();
                v["nodes"] = node_counters(pool.stats().page_bytes);
                send_line(&stream, &v, None)?;
            }
            Request::Prezero { pages } => {
                let r = pool.prezero(pages);
                let reply = json!({
                    "ok": true, "pages_zeroed": r.pages_zeroed,
                    "pages_repopulated": r.pages_repopulated,
                    "elapsed_ms": r.elapsed.as_secs_f64() * 1e3,
                    "zeroable_left": r.zeroable_left,
                });
                send_line(&stream, &reply, None)?;
            }
        }
    }
    Ok(())
}

/// Streams events until the client hangs up or the pool stops.
fn watch(pool: &Pool, mut stream: UnixStream) -> std::io::Result<()> {
    let events = pool.subscribe();
    send_line(&stream, &json!({"ok": true}), None)?;
    while !pool.is_shut_down() {
        match events.recv_timeout(Duration::from_millis(200)) {
            Ok(e) => {
                let line = json!({
                    "event": "zeroable", "pages": e.zeroable, "trailing": e.trailing,
                    "at_ms": e.at.as_secs_f64() * 1e3,
                });
                stream.write_all(format!("{line}\n").as_bytes())?;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(())
}

/// An error reply for a pool error, with a stable kind.
fn pool_error(e: &PoolError) -> Value {
    use crate::state::StateError;
    let kind = match e {
        PoolError::State(StateError::TooLarge { .. }) => "too_large",
        PoolError::State(StateError::Exhausted { .. }) => "exhausted",
        PoolError::State(StateError::Unknown(_)) => "unknown_file",
        PoolError::State(StateError::NotHeld(_)) => "not_held",
        PoolError::ShuttingDown => "shutting_down",
        _ => "internal",
    };
    tracing::info!(%e, kind, "request refused");
    error_reply(kind, &e.to_string())
}

/// The kernel's per-node counters of this page size (empty without NUMA sysfs).
fn node_counters(page_bytes: u64) -> Value {
    let kb = page_bytes / 1024;
    let mut nodes = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else {
        return Value::Array(nodes);
    };
    let mut entries: Vec<_> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id: u32 = name.strip_prefix("node")?.parse().ok()?;
            Some((id, e.path()))
        })
        .collect();
    entries.sort();
    for (id, path) in entries {
        let read = |f: &str| -> Option<u64> {
            let p = path.join(format!("hugepages/hugepages-{kb}kB/{f}"));
            std::fs::read_to_string(p).ok()?.trim().parse().ok()
        };
        if let (Some(total), Some(free)) = (read("nr_hugepages"), read("free_hugepages")) {
            nodes.push(json!({"node": id, "kernel_total": total, "kernel_free": free}));
        }
    }
    Value::Array(nodes)
}
