//! The daemon: listens on the vhost-user socket, serves one front-end connection at a
//! time with a fresh [`BalloonBackend`], waits for the next one after a disconnect, and
//! stops cleanly on SIGINT / SIGTERM (or [`Hub::stop`]). What its threads share is the
//! [`Hub`] ([`crate::hub`]).

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use zeronce_daemon::endpoint::MetricsEndpoint;
use zeronce_daemon::{notify, AcceptBackoff};
use zeronce_types::clock::deadline_after;
use zeronce_types::rate::log_this;

use crate::backend::{BalloonBackend, ExitEvent};
use crate::control;
use crate::hub::{Hub, ServeConfig, Session};
use crate::path::{BoundSocket, SocketPathError};
use crate::relay::Relay;
use crate::wire;

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// A socket path cannot be used.
    #[error(transparent)]
    Path(#[from] SocketPathError),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> ServeError {
    move |source| ServeError::Io { what, source }
}

/// Runs the daemon until it is stopped; `ready` is called once both sockets listen.
pub fn serve(config: ServeConfig, ready: impl FnOnce(&Arc<Hub>)) -> Result<(), ServeError> {
    let vhost = BoundSocket::bind(&config.socket, &config.access.socket)?;
    let ctl = BoundSocket::bind(&config.control, &config.access.socket)?;
    let endpoint = config
        .metrics
        .as_ref()
        .map(|addr| MetricsEndpoint::bind(addr, &config.access.socket))
        .transpose()
        .map_err(|e| ServeError::Io {
            what: "metrics endpoint",
            source: io::Error::other(e.to_string()),
        })?;
    let hub = Arc::new(Hub::new(config));
    hub.listen(vhost.listener()).map_err(io_err("socket"))?;
    hub.listen(ctl.listener())
        .map_err(io_err("control socket"))?;
    let signals = watch_signals(&hub)?;
    let control_thread = {
        let hub = Arc::clone(&hub);
        let listener = ctl
            .listener()
            .try_clone()
            .map_err(io_err("control socket"))?;
        std::thread::Builder::new()
            .name("zeronce-control".into())
            .spawn(move || control::serve(&hub, &listener))
            .map_err(io_err("control thread"))?
    };
    let metrics_thread = match endpoint {
        Some(endpoint) => {
            let hub = Arc::clone(&hub);
            Some(
                std::thread::Builder::new()
                    .name("zeronce-metrics".into())
                    .spawn(move || {
                        endpoint.serve(|| hub.stopping(), || crate::metrics::render(&hub))
                    })
                    .map_err(io_err("metrics thread"))?,
            )
        }
        None => None,
    };
    ready(&hub);
    notify::notify_or_log(notify::READY);
    let result = accept_loop(&hub, vhost.listener());
    notify::notify_or_log(notify::STOPPING);
    hub.stop();
    signals.close();
    if control_thread.join().is_err() {
        tracing::error!("the control thread panicked");
    }
    if metrics_thread.is_some_and(|t| t.join().is_err()) {
        tracing::error!("the metrics thread panicked");
    }
    result
}

fn watch_signals(hub: &Arc<Hub>) -> Result<signal_hook::iterator::Handle, ServeError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(io_err("signals"))?;
    let handle = signals.handle();
    let hub = Arc::clone(hub);
    std::thread::Builder::new()
        .name("zeronce-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "stopping");
                hub.stop();
            }
        })
        .map_err(io_err("signal thread"))?;
    Ok(handle)
}

fn accept_loop(hub: &Arc<Hub>, listener: &UnixListener) -> Result<(), ServeError> {
    let mut backoff = AcceptBackoff::new("vhost-user");
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) if hub.stopping() => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors or memory (or a connection reset before it was
                // accepted): the daemon stays up and tries again, slower each time.
                std::thread::sleep(backoff.failed(&e));
                continue;
            }
        };
        backoff.succeeded();
        if hub.stopping() {
            return Ok(());
        }
        if hub.vhost_peers.admit(&stream).is_none() {
            continue;
        }
        // A vhost-user front-end speaks first, and its first byte is a small request
        // code; a control request (JSON) starts with '{'.
        match first_header(hub, &stream) {
            Ok(Some(b'{')) => {
                let n = hub.count_rejected();
                tracing::warn!(
                    rejected = n,
                    control = %hub.config().control.display(),
                    "a control request came to the vhost-user socket: refused, not a front-end"
                );
                if let Err(e) = control::refuse_misdirected(&stream, &hub.config().control) {
                    tracing::debug!(error = %e, "refusing a control request");
                }
                continue;
            }
            Ok(Some(_)) => {}
            Ok(None) if hub.stopping() => return Ok(()),
            Ok(None) => {
                tracing::debug!("a connection closed before it sent anything");
                continue;
            }
            Err(e) => {
                let n = hub.count_rejected();
                if log_this(n) {
                    tracing::warn!(error = %e, rejected = n, "a new connection was closed");
                }
                continue;
            }
        }
        let n = hub.count_connection();
        tracing::info!(connection = n, "front-end connected");
        match session(hub, stream) {
            Ok(()) => tracing::info!(connection = n, "front-end disconnected"),
            Err(e) => tracing::warn!(connection = n, error = %e, "front-end connection failed"),
        }
    }
}

/// Waits, at most the handshake timeout, until the peer has sent a whole message header
/// (a control request: its first byte), and returns its first byte, left unread; `None`
/// if it closed first or the daemon is stopping. A peer that sends nothing, or part of a
/// header, is an error once the timeout is over: it must not keep the next front-end
/// waiting.
fn first_header(hub: &Hub, stream: &UnixStream) -> io::Result<Option<u8>> {
    use rustix::io::Errno;
    let deadline = deadline_after(Instant::now(), hub.config().limits.handshake);
    // Woken now and then to see whether the daemon is stopping.
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut head = [0u8; wire::HEADER_SIZE];
    loop {
        let got = match rustix::net::recv(stream, &mut head, rustix::net::RecvFlags::PEEK) {
            // End of stream: it closed before sending a header.
            Ok((0, _)) => return Ok(None),
            Ok((n, _)) => n,
            Err(Errno::AGAIN | Errno::INTR) => 0,
            Err(e) => return Err(e.into()),
        };
        if hub.stopping() {
            return Ok(None);
        }
        match got {
            _ if head[0] == b'{' && got > 0 => break,
            wire::HEADER_SIZE => break,
            // Part of a header is there: peeking again at once would spin.
            n if n > 0 => std::thread::sleep(Duration::from_millis(10)),
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no vhost-user message header within {:?} ({got} bytes)",
                    hub.config().limits.handshake
                ),
            ));
        }
    }
    stream.set_read_timeout(None)?;
    Ok(Some(head[0]))
}

/// Serves one front-end connection to its end.
fn session(hub: &Arc<Hub>, frontend: UnixStream) -> io::Result<()> {
    let slot = Arc::new(Mutex::new(None));
    let backend = BalloonBackend::new(hub.config().balloon, hub.target(), Arc::clone(&slot))?;
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::default());
    let mut daemon = VhostUserDaemon::new("zeronce-balloon".into(), backend.clone(), mem)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let exit = ExitEvent::register(&daemon, &backend)?;
    let (mut inner_listener, inner) = private_connection()?;
    let relay = Relay::start(frontend.try_clone()?, inner, slot, hub.config().limits)?;
    hub.set_session(Some(Session { backend, frontend }));
    if hub.stopping() {
        relay.shutdown();
    }
    let result = match daemon
        .start(&mut inner_listener)
        .and_then(|()| daemon.wait())
    {
        Ok(()) => Ok(()),
        Err(e) if is_disconnect(&e) || hub.stopping() => Ok(()),
        Err(e) => Err(io::Error::other(e.to_string())),
    };
    // Ends the vring thread; dropping the daemon joins it, and only then is the exit
    // event closed (closing it first would take it out of the thread's epoll unread).
    exit.fire();
    drop(daemon);
    drop(exit);
    relay.shutdown();
    relay.join();
    hub.set_session(None);
    result
}

/// Whether `e` is the front-end going away (the normal end of a connection).
fn is_disconnect(e: &vhost_user_backend::Error) -> bool {
    use vhost::vhost_user::Error as E;
    matches!(
        e,
        vhost_user_backend::Error::HandleRequest(E::Disconnected | E::PartialMessage)
    )
}

/// A listener with one connection already waiting, for `VhostUserDaemon::start` (which
/// serves only connections it accepts itself). The address is in the abstract namespace
/// (no file), unique to this process, and the listener is dropped right after the one
/// accept.
fn private_connection() -> io::Result<(Listener, UnixStream)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "zeronce-vhost/{}/{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = UnixListener::bind_addr(&addr)?;
    let client = UnixStream::connect_addr(&addr)?;
    Ok((Listener::from(listener), client))
}
