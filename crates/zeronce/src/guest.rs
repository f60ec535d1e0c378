//! Whether this machine is a virtual machine whose kernel gives its free memory back to
//! the host on its own (Linux free page reporting through a `virtio_balloon` device).
//!
//! On such a guest the kernel reports every free 2 MiB block a couple of seconds after it
//! was freed, and the host takes its backing. A transparent huge page faulted in later
//! lands on such a block and costs what a fault on host-discarded memory costs: measured
//! 4–7 ms a 2 MiB fault, against 0.1–0.4 ms for a warm one, while 4 KiB faults come from
//! the guest's small free lists, which the kernel does not report. So huge pages, a gain
//! for a hot buffer reused in place, make every first touch of new memory and every reuse
//! of memory given back seconds before several times slower there.

use std::io::Write;
use std::path::Path;

use rustix::fs::{open, Mode, OFlags};
use rustix::io::read;

/// `VIRTIO_BALLOON_F_REPORTING`: the feature bit of free page reporting.
const F_REPORTING: usize = 5;

/// The largest reporting order under which 2 MiB blocks are reported (order 9).
const HUGE_PAGE_ORDER: u32 = 9;

/// Virtio device numbers looked at (`virtio0` … `virtio31`).
const DEVICES: usize = 32;

/// Whether the running kernel reports its free 2 MiB blocks to a host (a `virtio_balloon`
/// device bound with free page reporting negotiated, at a reporting order of 2 MiB or
/// less); `false` when `/sys` does not say so. Allocates nothing (an allocator asks it
/// while it starts), and costs a few dozen failed `open`s on a machine without a balloon.
pub fn reports_free_memory_to_host() -> bool {
    reports_at(Path::new("/sys"))
}

/// Up to `N` bytes of the file at `path`, read into a buffer on the stack (the path is
/// formatted into one too); `None` when the path is too long or the file cannot be read.
fn read_small<const N: usize>(path: std::fmt::Arguments) -> Option<([u8; N], usize)> {
    let mut buf = [0u8; 192];
    let mut rest = &mut buf[..];
    rest.write_fmt(path).ok()?;
    let len = 192 - rest.len();
    let fd = open(&buf[..len], OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut out = [0u8; N];
    let n = read(&fd, &mut out).ok()?;
    Some((out, n))
}

/// [`reports_free_memory_to_host`] for a sysfs tree at `sys`.
fn reports_at(sys: &Path) -> bool {
    let sys = sys.display();
    let order = read_small::<16>(format_args!(
        "{sys}/module/page_reporting/parameters/page_reporting_order"
    ))
    .and_then(|(b, n)| {
        std::str::from_utf8(&b[..n])
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    });
    // Linux reports only blocks of this order and above.
    if order.is_some_and(|o| o > HUGE_PAGE_ORDER) {
        return false;
    }
    (0..DEVICES).any(|i| {
        // The file lists the negotiated feature bits as '0'/'1' characters, bit 0 first.
        read_small::<64>(format_args!(
            "{sys}/bus/virtio/drivers/virtio_balloon/virtio{i}/features"
        ))
        .is_some_and(|(b, len)| len > F_REPORTING && b[F_REPORTING] == b'1')
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    use super::*;

    /// A directory removed on drop.
    struct Tree(PathBuf);

    impl Tree {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A sysfs tree with one balloon device of `features` and, if given, a reporting order.
    fn sysfs(features: Option<&str>, order: Option<&str>) -> Tree {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "zeronce-sysfs-{}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        );
        let dir = Tree(std::env::temp_dir().join(name));
        let drivers = dir.path().join("bus/virtio/drivers/virtio_balloon");
        std::fs::create_dir_all(&drivers).expect("mkdir");
        std::fs::write(drivers.join("bind"), "").expect("write");
        if let Some(f) = features {
            let dev = drivers.join("virtio0");
            std::fs::create_dir_all(&dev).expect("mkdir");
            std::fs::write(dev.join("features"), format!("{f}\n")).expect("write");
        }
        if let Some(o) = order {
            let params = dir.path().join("module/page_reporting/parameters");
            std::fs::create_dir_all(&params).expect("mkdir");
            std::fs::write(params.join("page_reporting_order"), format!("{o}\n")).expect("write");
        }
        dir
    }

    #[test]
    fn a_balloon_with_free_page_reporting_at_order_9_is_a_reporting_guest() {
        // This machine's own line: stats, deflate-on-OOM, reporting, VERSION_1.
        let features = "0110010100000000000000000000000010000000";
        assert!(reports_at(sysfs(Some(features), Some("9")).path()));
        assert!(
            reports_at(sysfs(Some(features), None).path()),
            "order not shown"
        );
    }

    #[test]
    fn no_balloon_no_reporting_bit_or_a_larger_order_is_not() {
        assert!(!reports_at(Path::new("/nonexistent-sysfs")));
        assert!(
            !reports_at(sysfs(None, Some("9")).path()),
            "no device bound"
        );
        let without = "0110000100000000000000000000000010000000";
        assert!(
            !reports_at(sysfs(Some(without), Some("9")).path()),
            "bit 5 clear"
        );
        let with = "0110010100000000000000000000000010000000";
        assert!(
            !reports_at(sysfs(Some(with), Some("10")).path()),
            "4 MiB order"
        );
        assert!(
            !reports_at(sysfs(Some("01100"), Some("9")).path()),
            "short line"
        );
    }
}
