//! Whether a process other than the daemon still has a file open or mapped, read from
//! `/proc/PID/fd` (descriptors) and `/proc/PID/maps` (mappings, which outlive the
//! descriptor they were made from: a VMM may close the file and keep running on its
//! mapping). The daemon asks before it zeroes any returned file and before it reclaims an
//! orphaned one: zeroing pages a guest is still running on would corrupt it.
//!
//! A process the daemon may not inspect (`EACCES`: more privileged than the daemon, in
//! another user namespace, or not dumpable) is not seen. Such a process could only write
//! to the file if it could open it read-write, which the pool's files (created by the
//! daemon, mode 0644 under the usual umask) allow only to their owner and root: run the
//! daemon as the user (or root) that runs the VMMs. The count of processes not inspected
//! is logged.

use std::ffi::CStr;
use std::fs;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::{openat, statat, AtFlags, Dir, Mode, OFlags};

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

/// Scans every process but this one for `path` (matched by device and inode).
///
/// Every lookup is relative to an open directory (`/proc`, then `/proc/PID`, then its
/// `fd`), not a full path: a return scans every descriptor of every process, and the
/// path walks were a third of its cost.
pub fn usage(path: &Path) -> std::io::Result<Usage> {
    let meta = fs::metadata(path)?;
    let (dev, ino) = (meta.dev(), meta.ino());
    let me = std::process::id();
    let mut not_inspected = 0;
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
        match process_uses(&proc_dir, name, dev, ino) {
            Ok(true) => return Ok(Usage::UsedBy(pid)),
            Ok(false) => {}
            // The process exited meanwhile.
            Err(e)
                if e.kind() == ErrorKind::NotFound
                    || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {}
            Err(e) if e.kind() == ErrorKind::PermissionDenied => not_inspected += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(Usage::Unused { not_inspected })
}

/// Opens the directory `name` relative to `dir`.
fn open_dir<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> std::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(openat(dir, name, flags, Mode::empty())?)
}

/// Whether process `pid` (its directory under `/proc`) has the file (`dev`, `ino`) open
/// or mapped.
fn process_uses(proc_dir: &OwnedFd, pid: &CStr, dev: u64, ino: u64) -> std::io::Result<bool> {
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
            if st.st_dev == dev && st.st_ino == ino {
                return Ok(true);
            }
        }
    }
    path.truncate(pid.to_bytes().len());
    path.extend_from_slice(b"/maps");
    let flags = OFlags::RDONLY | OFlags::CLOEXEC;
    let mut maps = String::new();
    fs::File::from(openat(proc_dir, path.as_slice(), flags, Mode::empty())?)
        .read_to_string(&mut maps)?;
    let want = (rustix::fs::major(dev), rustix::fs::minor(dev));
    Ok(maps.lines().any(|line| maps_line_is(line, want, ino)))
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
}
