//! Shutdown signals as a pollable file descriptor (`signalfd`), for daemons that want a
//! clean shutdown on SIGINT / SIGTERM without a signal handler.
//!
//! [`ShutdownSignals::install`] blocks the signals in the calling thread; threads it
//! spawns afterwards inherit the mask, so install it on the main thread before spawning
//! any. The signals then stay pending until read from the fd.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use rustix::io::Errno;

/// A signal that asks for shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownSignal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (service manager, `kill`).
    Terminate,
}

/// SIGINT and SIGTERM, blocked and delivered through a `signalfd`.
#[derive(Debug)]
pub struct ShutdownSignals {
    fd: OwnedFd,
}

fn shutdown_set() -> libc::sigset_t {
    // SAFETY: `sigset_t` is plain data; sigemptyset initialises it before use, and
    // sigaddset with valid signal numbers cannot fail.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

impl ShutdownSignals {
    /// Blocks SIGINT and SIGTERM in the calling thread and opens a non-blocking,
    /// close-on-exec `signalfd` for them.
    pub fn install() -> Result<ShutdownSignals, Errno> {
        let set = shutdown_set();
        // SAFETY: `set` is an initialised signal set; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(Errno::from_raw_os_error(rc));
        }
        // SAFETY: -1 asks for a new fd; `set` is initialised; flags are valid.
        let raw = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if raw < 0 {
            return Err(
                Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::INVAL)
            );
        }
        // SAFETY: `raw` is a new fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(ShutdownSignals { fd })
    }

    /// The pending shutdown signal, if any (non-blocking; consumes it).
    pub fn take(&self) -> Option<ShutdownSignal> {
        let mut buf = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(n) if n == buf.len() => {
                let signo = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
                match signo as i32 {
                    libc::SIGINT => Some(ShutdownSignal::Interrupt),
                    libc::SIGTERM => Some(ShutdownSignal::Terminate),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

impl AsFd for ShutdownSignals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
