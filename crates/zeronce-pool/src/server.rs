//! The control socket: accepts clients on a Unix stream socket, one thread per client up
//! to a limit ([`Limits`]), and answers the [`proto`](crate::proto) requests from a
//! [`Pool`]. Shuts down cleanly on SIGINT / SIGTERM ([`Server::stop_on_signals`]) or
//! [`Server::stop`]: no new connection, the pool stopped, every client connection closed
//! and its thread done, then the state file written.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use zeronce_daemon::endpoint::{MetricsAddr, MetricsEndpoint};

use crate::connection::Connections;
pub use crate::connection::Limits;
use crate::daemon::{Pool, PoolError};

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
    limits: Limits,
    conns: Arc<Connections>,
    peers: zeronce_daemon::PeerGate,
    socket_options: zeronce_daemon::SocketOptions,
    metrics: Option<MetricsEndpoint>,
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
            limits: Limits::default(),
            conns: Arc::default(),
            peers: zeronce_daemon::PeerGate::new(access.peers.clone(), "pool"),
            socket_options: access.socket,
            metrics: None,
        })
    }

    /// The same server, also serving its counters as a Prometheus page on `addr` (the
    /// endpoint of [`zeronce_daemon::endpoint`]; a unix socket gets the control
    /// socket's mode and group).
    pub fn with_metrics(mut self, addr: &MetricsAddr) -> Result<Server, ServeError> {
        let endpoint =
            MetricsEndpoint::bind(addr, &self.socket_options).map_err(ServeError::Bind)?;
        self.metrics = Some(endpoint);
        Ok(self)
    }

    /// The Prometheus page of the counters ([`Server::with_metrics`] serves it).
    pub fn metrics_page(&self) -> String {
        crate::metrics::render(&self.pool.stats(), &self.conns, self.peers.refused())
    }

    /// The same server with other bounds on its clients.
    pub fn with_limits(mut self, limits: Limits) -> Server {
        self.limits = limits;
        self
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
        std::thread::scope(|s| {
            if let Some(endpoint) = &self.metrics {
                let spawned = std::thread::Builder::new()
                    .name("zeronce-pool-metrics".into())
                    .spawn_scoped(s, || {
                        endpoint.serve(|| self.stop.load(Ordering::Acquire), || self.metrics_page())
                    });
                if let Err(e) = spawned {
                    self.stop();
                    return Err(ServeError::Socket {
                        path: self.path.clone(),
                        source: e,
                    });
                }
            }
            let result = self.serve();
            // The metrics thread ends with the stop flag, whatever ended the loop.
            self.stop();
            result
        })
    }

    fn serve(&self) -> Result<(), ServeError> {
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
                    if let Some(peer) = self.peers.admit(&stream) {
                        self.conns.serve(&self.pool, stream, peer, self.limits);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // Out of descriptors (EMFILE/ENFILE) or memory: sleep, doubling up to 1 s,
                // instead of a warning per poll.
                Err(e) => std::thread::sleep(backoff.failed(&e)),
            }
        };
        let _ = std::fs::remove_file(&self.path);
        // Stop the pool first (takes waiting or zeroing inline fail, workers stop after
        // their page), then close the clients and wait for their threads (their leases
        // end), then write the state file once more: nothing changes after it.
        self.pool.shutdown()?;
        self.conns.close_all(Duration::from_secs(10));
        self.pool.shutdown()?;
        tracing::info!("pool stopped; state file written");
        result
    }
}
