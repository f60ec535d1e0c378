//! The pool's files on a hugetlbfs mount: creating them, finding and repopulating their
//! holes, mapping them for zeroing.
//!
//! Holes: hugetlbfs answers `SEEK_HOLE` with the end of the file whatever it holds (it
//! uses the generic `llseek`), so holes are found through the allocated size instead:
//! `st_blocks` says how many pages a file lacks, and `fallocate` page by page says which
//! (a page that was missing makes `st_blocks` grow). `fallocate` is also what
//! repopulates a hole: the kernel allocates a huge page and zeroes it — the kernel's
//! zeroing, counted apart from the daemon's.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{fallocate, fstat, FallocateFlags};
use rustix::io::Errno;
use zeronce_mem::{
    BackingKind, GuestRam, HugePageSize, HugetlbPoolCounters, LeaseError, LeaseProbe, LeaseState,
    RamError,
};

use crate::state::{FileId, PageIndex};

/// `statfs` magic of hugetlbfs.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// Why the pool's directory or a file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The directory is not a hugetlbfs mount.
    #[error(
        "{dir} is not a hugetlbfs mount: mount one with \
         `mount -t hugetlbfs -o pagesize={page} none {dir}`"
    )]
    NotHugetlbfs {
        /// The directory.
        dir: PathBuf,
        /// The page size asked for, as `2M` / `1G`.
        page: &'static str,
    },
    /// The mount's page size is not the one asked for.
    #[error("{dir} is a hugetlbfs mount of {mount_bytes}-byte pages, not {page}")]
    WrongPageSize {
        /// The directory.
        dir: PathBuf,
        /// Its page size.
        mount_bytes: u64,
        /// The page size asked for.
        page: &'static str,
    },
    /// A file already there has another size.
    #[error("{path} has {found} bytes, the pool's files have {expected}: remove it or use another --dir")]
    WrongFileSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        found: u64,
        /// The pool's file size.
        expected: u64,
    },
    /// Not enough huge pages are free for the files' missing pages.
    #[error(
        "the pool needs {needed} more {page} huge pages, {available} are free: reserve \
         them with `echo N > /sys/kernel/mm/hugepages/hugepages-{kb}kB/nr_hugepages`{}",
        reserve_hint(*.kb)
    )]
    NoHugePages {
        /// The page size, as `2M` / `1G`.
        page: &'static str,
        /// Its size in KiB.
        kb: u64,
        /// Pages missing from the files.
        needed: u64,
        /// Free, unreserved pages of the kernel's pool.
        available: u64,
    },
    /// An I/O call failed.
    #[error("{call} {path}: {errno}")]
    Os {
        /// The call.
        call: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        errno: Errno,
    },
    /// Mapping a file failed.
    #[error("mapping {path}: {source}")]
    Map {
        /// The file.
        path: PathBuf,
        /// Why.
        source: RamError,
    },
}

/// What else to try when the kernel would not reserve pages of `kb` KiB: 1 GiB pages need
/// a physically contiguous, movable gigabyte, which a long-running host rarely has.
fn reserve_hint(kb: u64) -> &'static str {
    if kb >= 1 << 20 {
        " (1G pages need 1 GiB of contiguous free memory: if the count stays below N, \
         `echo 3 > /proc/sys/vm/drop_caches; echo 1 > /proc/sys/vm/compact_memory` and retry, \
         or reserve them at boot with `hugepagesz=1G hugepages=N` on the kernel command line)"
    } else {
        ""
    }
}

/// The environment variable naming a hugetlbfs mount of 2 MiB pages for tests and
/// benchmarks (`.ci/run` mounts one in a temporary directory and sets it).
pub const MOUNT_ENV_2M: &str = "ZERONCE_HUGETLBFS_2M";

/// The hugetlbfs mount named by [`MOUNT_ENV_2M`], checked; the error says what to set up.
pub fn mount_from_env() -> Result<PathBuf, String> {
    let how = "reserve 2 MiB pages and mount hugetlbfs, as root: `echo 64 > \
               /proc/sys/vm/nr_hugepages; mkdir -p /mnt/huge2m; mount -t hugetlbfs -o \
               pagesize=2M none /mnt/huge2m`, then set";
    let dir = std::env::var_os(MOUNT_ENV_2M)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{MOUNT_ENV_2M} is not set: {how} {MOUNT_ENV_2M}=/mnt/huge2m (`.ci/run` does all of this)"))?;
    let fs = rustix::fs::statfs(&dir)
        .map_err(|e| format!("{}: {e}: {how} {MOUNT_ENV_2M}", dir.display()))?;
    if fs.f_type as i64 != HUGETLBFS_MAGIC || fs.f_bsize as usize != HugePageSize::Size2M.bytes() {
        return Err(format!(
            "{} is not a hugetlbfs mount of 2 MiB pages: {how} {MOUNT_ENV_2M}",
            dir.display()
        ));
    }
    Ok(dir)
}

/// `2M` / `1G`.
pub fn page_label(size: HugePageSize) -> &'static str {
    match size {
        HugePageSize::Size2M => "2M",
        HugePageSize::Size1G => "1G",
    }
}

/// The files of one pool.
#[derive(Debug)]
pub struct PoolFiles {
    dir: PathBuf,
    page_size: HugePageSize,
    file_bytes: u64,
    files: Vec<(String, File)>,
}

impl PoolFiles {
    /// The name of file `i`.
    pub fn name_of(i: usize) -> String {
        format!("zeronce-pool-{i:04}")
    }

    /// Opens (creating as needed, at `file_bytes`) the `count` files of a pool in `dir`,
    /// which must be a hugetlbfs mount of `page_size` pages with enough free huge pages
    /// for what the files lack. Allocates nothing yet.
    pub fn open(
        dir: &Path,
        page_size: HugePageSize,
        count: usize,
        file_bytes: u64,
    ) -> Result<PoolFiles, FilesError> {
        let page = page_label(page_size);
        let os = |call, path: &Path| {
            let path = path.to_owned();
            move |errno| FilesError::Os { call, path, errno }
        };
        let fs = rustix::fs::statfs(dir).map_err(os("statfs", dir))?;
        if fs.f_type as i64 != HUGETLBFS_MAGIC {
            return Err(FilesError::NotHugetlbfs {
                dir: dir.to_owned(),
                page,
            });
        }
        if fs.f_bsize as u64 != page_size.bytes() as u64 {
            return Err(FilesError::WrongPageSize {
                dir: dir.to_owned(),
                mount_bytes: fs.f_bsize as u64,
                page,
            });
        }
        let mut files = Vec::with_capacity(count);
        let mut missing = 0;
        for i in 0..count {
            let name = Self::name_of(i);
            let path = dir.join(&name);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| FilesError::Os {
                    call: "open",
                    path: path.clone(),
                    errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
                })?;
            let st = fstat(&file).map_err(os("fstat", &path))?;
            let size = st.st_size as u64;
            if size == 0 {
                file.set_len(file_bytes).map_err(|e| FilesError::Os {
                    call: "ftruncate",
                    path: path.clone(),
                    errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
                })?;
            } else if size != file_bytes {
                return Err(FilesError::WrongFileSize {
                    path,
                    found: size,
                    expected: file_bytes,
                });
            }
            let allocated = st.st_blocks as u64 * 512;
            missing += file_bytes.saturating_sub(allocated) / page_size.bytes() as u64;
            files.push((name, file));
        }
        let pool =
            HugetlbPoolCounters::read(page_size.bytes()).map_err(|_| FilesError::NoHugePages {
                page,
                kb: page_size.bytes() as u64 / 1024,
                needed: missing,
                available: 0,
            })?;
        if pool.available() < missing {
            return Err(FilesError::NoHugePages {
                page,
                kb: page_size.bytes() as u64 / 1024,
                needed: missing,
                available: pool.available(),
            });
        }
        Ok(PoolFiles {
            dir: dir.to_owned(),
            page_size,
            file_bytes,
            files,
        })
    }

    /// The names, in [`FileId`] order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|(n, _)| n.as_str())
    }

    /// The path of a file.
    pub fn path(&self, file: FileId) -> PathBuf {
        self.dir.join(&self.files[file.0].0)
    }

    /// Bytes per huge page.
    pub fn page_bytes(&self) -> usize {
        self.page_size.bytes()
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new open file description of a file, read-write (for passing to a client): not a
    /// `dup` of the daemon's own, which the write lease ([`PoolFiles::lease`]) could not
    /// tell apart from the daemon's. Opened through `/proc/self/fd` (the same inode,
    /// whatever its path became) and `O_NONBLOCK`, so a lease still held fails the open
    /// instead of waiting for its break.
    pub fn open_for_client(&self, file: FileId) -> Result<OwnedFd, FilesError> {
        use std::os::fd::AsRawFd;
        let own = format!("/proc/self/fd/{}", self.files[file.0].1.as_raw_fd());
        let flags =
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NONBLOCK;
        rustix::fs::open(own.as_str(), flags, rustix::fs::Mode::empty()).map_err(|errno| {
            FilesError::Os {
                call: "open",
                path: self.path(file),
                errno,
            }
        })
    }

    /// Asks for the write lease on the daemon's own descriptor of a file: granted
    /// ([`LeaseProbe::Held`]) only when no other open file description of it exists
    /// anywhere — a descriptor in any process or in flight in a socket, a mapping of any
    /// kind (see `zeronce_mem`'s lease docs). Held, any later `open` of the file breaks
    /// it ([`PoolFiles::lease_state`]).
    pub fn lease(&self, file: FileId) -> Result<LeaseProbe, LeaseError> {
        zeronce_mem::take_write_lease(self.files[file.0].1.as_fd())
    }

    /// The daemon's lease on a file now.
    pub fn lease_state(&self, file: FileId) -> std::io::Result<LeaseState> {
        zeronce_mem::lease_state(self.files[file.0].1.as_fd())
    }

    /// Gives up the daemon's lease on a file, if it holds one.
    pub fn release_lease(&self, file: FileId) {
        if let Err(e) = zeronce_mem::release_lease(self.files[file.0].1.as_fd()) {
            tracing::warn!(path = %self.path(file).display(), %e, "releasing a file's lease");
        }
    }

    /// A new descriptor of the daemon's own open file description of a file (for its
    /// own mappings: a `dup` does not count against the lease).
    pub fn dup(&self, file: FileId) -> Result<OwnedFd, FilesError> {
        rustix::io::fcntl_dupfd_cloexec(self.files[file.0].1.as_fd(), 0).map_err(|errno| {
            FilesError::Os {
                call: "dup",
                path: self.path(file),
                errno,
            }
        })
    }

    /// Bytes of huge pages the file holds.
    pub fn allocated_bytes(&self, file: FileId) -> Result<u64, FilesError> {
        let st = fstat(&self.files[file.0].1).map_err(|errno| FilesError::Os {
            call: "fstat",
            path: self.path(file),
            errno,
        })?;
        Ok(st.st_blocks as u64 * 512)
    }

    /// Finds the file's missing pages and has the kernel allocate (and zero) them;
    /// returns which pages were missing. Stops at the first failure (`ENOSPC`: another
    /// user took the free huge pages), with the pages repopulated so far lost to the
    /// caller's count (they read zero either way).
    pub fn repopulate(&self, file: FileId) -> Result<Vec<PageIndex>, FilesError> {
        let page = self.page_size.bytes() as u64;
        let mut allocated = self.allocated_bytes(file)?;
        let mut holes = Vec::new();
        let pages = self.file_bytes / page;
        let mut i = 0;
        while allocated < self.file_bytes && i < pages {
            fallocate(
                &self.files[file.0].1,
                FallocateFlags::KEEP_SIZE,
                i * page,
                page,
            )
            .map_err(|errno| FilesError::Os {
                call: "fallocate",
                path: self.path(file),
                errno,
            })?;
            let now = self.allocated_bytes(file)?;
            if now > allocated {
                holes.push(PageIndex(i as u32));
            }
            allocated = now;
            i += 1;
        }
        Ok(holes)
    }

    /// Maps the whole file shared, for zeroing its pages.
    pub fn map(&self, file: FileId) -> Result<GuestRam, FilesError> {
        let fd = self.dup(file)?;
        GuestRam::map_file(fd, BackingKind::Hugetlb(self.page_size)).map_err(|source| {
            FilesError::Map {
                path: self.path(file),
                source,
            }
        })
    }
}
