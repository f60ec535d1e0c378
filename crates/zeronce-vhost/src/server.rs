//! The daemon: listens on the vhost-user socket, serves one front-end connection at a
//! time with a fresh [`BalloonBackend`], waits for the next one after a disconnect, and
//! stops cleanly on SIGINT / SIGTERM (or [`Hub::stop`]). What its threads share is the
//! [`Hub`] ([`crate::hub`]).

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::backend::{BalloonBackend, ExitEvent};
use crate::control;
use crate::hub::{Hub, ServeConfig, Session};
use crate::path::{BoundSocket, SocketPathError};
use crate::relay::Relay;

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
    let vhost = BoundSocket::bind(&config.socket)?;
    let ctl = BoundSocket::bind(&config.control)?;
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
    ready(&hub);
    let result = accept_loop(&hub, vhost.listener());
    hub.stop();
    signals.close();
    if control_thread.join().is_err() {
        tracing::error!("the control thread panicked");
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
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) if hub.stopping() => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(ServeError::Io {
                    what: "accept",
                    source: e,
                })
            }
        };
        if hub.stopping() {
            return Ok(());
        }
        // A vhost-user front-end speaks first, and its first byte is a small request
        // code; a control request (JSON) starts with '{'.
        match first_byte(hub, &stream) {
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
                tracing::warn!(error = %e, "reading a new connection failed");
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

/// The first byte the peer sent, left unread; `None` if it closed first or the daemon
/// is stopping.
fn first_byte(hub: &Hub, stream: &UnixStream) -> io::Result<Option<u8>> {
    use rustix::io::Errno;
    // Woken now and then to see whether the daemon is stopping.
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut byte = [0u8; 1];
    let got = loop {
        match rustix::net::recv(stream, &mut byte, rustix::net::RecvFlags::PEEK) {
            Ok((n, _)) => break n,
            Err(Errno::AGAIN | Errno::INTR) if !hub.stopping() => {}
            Err(Errno::AGAIN | Errno::INTR) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    };
    stream.set_read_timeout(None)?;
    Ok((got > 0).then_some(byte[0]))
}

/// Serves one front-end connection to its end.
fn session(hub: &Arc<Hub>, frontend: UnixStream) -> io::Result<()> {
    let slot = Arc::new(Mutex::new(None));
    let backend = BalloonBackend::new(hub.config().balloon, hub.target(), Arc::clone(&slot));
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::default());
    let mut daemon = VhostUserDaemon::new("zeronce-balloon".into(), backend.clone(), mem)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let exit = ExitEvent::register(&daemon, &backend)?;
    let (mut inner_listener, inner) = private_connection()?;
    let relay = Relay::start(frontend.try_clone()?, inner, slot)?;
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
