//! `sd_notify`: tells systemd (a `Type=notify` unit) that the daemon is ready or
//! stopping, by one datagram to the unix socket named in `NOTIFY_SOCKET` (a path, or an
//! abstract name when it starts with `@`). Without `NOTIFY_SOCKET` nothing is sent.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;

use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

/// `READY=1`: the daemon serves.
pub const READY: &str = "READY=1";
/// `STOPPING=1`: the daemon is shutting down.
pub const STOPPING: &str = "STOPPING=1";

/// Sends `state` to the socket in `NOTIFY_SOCKET`; `Ok(false)` when it is not set.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(to) if !to.is_empty() => notify_to(&to, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends `state` to the notify socket `to` (a path, or `@name` for an abstract name).
pub fn notify_to(to: &OsStr, state: &str) -> io::Result<()> {
    let bytes = to.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddrUnix::new_abstract_name(name)?,
        None => SocketAddrUnix::new(to)?,
    };
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::sendto(&fd, state.as_bytes(), SendFlags::NOSIGNAL, &addr)?;
    Ok(())
}

/// Sends `state` if `NOTIFY_SOCKET` is set; a failure is logged, never fatal.
pub fn notify_or_log(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!(state, error = %e, "sd_notify failed");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    #[test]
    fn a_path_and_an_abstract_name_each_get_the_datagram() {
        let dir = std::env::temp_dir().join(format!("zeronce-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), READY).unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("zeronce-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), STOPPING).unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
