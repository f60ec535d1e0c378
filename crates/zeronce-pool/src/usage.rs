//! Whether a process other than the daemon still has a pool file open or mapped. The
//! daemon asks before it zeroes any returned file and before it reclaims an orphaned one:
//! zeroing pages a guest is still running on would corrupt it.
//!
//! The answer comes from the daemon's write lease on the file ([`other_user`],
//! `PoolFiles::lease`): one `fcntl`, granted only when no other open file description of
//! the file exists — which covers what `/proc` cannot see (a descriptor in flight in a
//! socket's queue, sent with `SCM_RIGHTS` and not yet received; a process the daemon may
//! not inspect; an io_uring registered file) and a mapping of any kind (it keeps its file
//! open after the descriptor is closed). The check gives the lease back at once (an
//! `open` while it is held would wait for it); the zeroing job takes it again before its
//! first page and holds it until the pool state records the job's end (`worker`), so an `open` of the file meanwhile
//! breaks it and the job stops: there is no window between the check and the zeroing.
//!
//! `/proc/PID/fd` (descriptors) and `/proc/PID/maps` (mappings) are still walked
//! ([`usage`]) to name the process of a busy file in the log, and in place of the lease
//! where leases are not available (`/proc/sys/fs/leases-enable` is 0, or the daemon
//! neither owns the files nor has `CAP_LEASE`). A process the walk may not inspect
//! (`EACCES`: more privileged than the daemon, in another user namespace, or not
//! dumpable) is not seen by it; the count of processes not inspected is logged.

use std::ffi::CStr;
use std::fs;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Condvar, Mutex};

use rustix::fs::{openat, statat, AtFlags, Dir, Mode, OFlags};
use zeronce_mem::{LeaseError, LeaseProbe};
use zeronce_types::sync;

use crate::files::PoolFiles;
use crate::state::FileId;

/// Who else uses a pool file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileUser {
    /// This process has it open or mapped (found in `/proc`).
    Process(u32),
    /// Some open file description of it exists that `/proc` names no process for: a
    /// descriptor in flight in a socket's queue, one of a process the daemon may not
    /// inspect, or one the kernel holds (io_uring); or the check itself failed.
    Unnamed,
}

/// Whether anyone but the daemon has pool file `file` open or mapped (see the module
/// docs). `None`: nobody (at the time of the call). With `name`, a busy file's user is looked for in
/// `/proc` (a walk of every process: for the log of a return, not for periodic checks).
pub(crate) fn other_user(files: &PoolFiles, file: FileId, name: bool) -> Option<FileUser> {
    let path = files.path(file);
    let named = || match usage(&path) {
        Ok(Usage::UsedBy(pid)) => FileUser::Process(pid),
        Ok(Usage::Unused { .. }) | Err(_) => FileUser::Unnamed,
    };
    match files.lease(file) {
        Ok(LeaseProbe::Held) => {
            files.release_lease(file);
            None
        }
        Ok(LeaseProbe::Busy) if name => Some(named()),
        Ok(LeaseProbe::Busy) => Some(FileUser::Unnamed),
        Err(LeaseError::Unsupported(e)) => {
            static LOGGED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(path = %path.display(), %e, "no write lease on pool files: checking their users in /proc (slower, blind to descriptors in flight in sockets)");
            }
            match usage(&path) {
                Ok(Usage::Unused { .. }) => None,
                Ok(Usage::UsedBy(pid)) => Some(FileUser::Process(pid)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), %e, "cannot check a file's users: held until checked");
                    Some(FileUser::Unnamed)
                }
            }
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), %e, "cannot check a file's users: held until checked");
            Some(FileUser::Unnamed)
        }
    }
}

/// Who uses a file, as far as `/proc` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// No other process it could inspect has it open or mapped; `not_inspected`
    /// processes could not be read.
    Unused {
        /// Processes whose `/proc` entries the caller may not read.
        not_inspected: usize,
    },
    /// This process has it open or mapped.
    UsedBy(u32),
}

/// A file, by device and inode.
type Key = (u64, u64);

/// A walk's answer for one file (an error kept as its kind and text, to be given to
/// every caller of the walk).
type Answer = Result<Usage, (ErrorKind, String)>;

/// Scans every process but this one for `path` (matched by device and inode).
///
/// Concurrent callers share walks ([`SCANS`]): a caller's file joins the next walk that
/// starts after its call, so the answer is as fresh as a walk of its own would be, and
/// four returns at once cost one or two walks instead of four.
pub fn usage(path: &Path) -> std::io::Result<Usage> {
    let meta = fs::metadata(path)?;
    SCANS.check((meta.dev(), meta.ino()))
}

/// The walks of `/proc` in progress and the files waiting for the next one.
struct Scans {
    state: Mutex<ScanState>,
    done: Condvar,
}

struct ScanState {
    /// Tickets and files waiting for a walk that has not started yet.
    pending: Vec<(u64, Key)>,
    /// Answers of finished walks not yet collected, by ticket.
    answers: Vec<(u64, Answer)>,
    /// Whether a thread is walking now.
    walking: bool,
    next_ticket: u64,
}

/// The process's walks (one per process is enough: every pool in it asks the same
/// `/proc`).
static SCANS: Scans = Scans {
    state: Mutex::new(ScanState {
        pending: Vec::new(),
        answers: Vec::new(),
        walking: false,
        next_ticket: 0,
    }),
    done: Condvar::new(),
};

impl Scans {
    /// The usage of `key`, from a walk that starts after this call: the caller walks
    /// itself (for every file waiting then) unless a walk is going on, in which case it
    /// waits for that one to end and for the next.
    fn check(&self, key: Key) -> std::io::Result<Usage> {
        let mut st = sync::lock(&self.state);
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.pending.push((ticket, key));
        loop {
            if let Some(i) = st.answers.iter().position(|(t, _)| *t == ticket) {
                let (_, answer) = st.answers.swap_remove(i);
                return answer.map_err(|(kind, msg)| std::io::Error::new(kind, msg));
            }
            if st.walking {
                st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let batch = std::mem::take(&mut st.pending);
            st.walking = true;
            drop(st);
            let keys: Vec<Key> = batch.iter().map(|(_, k)| *k).collect();
            let found = walk(&keys);
            st = sync::lock(&self.state);
            st.walking = false;
            for (i, (t, _)) in batch.into_iter().enumerate() {
                let answer = match &found {
                    Ok(users) => Ok(users[i]),
                    Err(e) => Err((e.kind(), e.to_string())),
                };
                st.answers.push((t, answer));
            }
            self.done.notify_all();
        }
    }
}

/// One walk of every process but this one, for all of `keys` at once.
///
/// Every lookup is relative to an open directory (`/proc`, then `/proc/PID`, then its
/// `fd`), not a full path: a return scans every descriptor of every process, and the
/// path walks were a third of its cost.
fn walk(keys: &[Key]) -> std::io::Result<Vec<Usage>> {
    let me = std::process::id();
    let mut not_inspected = 0;
    let mut users: Vec<Option<u32>> = vec![None; keys.len()];
    let mut maps = Vec::new();
    let proc_dir = open_dir(rustix::fs::CWD, "/proc")?;
    for entry in Dir::read_from(&proc_dir)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name.to_str().ok().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let open: Vec<Key> = keys
            .iter()
            .zip(&users)
            .filter(|(_, u)| u.is_none())
            .map(|(k, _)| *k)
            .collect();
        if open.is_empty() {
            break;
        }
        match process_uses(&proc_dir, name, &open, &mut maps) {
            Ok(used) => {
                for key in used {
                    for (k, u) in keys.iter().zip(users.iter_mut()) {
                        if *k == key && u.is_none() {
                            *u = Some(pid);
                        }
                    }
                }
            }
            // The process exited meanwhile.
            Err(e)
                if e.kind() == ErrorKind::NotFound
                    || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {}
            Err(e) if e.kind() == ErrorKind::PermissionDenied => not_inspected += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(users
        .into_iter()
        .map(|u| u.map_or(Usage::Unused { not_inspected }, Usage::UsedBy))
        .collect())
}

/// Opens the directory `name` relative to `dir`.
fn open_dir<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> std::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(openat(dir, name, flags, Mode::empty())?)
}

/// Which of the files `keys` process `pid` (its directory under `/proc`) has open or
/// mapped; `maps` is a buffer for its `/proc/PID/maps`.
fn process_uses(
    proc_dir: &OwnedFd,
    pid: &CStr,
    keys: &[Key],
    maps: &mut Vec<u8>,
) -> std::io::Result<Vec<Key>> {
    let mut used = Vec::new();
    let mut path = pid.to_bytes().to_vec();
    path.extend_from_slice(b"/fd");
    let mut fds = Dir::new(open_dir(proc_dir, path.as_slice())?)?;
    while let Some(fd) = fds.read() {
        let fd = fd?;
        let name = fd.file_name();
        if name.to_bytes().starts_with(b".") {
            continue;
        }
        if let Ok(st) = statat(fds.fd()?, name, AtFlags::empty()) {
            let key = (st.st_dev, st.st_ino);
            if keys.contains(&key) && !used.contains(&key) {
                used.push(key);
            }
        }
    }
    if used.len() == keys.len() {
        return Ok(used);
    }
    path.truncate(pid.to_bytes().len());
    path.extend_from_slice(b"/maps");
    let flags = OFlags::RDONLY | OFlags::CLOEXEC;
    maps.clear();
    fs::File::from(openat(proc_dir, path.as_slice(), flags, Mode::empty())?).read_to_end(maps)?;
    for line in maps.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        for &(dev, ino) in keys {
            let want = (rustix::fs::major(dev), rustix::fs::minor(dev));
            if !used.contains(&(dev, ino)) && maps_line_is(line, want, ino) {
                used.push((dev, ino));
            }
        }
    }
    Ok(used)
}

/// Whether one `/proc/PID/maps` line (`start-end perms offset MAJ:MIN inode path`) maps
/// the file (`major`, `minor`), `ino`.
fn maps_line_is(line: &str, (major, minor): (u32, u32), ino: u64) -> bool {
    let mut fields = line.split_whitespace().skip(3);
    let (Some(device), Some(inode)) = (fields.next(), fields.next()) else {
        return false;
    };
    let Some((maj, min)) = device.split_once(':') else {
        return false;
    };
    u32::from_str_radix(maj, 16) == Ok(major)
        && u32::from_str_radix(min, 16) == Ok(minor)
        && inode.parse::<u64>() == Ok(ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_match_by_device_and_inode() {
        let line =
            "7f1c00000000-7f1c00400000 rw-s 00000000 00:2e 1234   /mnt/huge/zeronce-pool-0000";
        assert!(maps_line_is(line, (0, 0x2e), 1234));
        assert!(!maps_line_is(line, (0, 0x2e), 1235));
        assert!(!maps_line_is(line, (8, 1), 1234));
        assert!(!maps_line_is(
            "7f1c0000-7f1c1000 r--p 00000000 00:00 0",
            (0, 0x2e),
            1234
        ));
        assert!(!maps_line_is("garbage", (0, 0), 0));
    }

    #[test]
    fn a_file_another_process_holds_is_in_use_and_unused_after() {
        let path = std::env::temp_dir().join(format!("zeronce-usage-{}", std::process::id()));
        fs::write(&path, b"x").unwrap();
        // This process's own descriptors do not count.
        let _mine = fs::File::open(&path).unwrap();
        assert!(matches!(usage(&path).unwrap(), Usage::Unused { .. }));
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .stdin(fs::File::open(&path).unwrap())
            .spawn()
            .expect("run sleep");
        let seen = usage(&path).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(seen, Usage::UsedBy(child.id()));
        assert!(matches!(usage(&path).unwrap(), Usage::Unused { .. }));
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn concurrent_checks_share_walks_and_each_gets_its_own_answer() {
        let dir = std::env::temp_dir();
        let held = dir.join(format!("zeronce-usage-held-{}", std::process::id()));
        let free = dir.join(format!("zeronce-usage-free-{}", std::process::id()));
        fs::write(&held, b"x").unwrap();
        fs::write(&free, b"x").unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .stdin(fs::File::open(&held).unwrap())
            .spawn()
            .expect("run sleep");
        let answers: Vec<(bool, Usage)> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..16)
                .map(|i| {
                    let path = if i % 2 == 0 { &held } else { &free };
                    s.spawn(move || (i % 2 == 0, usage(path).unwrap()))
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        child.kill().unwrap();
        child.wait().unwrap();
        for (is_held, u) in answers {
            if is_held {
                assert_eq!(u, Usage::UsedBy(child.id()));
            } else {
                assert!(matches!(u, Usage::Unused { .. }), "{u:?}");
            }
        }
        fs::remove_file(&held).unwrap();
        fs::remove_file(&free).unwrap();
    }
}
