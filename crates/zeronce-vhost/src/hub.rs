//! The daemon's shared state: its configuration, the target that outlives a connection,
//! its counters and the connection being served. The accept loop ([`crate::server`]), the
//! control socket and the signal thread all hold it.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use zeronce_balloon::BalloonOptions;
use zeronce_daemon::endpoint::MetricsAddr;
use zeronce_daemon::{Access, ConnLimit, PeerGate};
use zeronce_types::sync::lock;

use crate::backend::BalloonBackend;
use crate::totals::DeviceTotals;

/// What `zeronce serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The vhost-user socket the front-end connects to.
    pub socket: PathBuf,
    /// The control socket.
    pub control: PathBuf,
    /// Device options (features offered, discard policy).
    pub balloon: BalloonOptions,
    /// The initial target (`num_pages`, 4 KiB pages).
    pub num_pages: u32,
    /// Who may reach both sockets (mode 0600 and the daemon's user by default).
    pub access: Access,
    /// How long and how many clients may hold the daemon.
    pub limits: Limits,
    /// Where to serve the Prometheus page (`None`: nowhere).
    pub metrics: Option<MetricsAddr>,
}

/// The daemon's bounds on its clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long a new vhost-user connection may take to send its first message header
    /// (and any message its payload once its header began); one that does not is
    /// closed, so it cannot keep the next front-end waiting.
    pub handshake: Duration,
    /// Control connections served at once; one more gets a refusal line.
    pub control_connections: usize,
    /// How long a control connection may stay silent before it is closed.
    pub control_idle: Duration,
    /// The most memory regions a front-end may map into the daemon (each one a mapping
    /// and an open file descriptor): the answer to `GET_MAX_MEM_SLOTS`, and an
    /// `ADD_MEM_REG` past it is refused. The default, 509, is rust-vmm
    /// `vhost-user-backend`'s own figure, below QEMU's 512 (`VHOST_USER_MAX_RAM_SLOTS`,
    /// `hw/virtio/vhost-user.c`), so QEMU takes it as it is. QEMU refuses a back-end
    /// whose bound went down across a reconnection: keep it fixed for a daemon's life.
    pub mem_slots: u64,
    /// How long a free page hint run may go on before the device ends it (sets
    /// `CMD_ID_STOP`, the run's status becomes `timed_out`).
    pub hint_run: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(5),
            control_connections: 16,
            control_idle: Duration::from_secs(60),
            mem_slots: 509,
            hint_run: Duration::from_secs(30),
        }
    }
}

/// The connection being served.
pub(crate) struct Session {
    /// Its device.
    pub(crate) backend: BalloonBackend,
    /// The front-end's socket (shut down to stop the connection).
    pub(crate) frontend: UnixStream,
}

/// State shared by the accept loop, the control socket and the signal thread.
pub struct Hub {
    config: ServeConfig,
    target: AtomicU32,
    connections: AtomicU64,
    rejected: AtomicU64,
    stopping: AtomicBool,
    current: Mutex<Option<Session>>,
    listeners: Mutex<Vec<UnixListener>>,
    /// Peers of the vhost-user socket.
    pub(crate) vhost_peers: PeerGate,
    /// Peers of the control socket.
    pub(crate) control_peers: PeerGate,
    /// Control connections being served.
    pub(crate) control_slots: ConnLimit,
    /// The device counters of the sessions that ended.
    ended: Mutex<DeviceTotals>,
}

impl Hub {
    pub(crate) fn new(config: ServeConfig) -> Hub {
        Hub {
            vhost_peers: PeerGate::new(config.access.peers.clone(), "vhost-user"),
            control_peers: PeerGate::new(config.access.peers.clone(), "control"),
            control_slots: ConnLimit::new(config.limits.control_connections),
            ended: Mutex::default(),
            target: AtomicU32::new(config.num_pages),
            config,
            connections: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            current: Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// Stops the daemon: no new connections, the current one is closed.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for l in lock(&self.listeners).iter() {
            // Wakes a blocked accept() (Linux returns EINVAL to it).
            let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
        }
        if let Some(s) = lock(&self.current).as_ref() {
            let _ = s.frontend.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Whether [`Hub::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Front-end connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    /// Connections to the vhost-user socket refused because they were not a front-end
    /// (a control request sent to the wrong socket, or no message header within the
    /// handshake timeout).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::SeqCst)
    }

    /// Connections refused because their peer is not allowed (both sockets).
    pub fn refused_peers(&self) -> u64 {
        self.vhost_peers.refused() + self.control_peers.refused()
    }

    /// The target in 4 KiB pages.
    pub fn target(&self) -> u32 {
        self.target.load(Ordering::SeqCst)
    }

    /// Sets the target; a connected guest is told at once.
    pub fn set_target(&self, pages: u32) {
        self.target.store(pages, Ordering::SeqCst);
        if let Some(backend) = self.backend() {
            backend.lock().device().set_num_pages(pages);
        }
    }

    /// The back-end of the connected front-end, if any.
    pub fn backend(&self) -> Option<BalloonBackend> {
        lock(&self.current).as_ref().map(|s| s.backend.clone())
    }

    /// The configuration it serves.
    pub(crate) fn config(&self) -> &ServeConfig {
        &self.config
    }

    /// Counts a front-end connection; the count so far.
    pub(crate) fn count_connection(&self) -> u64 {
        self.connections.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Counts a connection refused as not a front-end; the count so far.
    pub(crate) fn count_rejected(&self) -> u64 {
        self.rejected.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The connection now served (`None`: it ended, and its device's counters join the
    /// totals of ended sessions).
    pub(crate) fn set_session(&self, session: Option<Session>) {
        // The totals stay locked while the session is replaced, so a reader of
        // [`Hub::device_totals`] sees the ended session's counts exactly once.
        let mut totals = lock(&self.ended);
        let ended = std::mem::replace(&mut *lock(&self.current), session);
        if let Some(s) = ended {
            totals.add(&s.backend.lock().device().metrics());
        }
    }

    /// The device counters of every session (the ended ones and the current one), and
    /// whether a front-end is connected.
    pub(crate) fn device_totals(&self) -> (DeviceTotals, bool) {
        let ended = lock(&self.ended);
        let mut totals = ended.clone();
        let current = self.backend();
        if let Some(b) = &current {
            totals.add(&b.lock().device().metrics());
        }
        drop(ended);
        (totals, current.is_some())
    }

    /// Keeps a duplicate of `l`, to wake its `accept` at [`Hub::stop`].
    pub(crate) fn listen(&self, l: &UnixListener) -> io::Result<()> {
        lock(&self.listeners).push(l.try_clone()?);
        Ok(())
    }
}
