//! Write leases (`fcntl(F_SETLEASE, F_WRLCK)`, fcntl(2), "Leases"): a cheap, exact
//! answer to "does any open file description of this file exist but mine?", and a notice
//! when one is made afterwards.
//!
//! The kernel grants a write lease on a descriptor only when the inode's count of open
//! file descriptions for writing (`i_writecount`) and for reading only (`i_readcount`)
//! are exactly the caller's own (fs/locks.c, `check_conflicting_open`). Everything that
//! keeps a `struct file` alive counts: a descriptor in any process, a descriptor in
//! flight in a socket's queue (`SCM_RIGHTS`, sent and not yet received), a mapping of any
//! kind (it holds its file after the descriptor is closed), an io_uring registered file.
//! `dup`s of the caller's own descriptor share its description and do not count; `O_PATH`
//! descriptors (which can neither read, write nor map) do not count.
//!
//! While the lease is held, any `open` of the file by anyone breaks it: the opener waits
//! (up to `/proc/sys/fs/lease-break-time`, or fails with `EWOULDBLOCK` if it opened
//! `O_NONBLOCK`) and [`lease_state`] stops answering [`LeaseState::Write`]. The kernel
//! also sends the holder `SIGIO`, whose default action ends the process:
//! [`take_write_lease`] makes the process ignore `SIGIO` first unless it handles it.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Once;

/// What [`take_write_lease`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseProbe {
    /// The lease is held: no other open file description of the file exists.
    Held,
    /// Another open file description exists (or another lease): not granted.
    Busy,
}

/// The lease on a descriptor, as `F_GETLEASE` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// A write lease, unbroken.
    Write,
    /// Being broken (someone opened the file), or a read lease.
    Broken,
    /// No lease.
    None,
}

/// Why a lease could not be asked for at all (as opposed to [`LeaseProbe::Busy`]).
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Leases do not apply here: `EINVAL` (leases disabled by `/proc/sys/fs/leases-enable`,
    /// not a regular file, a file system without lease support) or `EACCES` (the caller
    /// neither owns the file nor has `CAP_LEASE`).
    #[error("write leases are not available on this file: {0}")]
    Unsupported(std::io::Error),
    /// Any other failure.
    #[error("fcntl(F_SETLEASE): {0}")]
    Os(std::io::Error),
}

/// Asks for a write lease on `fd` (a descriptor opened for writing, or reading). Taking
/// it again on the same description while held is allowed and keeps it.
pub fn take_write_lease(fd: BorrowedFd<'_>) -> Result<LeaseProbe, LeaseError> {
    ignore_sigio_unless_handled();
    match setlease(fd, libc::F_WRLCK) {
        Ok(()) => Ok(LeaseProbe::Held),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(LeaseProbe::Busy),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EACCES)) => {
            Err(LeaseError::Unsupported(e))
        }
        Err(e) => Err(LeaseError::Os(e)),
    }
}

/// Gives up the lease on `fd`, if any (an opener waiting on it proceeds); none held
/// (never taken, or removed by the kernel when its break timed out) is not an error.
pub fn release_lease(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    match setlease(fd, libc::F_UNLCK) {
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(()),
        r => r,
    }
}

/// The lease on `fd` now.
pub fn lease_state(fd: BorrowedFd<'_>) -> std::io::Result<LeaseState> {
    // SAFETY: F_GETLEASE takes no argument and only reads the lease of the descriptor,
    // which the borrow keeps open for the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETLEASE) };
    match r {
        -1 => Err(std::io::Error::last_os_error()),
        r if r == libc::F_WRLCK => Ok(LeaseState::Write),
        r if r == libc::F_UNLCK => Ok(LeaseState::None),
        _ => Ok(LeaseState::Broken),
    }
}

fn setlease(fd: BorrowedFd<'_>, kind: libc::c_int) -> std::io::Result<()> {
    // SAFETY: F_SETLEASE takes an int and changes only the lease of the descriptor, which
    // the borrow keeps open for the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, kind) };
    if r == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sets `SIGIO` to be ignored if it has its default action (which ends the process);
/// a handler the program installed is left alone. Once per process.
fn ignore_sigio_unless_handled() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: an all-zero sigaction is a valid value to be overwritten; sigaction
        // with a null new action only reads the current one into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: see above; `old` is a valid, writable sigaction.
        let read = unsafe { libc::sigaction(libc::SIGIO, std::ptr::null(), &mut old) };
        if read == 0 && old.sa_sigaction == libc::SIG_DFL {
            // SAFETY: `new` is a fully initialised sigaction (zeroed mask and flags,
            // SIG_IGN), which installs no code to run in signal context.
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            new.sa_sigaction = libc::SIG_IGN;
            // SAFETY: `new` is valid for reading; a null old action is allowed.
            unsafe { libc::sigaction(libc::SIGIO, &new, std::ptr::null_mut()) };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;

    /// A file of this test in a tmpfs (leases need a local file system; /dev/shm is one).
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::path::Path::new("/dev/shm");
        assert!(dir.is_dir(), "this test needs /dev/shm (a tmpfs)");
        dir.join(format!("zeronce-lease-{name}-{}", std::process::id()))
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: open, fcntl(F_SETLEASE), mmap")]
    fn a_lease_sees_other_opens_and_mappings_but_not_dups_and_notices_a_later_open() {
        let path = scratch("probe");
        let mine = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        mine.set_len(4096).unwrap();
        let probe = || {
            let p = take_write_lease(mine.as_fd()).unwrap();
            if p == LeaseProbe::Held {
                release_lease(mine.as_fd()).unwrap();
            }
            p
        };
        assert_eq!(probe(), LeaseProbe::Held);
        let dup = mine.try_clone().unwrap();
        assert_eq!(probe(), LeaseProbe::Held, "a dup shares my description");
        drop(dup);
        let reader = std::fs::File::open(&path).unwrap();
        assert_eq!(probe(), LeaseProbe::Busy, "a read-only open");
        drop(reader);
        assert_eq!(probe(), LeaseProbe::Held);

        // Held, then someone opens the file (here without blocking: a blocking open
        // would wait for the release): the lease is broken.
        assert_eq!(take_write_lease(mine.as_fd()).unwrap(), LeaseProbe::Held);
        assert_eq!(lease_state(mine.as_fd()).unwrap(), LeaseState::Write);
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        assert_eq!(
            opened.map(drop).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "an open while the lease is held waits for its break"
        );
        assert_eq!(lease_state(mine.as_fd()).unwrap(), LeaseState::Broken);
        release_lease(mine.as_fd()).unwrap();
        assert_eq!(lease_state(mine.as_fd()).unwrap(), LeaseState::None);
        release_lease(mine.as_fd()).expect("releasing no lease is no error");
        let later = std::fs::File::open(&path);
        assert!(later.is_ok(), "released: opens proceed");
        std::fs::remove_file(&path).unwrap();
    }
}
