//! Socket paths the daemon listens on: checked before anything is created, so a mistake
//! is a clear error and never a half-started daemon.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// `sizeof(sockaddr_un.sun_path)` minus the terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// Why a socket path cannot be used.
#[derive(Debug, Error)]
pub enum SocketPathError {
    /// Something already exists there (a stale socket of a killed daemon, or a file).
    #[error("{}: already exists (remove it if it is a stale socket of a stopped daemon)", .0.display())]
    Exists(PathBuf),
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
    /// Binding failed.
    #[error("{}: cannot listen: {source}", .path.display())]
    Bind {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Checks `path` can become a listening socket: non-empty, short enough, no ':', and
/// nothing there yet.
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
    if path.symlink_metadata().is_ok() {
        return Err(SocketPathError::Exists(path.to_owned()));
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
    /// Checks `path` ([`check`]) and listens on it.
    pub fn bind(path: &Path) -> Result<BoundSocket, SocketPathError> {
        check(path)?;
        let listener = UnixListener::bind(path).map_err(|source| SocketPathError::Bind {
            path: path.to_owned(),
            source,
        })?;
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
        let bound = BoundSocket::bind(&sock).unwrap();
        let e = BoundSocket::bind(&sock).unwrap_err();
        assert!(matches!(e, SocketPathError::Exists(_)), "{e}");
        assert!(e.to_string().contains("already exists"));
        drop(bound);
        assert!(!sock.exists(), "removed on drop");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
