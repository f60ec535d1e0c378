//! Resident-memory readers: what the kernel really holds for us, to prove that a discard
//! returned memory (and that a "discard" that frees nothing did not).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::PAGE_SIZE;

/// Why a reading failed.
#[derive(Debug, thiserror::Error)]
pub enum ResidentError {
    /// A `/proc` or `/sys` file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A `/proc` or `/sys` file did not hold what was expected.
    #[error("{path}: no parsable {field}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The field or value that was missing or malformed.
        field: &'static str,
    },
    /// A system call failed.
    #[error("{call} failed: {errno}")]
    Os {
        /// The system call.
        call: &'static str,
        /// The error the kernel returned.
        errno: Errno,
    },
}

fn read_text(path: &Path) -> Result<String, ResidentError> {
    std::fs::read_to_string(path).map_err(|source| ResidentError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The calling process's resident set, split by kind (`/proc/self/status`), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessRss {
    /// `RssAnon`: private anonymous pages (incl. THP).
    pub anon: u64,
    /// `RssFile`: file-backed pages mapped by the process.
    pub file: u64,
    /// `RssShmem`: shmem / memfd pages mapped by the process (not hugetlb).
    pub shmem: u64,
}

impl ProcessRss {
    /// Reads `/proc/self/status`.
    pub fn read() -> Result<ProcessRss, ResidentError> {
        let path = Path::new("/proc/self/status");
        Self::parse(&read_text(path)?).ok_or_else(|| ResidentError::Parse {
            path: path.to_owned(),
            field: "RssAnon/RssFile/RssShmem",
        })
    }

    /// Parses the text of a `status` file; `None` if a field is missing.
    pub fn parse(status: &str) -> Option<ProcessRss> {
        let field = |name: &str| status_bytes(status, name);
        Some(ProcessRss {
            anon: field("RssAnon")?,
            file: field("RssFile")?,
            shmem: field("RssShmem")?,
        })
    }

    /// Sum of the three kinds.
    pub fn total(self) -> u64 {
        self.anon + self.file + self.shmem
    }
}

/// The calling process's peak resident set (`VmHWM` in `/proc/self/status`), in bytes.
pub fn peak_rss() -> Result<u64, ResidentError> {
    let path = Path::new("/proc/self/status");
    status_bytes(&read_text(path)?, "VmHWM").ok_or_else(|| ResidentError::Parse {
        path: path.to_owned(),
        field: "VmHWM",
    })
}

/// A `status` file's `name:  N kB` field, in bytes.
fn status_bytes(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// Bytes the file behind `fd` really has allocated (`fstat` `st_blocks` × 512): for a
/// memfd, the shmem or hugetlb pages it holds, whether mapped or not.
pub fn file_allocated_bytes(fd: impl AsFd) -> Result<u64, ResidentError> {
    let st = rustix::fs::fstat(fd).map_err(|errno| ResidentError::Os {
        call: "fstat",
        errno,
    })?;
    #[allow(clippy::useless_conversion)] // c_long on some targets
    Ok(u64::try_from(st.st_blocks).unwrap_or(0) * 512)
}

/// The counters of one hugetlb pool (`/sys/kernel/mm/hugepages/hugepages-<N>kB/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugetlbPoolCounters {
    /// Huge page size in bytes.
    pub page_size: usize,
    /// `nr_hugepages`: pages in the pool.
    pub total: u64,
    /// `free_hugepages`: pages not in use (reserved ones included).
    pub free: u64,
    /// `resv_hugepages`: free pages promised to mappings already made.
    pub reserved: u64,
    /// `surplus_hugepages`: pages above `nr_overcommit_hugepages`' base.
    pub surplus: u64,
}

const HUGEPAGES_DIR: &str = "/sys/kernel/mm/hugepages";

impl HugetlbPoolCounters {
    /// Reads the pool of `page_size`-byte pages.
    pub fn read(page_size: usize) -> Result<HugetlbPoolCounters, ResidentError> {
        let dir = Path::new(HUGEPAGES_DIR).join(format!("hugepages-{}kB", page_size / 1024));
        let num = |name: &'static str| -> Result<u64, ResidentError> {
            let path = dir.join(name);
            read_text(&path)?
                .trim()
                .parse()
                .map_err(|_| ResidentError::Parse { path, field: name })
        };
        Ok(HugetlbPoolCounters {
            page_size,
            total: num("nr_hugepages")?,
            free: num("free_hugepages")?,
            reserved: num("resv_hugepages")?,
            surplus: num("surplus_hugepages")?,
        })
    }

    /// Every pool the kernel has (empty if hugetlb is not configured).
    pub fn all() -> Result<Vec<HugetlbPoolCounters>, ResidentError> {
        let dir = Path::new(HUGEPAGES_DIR);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(Vec::new());
        };
        let mut pools = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name();
            let kb = name.to_str().and_then(|n| {
                n.strip_prefix("hugepages-")?
                    .strip_suffix("kB")?
                    .parse::<usize>()
                    .ok()
            });
            if let Some(kb) = kb {
                pools.push(Self::read(kb * 1024)?);
            }
        }
        pools.sort_by_key(|p| p.page_size);
        Ok(pools)
    }

    /// Pages in use (allocated to some file or mapping).
    pub fn in_use(self) -> u64 {
        self.total.saturating_sub(self.free)
    }

    /// Free pages a new mapping can still reserve.
    pub fn available(self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }
}

/// Bytes of `[addr, addr + len)` resident in memory, by `mincore` (for file and shmem
/// mappings this counts the page cache, i.e. pages the file still holds even where this
/// process has dropped its page-table entries). The range is widened to whole pages.
/// Safe: `mincore` only reads page tables and fails with `ENOMEM` on unmapped ranges.
pub(crate) fn resident_bytes(addr: *const u8, len: usize) -> Result<usize, ResidentError> {
    if len == 0 {
        return Ok(0);
    }
    let start = addr as usize & !(PAGE_SIZE - 1);
    let end = (addr as usize)
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(PAGE_SIZE))
        .ok_or(ResidentError::Os {
            call: "mincore",
            errno: Errno::NOMEM,
        })?;
    // A piece at a time: one byte per page of a 64 GiB range would be 16 MiB of vector,
    // resident for the call (and in the peak RSS a report reads after it).
    let mut vec = vec![0u8; MINCORE_PAGES];
    let mut resident = 0;
    let mut at = start;
    while at < end {
        let len = (end - at).min(MINCORE_PAGES * PAGE_SIZE);
        // SAFETY: `vec` has at least one byte per page of the page-aligned piece, as
        // mincore requires; it writes only into `vec` and reads no memory of the range.
        let rc = unsafe { libc::mincore(at as *mut libc::c_void, len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(ResidentError::Os {
                call: "mincore",
                errno: Errno::from_raw_os_error(
                    std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EINVAL),
                ),
            });
        }
        let pages = len / PAGE_SIZE;
        resident += vec[..pages].iter().filter(|&&b| b & 1 == 1).count() * PAGE_SIZE;
        at += len;
    }
    Ok(resident)
}

/// Pages asked of `mincore` per call (256 MiB of range, a 64 KiB vector).
const MINCORE_PAGES: usize = 1 << 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackingKind, GuestRam};

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: mincore")]
    fn resident_pages_are_counted_across_every_piece_of_a_large_range() {
        // 1 GiB in small pages: four of `mincore`'s pieces, pages touched in three.
        let mut ram = GuestRam::new(1 << 30, BackingKind::Anonymous { thp: false }).unwrap();
        assert_eq!(ram.resident_bytes(0, ram.len()).unwrap(), 0);
        let piece = MINCORE_PAGES * PAGE_SIZE;
        for at in [
            5 * PAGE_SIZE,
            piece + 3 * PAGE_SIZE,
            3 * piece + piece - PAGE_SIZE,
        ] {
            ram.write(at, &[1]).unwrap();
        }
        assert_eq!(ram.resident_bytes(0, ram.len()).unwrap(), 3 * PAGE_SIZE);
        // A range that starts and ends inside pieces.
        let (from, len) = (4 * PAGE_SIZE, 3 * piece);
        assert_eq!(ram.resident_bytes(from, len).unwrap(), 2 * PAGE_SIZE);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs /proc")]
    fn the_process_peak_covers_what_this_test_touched() {
        // Kept observable: an allocation nothing reads may be left out by the compiler.
        let touched = std::hint::black_box(vec![1u8; 32 << 20]);
        let peak = peak_rss().expect("VmHWM in /proc/self/status");
        assert!(
            peak >= touched.len() as u64,
            "VmHWM {peak} < 32 MiB touched"
        );
    }

    #[test]
    fn parses_status_fields() {
        let s = "Name:\tx\nRssAnon:\t    1234 kB\nRssFile:\t  10 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(
            ProcessRss::parse(s),
            Some(ProcessRss {
                anon: 1234 * 1024,
                file: 10 * 1024,
                shmem: 0
            })
        );
        assert_eq!(ProcessRss::parse("RssAnon: 1 kB\n"), None);
        assert_eq!(
            ProcessRss::parse("RssAnon: x kB\nRssFile: 1 kB\nRssShmem: 1 kB"),
            None
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs /proc")]
    fn own_rss_is_nonzero() {
        let rss = ProcessRss::read().expect("status");
        assert!(rss.anon > 0 && rss.total() >= rss.anon);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: mincore")]
    fn mincore_counts_touched_pages_of_a_heap_buffer() {
        let v = vec![1u8; 64 * PAGE_SIZE];
        let r = resident_bytes(v.as_ptr(), v.len()).expect("mincore");
        assert!((63 * PAGE_SIZE..=65 * PAGE_SIZE).contains(&r), "{r}");
        assert_eq!(resident_bytes(v.as_ptr(), 0).expect("empty"), 0);
        assert!(matches!(
            resident_bytes(usize::MAX as *const u8, 2),
            Err(ResidentError::Os { .. })
        ));
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs /sys")]
    fn hugepage_pools_are_consistent() {
        let pools = HugetlbPoolCounters::all().expect("sysfs");
        for p in pools {
            assert!(p.page_size.is_power_of_two() && p.page_size > PAGE_SIZE);
            assert!(p.free <= p.total + p.surplus, "{p:?}");
            assert!(p.in_use() <= p.total);
        }
        assert!(matches!(
            HugetlbPoolCounters::read(3 * 1024),
            Err(ResidentError::Read { .. })
        ));
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: memfd_create, fstat")]
    fn memfd_allocated_bytes_follow_writes() {
        let fd = rustix::fs::memfd_create("zeronce-test", rustix::fs::MemfdFlags::CLOEXEC)
            .expect("memfd");
        rustix::fs::ftruncate(&fd, 1 << 20).expect("ftruncate");
        assert_eq!(file_allocated_bytes(&fd).expect("fstat"), 0);
        rustix::io::pwrite(&fd, &[7u8; 3 * PAGE_SIZE], 0).expect("pwrite");
        assert_eq!(
            file_allocated_bytes(&fd).expect("fstat"),
            3 * PAGE_SIZE as u64
        );
    }
}
