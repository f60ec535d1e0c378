//! Socket paths the daemon listens on: checked before anything is created, so a mistake
//! is a clear error and never a half-started daemon. What is at the path already (a
//! stale socket is replaced; a live one or a file refused) and the mode the socket gets
//! are [`zeronce_daemon::socket`]'s rules, shared with the pool daemon.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use thiserror::Error;
use zeronce_daemon::{BindError, SocketOptions};

/// `sizeof(sockaddr_un.sun_path)` minus the terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// Why a socket path cannot be used.
#[derive(Debug, Error)]
pub enum SocketPathError {
    /// A live socket or something other than a socket is there, or binding failed.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// Longer than a unix socket address holds.
    #[error("{}: {len} bytes, a unix socket path holds at most {MAX_SOCKET_PATH}", .path.display())]
    TooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// Contains ':', which front-ends use as a separator (`virtio_uml.device=PATH:ID`).
    #[error("{}: contains ':', which virtio_uml.device=PATH:ID and QEMU's chardev syntax cannot carry", .0.display())]
    Colon(PathBuf),
    /// Empty.
    #[error("the socket path is empty")]
    Empty,
}

/// Checks `path` can name a listening socket: non-empty, short enough, no ':'.
pub fn check(path: &Path) -> Result<(), SocketPathError> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() {
        return Err(SocketPathError::Empty);
    }
    if bytes.len() > MAX_SOCKET_PATH {
        return Err(SocketPathError::TooLong {
            path: path.to_owned(),
            len: bytes.len(),
        });
    }
    if bytes.contains(&b':') {
        return Err(SocketPathError::Colon(path.to_owned()));
    }
    Ok(())
}

/// A listening socket that removes its path when dropped.
#[derive(Debug)]
pub struct BoundSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl BoundSocket {
    /// Checks `path` ([`check`]) and listens on it ([`zeronce_daemon::bind`]: a stale
    /// socket replaced, the file given `options`' mode and group).
    pub fn bind(path: &Path, options: &SocketOptions) -> Result<BoundSocket, SocketPathError> {
        check(path)?;
        let listener = zeronce_daemon::bind(path, options)?;
        Ok(BoundSocket {
            listener,
            path: path.to_owned(),
        })
    }

    /// The listener.
    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the socket");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_paths_are_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("zeronce-vhost-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let long = dir.join("x".repeat(120));
        assert!(matches!(check(&long), Err(SocketPathError::TooLong { .. })));
        assert!(matches!(
            check(&dir.join("a:b")),
            Err(SocketPathError::Colon(_))
        ));
        assert!(matches!(check(Path::new("")), Err(SocketPathError::Empty)));
        let sock = dir.join("s");
        let opts = SocketOptions::default();
        let bound = BoundSocket::bind(&sock, &opts).unwrap();
        let e = BoundSocket::bind(&sock, &opts).unwrap_err();
        assert!(
            matches!(e, SocketPathError::Bind(BindError::Live(_))),
            "{e}"
        );
        assert!(e.to_string().contains("a running daemon listens"));
        drop(bound);
        assert!(!sock.exists(), "removed on drop");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
