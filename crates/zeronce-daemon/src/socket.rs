//! Binding a unix listening socket the way an operator expects of a long-lived daemon.
//!
//! - Nothing at the path: the socket is created.
//! - A socket nobody listens on (connecting is refused, `ECONNREFUSED`): the socket of a
//!   daemon that was killed (SIGKILL, the OOM killer, power loss). It is *stale* and is
//!   replaced, with one log line, so a supervisor's restart loop recovers.
//! - A socket that accepts a connection: a daemon is running there; refused
//!   ([`BindError::Live`]).
//! - Anything else (a file, a directory, a symbolic link): refused
//!   ([`BindError::NotASocket`]); nothing is removed.
//!
//! The mode: `bind` creates the socket file with the process umask applied, so the file
//! is given its mode ([`SocketOptions::mode`], 0600 by default) and group *before*
//! `listen`. Until `listen`, connecting to it is refused whatever its mode, so there is
//! no moment at which anyone outside the mode can connect.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use rustix::fs::{Gid, Mode};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use thiserror::Error;

/// Connections the kernel queues before `accept` (`listen` backlog).
pub const BACKLOG: i32 = 128;

/// Who may reach a socket through the file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// The socket file's permission bits (default 0600: the daemon's user only; 0660
    /// with [`SocketOptions::group`] lets that group connect too).
    pub mode: u32,
    /// The socket file's group (numeric gid); `None`: the daemon's.
    pub group: Option<u32>,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            mode: 0o600,
            group: None,
        }
    }
}

/// Why a socket could not be bound.
#[derive(Debug, Error)]
pub enum BindError {
    /// A daemon answers on the socket.
    #[error("{}: a running daemon listens on this socket (stop it first)", .0.display())]
    Live(PathBuf),
    /// Something other than a socket is at the path.
    #[error("{}: exists and is not a socket (refusing to replace it)", .0.display())]
    NotASocket(PathBuf),
    /// A mode with bits outside 0777.
    #[error("socket mode {0:#o} is not a permission mode (0 to 0777)")]
    Mode(u32),
    /// A system call failed.
    #[error("{}: {what}: {source}", .path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// What is at a socket path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathState {
    /// Nothing.
    Free,
    /// A socket nobody listens on.
    Stale,
    /// A socket a daemon listens on.
    Live,
    /// Not a socket.
    NotASocket,
}

/// Looks at `path`: free, a stale socket, a live socket, or not a socket.
pub fn probe(path: &Path) -> io::Result<PathState> {
    let meta = match path.symlink_metadata() {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(PathState::Free),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Ok(PathState::NotASocket);
    }
    match UnixStream::connect(path) {
        Ok(_) => Ok(PathState::Live),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::CONNREFUSED.raw_os_error()) => {
            Ok(PathState::Stale)
        }
        // A full backlog (EAGAIN) is a live daemon too.
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(PathState::Live),
        Err(e) => Err(e),
    }
}

/// Binds a listening unix socket at `path` (see the module docs for what is replaced and
/// what is refused), with the mode and group of `options`, close-on-exec.
pub fn bind(path: &Path, options: &SocketOptions) -> Result<UnixListener, BindError> {
    let err = |what: &'static str| {
        move |source: io::Error| BindError::Io {
            path: path.to_owned(),
            what,
            source,
        }
    };
    if options.mode & !0o777 != 0 {
        return Err(BindError::Mode(options.mode));
    }
    match probe(path).map_err(err("cannot tell whether a daemon listens there"))? {
        PathState::Free => {}
        PathState::Live => return Err(BindError::Live(path.to_owned())),
        PathState::NotASocket => return Err(BindError::NotASocket(path.to_owned())),
        PathState::Stale => {
            tracing::warn!(
                socket = %path.display(),
                "replacing a stale socket (nobody listens on it: a daemon that was killed)"
            );
            std::fs::remove_file(path).map_err(err("removing the stale socket"))?;
        }
    }
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| err("socket")(e.into()))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| err("socket address")(e.into()))?;
    rustix::net::bind(&fd, &addr).map_err(|e| err("bind")(e.into()))?;
    let finish = || -> io::Result<()> {
        rustix::fs::chmod(path, Mode::from_raw_mode(options.mode))?;
        if let Some(gid) = options.group {
            rustix::fs::chown(path, None, Some(Gid::from_raw(gid)))?;
        }
        rustix::net::listen(&fd, BACKLOG)?;
        Ok(())
    };
    if let Err(e) = finish() {
        let _ = std::fs::remove_file(path);
        return Err(err("setting the mode and listening")(e));
    }
    Ok(UnixListener::from(fd))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("zeronce-daemon-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        p.metadata().unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn stale_sockets_are_replaced_live_ones_and_files_refused() {
        let d = dir("bind");
        let s = d.join("s.sock");
        let live = bind(&s, &SocketOptions::default()).unwrap();
        assert_eq!(probe(&s).unwrap(), PathState::Live);
        let e = bind(&s, &SocketOptions::default()).unwrap_err();
        assert!(matches!(e, BindError::Live(_)), "{e}");
        // A killed daemon: the listener is gone, the file stays.
        drop(live);
        assert!(s.exists());
        assert_eq!(probe(&s).unwrap(), PathState::Stale);
        let again = bind(&s, &SocketOptions::default()).unwrap();
        UnixStream::connect(&s).expect("the new socket listens");
        drop(again);
        let file = d.join("file");
        std::fs::write(&file, b"keep me").unwrap();
        let e = bind(&file, &SocketOptions::default()).unwrap_err();
        assert!(matches!(e, BindError::NotASocket(_)), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me", "not removed");
        let e = bind(&d, &SocketOptions::default()).unwrap_err();
        assert!(matches!(e, BindError::NotASocket(_)), "a directory: {e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_mode_is_0600_under_any_umask_or_the_one_asked_for() {
        let d = dir("mode");
        // Tests run one per process under nextest; the umask is put back either way.
        let old = rustix::process::umask(Mode::empty());
        let s = d.join("a.sock");
        let a = bind(&s, &SocketOptions::default());
        let b = bind(
            &d.join("b.sock"),
            &SocketOptions {
                mode: 0o660,
                group: Some(rustix::process::getgid().as_raw()),
            },
        );
        rustix::process::umask(old);
        let (_a, _b) = (a.unwrap(), b.unwrap());
        assert_eq!(mode(&s), 0o600, "umask 000 does not widen it");
        assert_eq!(mode(&d.join("b.sock")), 0o660);
        assert!(matches!(
            bind(
                &d.join("c"),
                &SocketOptions {
                    mode: 0o4777,
                    group: None
                }
            ),
            Err(BindError::Mode(_))
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
