//! Which pages of a private anonymous mapping may hold data, read from the page tables
//! with Linux's `PAGEMAP_SCAN` (Linux 6.7 and later), without touching the memory.
//!
//! A page of a private anonymous mapping reads zero unless the kernel holds a page of its
//! own for it: a page table entry that is empty (never touched, or discarded) or that maps
//! the shared zero page (only ever read) stands for zeros. Every other entry, a present
//! page or one swapped or migrating out, may hold data. So the runs of pages whose entry
//! is present and not the zero page, or not present and not empty, are all the pages that
//! may not read zero, and everything between them does.
//!
//! This holds only for private anonymous memory: a shared or file mapping's page may hold
//! data in the page cache while this process's entry for it is empty. Callers ask only for
//! such memory ([`crate::GuestRam::for_each_maybe_written`] checks the backing).

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::*};

use rustix::fs::{fstat, open, Mode, OFlags};
use rustix::io::Errno;

use crate::PAGE_SIZE;

/// The ioctl: `_IOWR('f', 16, struct pm_scan_arg)` (`include/uapi/linux/fs.h`).
const PAGEMAP_SCAN: libc::c_ulong =
    (3 << 30) | ((PmScanArg::SIZE as libc::c_ulong) << 16) | (0x66 << 8) | 16;

/// Page categories (`PAGE_IS_*`): the entry maps a page.
const PAGE_IS_PRESENT: u64 = 1 << 3;
/// The entry holds a swap (or migration) entry.
const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// The entry maps the shared zero page (a page or huge page only ever read).
const PAGE_IS_PFNZERO: u64 = 1 << 5;

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

impl PmScanArg {
    const SIZE: usize = std::mem::size_of::<PmScanArg>();
}

/// `struct page_region`: pages `[start, end)` (addresses) of one run.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

impl PageRegion {
    /// Its addresses `[start, end)`, if it is not empty.
    fn range(&self) -> Option<(usize, usize)> {
        let (start, end) = (
            usize::try_from(self.start).ok()?,
            usize::try_from(self.end).ok()?,
        );
        (start < end).then_some((start, end))
    }
}

/// Runs asked for per call.
const RUNS: usize = 32;

/// Why a scan could not be made.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScanError {
    /// The range is empty, not page aligned, or outside the mapping.
    #[error("range {offset:#x}+{len:#x} is empty, not page aligned or outside the mapping")]
    Range {
        /// Start offset.
        offset: usize,
        /// Length.
        len: usize,
    },
    /// The memory is not private anonymous: its page tables do not tell what it holds.
    #[error("the page tables of a shared or file mapping do not tell what it holds")]
    Backing,
    /// The kernel refused (`ENOTTY`/`EINVAL`: before Linux 6.7; `EACCES`/`EPERM`: no
    /// access to `/proc/self/pagemap`).
    #[error("{call} failed: {errno}")]
    Os {
        /// The call.
        call: &'static str,
        /// The error the kernel returned.
        errno: Errno,
    },
}

/// Calls `f` with the address and length of each run of pages of `[addr, addr + len)`
/// that may not read zero (see the module docs), in address order. `addr` and `len` must
/// be page aligned and lie in one private anonymous mapping of the caller's.
///
/// The range is looked at in pieces of `granule` bytes (from `addr`): a piece whose first
/// page may hold data is reported whole, its other pages not looked at (a piece written
/// from its start is the common case, and one page-table entry is read for it instead of
/// all of them); in the others each page is looked at. So a run may include pages that
/// read zero, never the other way round. On an error `f` may have seen the runs of a
/// first part of the range (those are right).
pub(crate) fn for_each_maybe_written(
    addr: usize,
    len: usize,
    granule: usize,
    mut f: impl FnMut(usize, usize),
) -> Result<(), ScanError> {
    // Runs that touch are passed on as one: `pending` waits for the next.
    let mut pending: Option<(usize, usize)> = None;
    let mut run = |s: usize, e: usize| match &mut pending {
        Some((_, pe)) if *pe == s => *pe = e,
        _ => {
            if let Some((ps, pe)) = pending.replace((s, e)) {
                f(ps, pe - ps);
            }
        }
    };
    let scanned = scan_pieces(addr, len, granule, &mut run);
    if let Some((ps, pe)) = pending {
        f(ps, pe - ps);
    }
    scanned
}

/// [`for_each_maybe_written`] before runs that touch are joined: `run(start, end)`.
fn scan_pieces(
    addr: usize,
    len: usize,
    granule: usize,
    run: &mut impl FnMut(usize, usize),
) -> Result<(), ScanError> {
    let end = addr
        .checked_add(len)
        .ok_or(ScanError::Range { offset: addr, len })?;
    if len == 0 || !addr.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
        return Err(ScanError::Range { offset: addr, len });
    }
    scan_with(&Pagemap::get()?, addr, end, granule.max(PAGE_SIZE), run)
}

/// This process's `/proc/self/pagemap`, opened at the first scan and kept (an open and a
/// close cost ten times the scan of a 2 MiB block written whole): the process id it was
/// opened in (high 32 bits) and the descriptor (low 32), 0 before. A child of `fork`
/// inherits its parent's descriptor, which reads the parent's page tables, so a scan
/// checks the id first (the inherited one is left open: the child may have reused its
/// number). [`KEPT_INODE`] is its inode: a program that closed it and opened another
/// file under its number is caught by an `fstat` before each scan.
static KEPT: AtomicU64 = AtomicU64::new(0);
/// The inode of [`KEPT`]'s file, stored before it.
static KEPT_INODE: AtomicU64 = AtomicU64::new(0);

/// The process id and descriptor of a [`KEPT`] value.
fn unpack(kept: u64) -> (u32, RawFd) {
    let half = |v: u64| u32::try_from(v & u64::from(u32::MAX)).unwrap_or(0);
    (half(kept >> 32), half(kept).cast_signed())
}

/// A pagemap descriptor for one scan: the kept one, or one of its own (closed after).
enum Pagemap {
    Kept(RawFd),
    Own(OwnedFd),
}

impl Pagemap {
    /// This process's pagemap: the kept one when it is still this process's and still
    /// that file, else a new one (closed or replaced behind our back, or never opened
    /// here), kept if no other thread kept one meanwhile.
    fn get() -> Result<Pagemap, ScanError> {
        let pid = rustix::process::getpid()
            .as_raw_nonzero()
            .get()
            .cast_unsigned();
        let kept = KEPT.load(Acquire);
        let (kept_pid, fd) = unpack(kept);
        if kept != 0 && kept_pid == pid {
            // A raw `fstat`: the program may have closed the descriptor (no `BorrowedFd`
            // of it may be made then), which fails the call with EBADF.
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: `st` has room for a `struct stat`, which `fstat` fills on success;
            // a closed or foreign descriptor only makes it fail or describe that file.
            let ok = unsafe { libc::fstat(fd, st.as_mut_ptr()) } == 0;
            // SAFETY: filled by the successful call.
            if ok && unsafe { st.assume_init() }.st_ino == KEPT_INODE.load(Acquire) {
                return Ok(Pagemap::Kept(fd));
            }
        }
        // A literal path: no allocation (this runs inside `free`).
        let own = open(
            c"/proc/self/pagemap",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| ScanError::Os {
            call: "open /proc/self/pagemap",
            errno,
        })?;
        let inode = fstat(&own)
            .map_err(|errno| ScanError::Os {
                call: "fstat /proc/self/pagemap",
                errno,
            })?
            .st_ino;
        let fd = own.as_raw_fd();
        KEPT_INODE.store(inode, Release);
        let new = (u64::from(pid) << 32) | u64::from(fd.cast_unsigned());
        if KEPT.compare_exchange(kept, new, AcqRel, Acquire).is_ok() {
            // Kept from now on (the one it replaced is left open, see `KEPT`).
            return Ok(Pagemap::Kept(own.into_raw_fd()));
        }
        Ok(Pagemap::Own(own))
    }

    fn raw(&self) -> RawFd {
        match self {
            Pagemap::Kept(fd) => *fd,
            Pagemap::Own(own) => own.as_raw_fd(),
        }
    }
}

/// [`scan_pieces`] with a pagemap descriptor, to `end`.
fn scan_with(
    pagemap: &Pagemap,
    addr: usize,
    end: usize,
    granule: usize,
    run: &mut impl FnMut(usize, usize),
) -> Result<(), ScanError> {
    let mut runs = [PageRegion::default(); RUNS];
    let mut piece = addr;
    while piece < end {
        let piece_end = end.min(piece.saturating_add(granule));
        // The first page of the piece that may hold data, if any.
        let first = match scan(pagemap, piece, piece_end, &mut runs[..1], 1)? {
            (0, _) => None,
            _ => runs[0].range().map(|(start, _)| start),
        };
        match first {
            None => {}
            Some(p) if p <= piece => run(piece, piece_end),
            Some(mut at) => {
                // Page by page from there.
                while at < piece_end {
                    let (n, walked) = scan(pagemap, at, piece_end, &mut runs, 0)?;
                    runs[..n]
                        .iter()
                        .filter_map(PageRegion::range)
                        .for_each(|(s, e)| run(s, e));
                    at = walked;
                }
            }
        }
        piece = piece_end;
    }
    Ok(())
}

/// One `PAGEMAP_SCAN` of `[start, end)` for pages that may hold data, at most `max_pages`
/// of them (0: no limit), into `runs`: how many runs it filled and where the walk ended
/// (past `start`: a walk that stopped early stopped at a full `runs` or `max_pages`).
fn scan(
    pagemap: &Pagemap,
    start: usize,
    end: usize,
    runs: &mut [PageRegion],
    max_pages: u64,
) -> Result<(usize, usize), ScanError> {
    let mut arg = PmScanArg {
        size: PmScanArg::SIZE as u64,
        start: start as u64,
        end: end as u64,
        vec: runs.as_mut_ptr() as u64,
        vec_len: runs.len() as u64,
        max_pages,
        // Not the zero page, and present or swapped.
        category_inverted: PAGE_IS_PFNZERO,
        category_mask: PAGE_IS_PFNZERO,
        category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        ..PmScanArg::default()
    };
    // SAFETY: `arg` is a valid `pm_scan_arg` of the size it states; the kernel writes at
    // most `vec_len` regions to `vec`, which points to that many, and `walk_end` into
    // `arg`. Both outlive the call. It reads page tables only.
    let n = unsafe { libc::ioctl(pagemap.raw(), PAGEMAP_SCAN as _, &mut arg) };
    if n < 0 {
        return Err(ScanError::Os {
            call: "ioctl PAGEMAP_SCAN",
            errno: Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::INVAL),
        });
    }
    let filled = usize::try_from(n).unwrap_or(0).min(runs.len());
    let walked = usize::try_from(arg.walk_end).unwrap_or(end);
    if walked <= start && filled == 0 {
        // No run and no step: the kernel would loop us forever.
        return Err(ScanError::Os {
            call: "ioctl PAGEMAP_SCAN (no progress)",
            errno: Errno::INVAL,
        });
    }
    Ok((filled, walked.max(start + PAGE_SIZE).min(end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discard::DiscardOp;
    use crate::{BackingKind, GuestRam};

    const P: usize = PAGE_SIZE;

    /// Held by every test that scans: one of them closes the kept descriptor, which the
    /// others (threads of one process under `cargo test`) must not see mid-scan.
    static SCANS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        SCANS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The scans to oneself, and 4 MiB of small pages with page 7 written and scanned once.
    fn page_seven_written() -> (std::sync::MutexGuard<'static, ()>, GuestRam) {
        let one = one_at_a_time();
        let mut ram = GuestRam::new(4 << 20, BackingKind::Anonymous { thp: false }).unwrap();
        ram.write(7 * P, &[1]).unwrap();
        assert_eq!(runs(&ram, 0, ram.len()), vec![(7, 1)]);
        (one, ram)
    }

    /// The runs of `[offset, offset + len)` of `ram` looked at page by page, as (first
    /// page, pages).
    fn runs(ram: &GuestRam, offset: usize, len: usize) -> Vec<(usize, usize)> {
        runs_in(ram, offset, len, P)
    }

    /// The runs of `[offset, offset + len)` of `ram` looked at in pieces of `granule`.
    fn runs_in(ram: &GuestRam, offset: usize, len: usize, granule: usize) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = Vec::new();
        ram.for_each_maybe_written(offset, len, granule, |o, n| {
            assert!(
                v.last().is_none_or(|&(s, m)| (s + m) * P <= o),
                "runs in order"
            );
            v.push((o / P, n / P));
        })
        .expect("PAGEMAP_SCAN (Linux 6.7+) on private anonymous memory");
        v
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: ioctl on /proc/self/pagemap")]
    fn written_pages_are_found_and_untouched_read_or_discarded_ones_are_not() {
        let _one = one_at_a_time();
        // Small pages only: a transparent huge page would make its whole 2 MiB present.
        let mut ram = GuestRam::new(8 << 20, BackingKind::Anonymous { thp: false }).unwrap();
        assert!(runs(&ram, 0, ram.len()).is_empty(), "fresh memory");
        ram.write(3 * P + 17, &[1]).unwrap();
        ram.write(4 * P, &[2]).unwrap();
        ram.write(10 * P + P - 1, &[3]).unwrap();
        // A page written with zeros holds a page of its own: it may hold data as far as
        // the page tables tell.
        ram.write(700 * P, &[0]).unwrap();
        // Only read: the kernel's zero page.
        let mut b = [0xffu8; 8];
        ram.read(20 * P, &mut b).unwrap();
        ram.read(1500 * P, &mut b).unwrap();
        assert_eq!(b, [0; 8]);
        assert_eq!(runs(&ram, 0, ram.len()), vec![(3, 2), (10, 1), (700, 1)]);
        // A part of the range: runs are clipped to it.
        assert_eq!(runs(&ram, 4 * P, 8 * P), vec![(4, 1), (10, 1)]);
        // Discarded pages read zero again.
        assert!(ram
            .discard(10 * P, P, DiscardOp::DontNeed)
            .unwrap()
            .is_zeroed());
        assert_eq!(runs(&ram, 0, 16 * P), vec![(3, 2)]);
        // In pieces of 2 MiB: a piece written from its first page is one run whole, the
        // others are looked at page by page.
        ram.write(1024 * P, &[4]).unwrap();
        ram.write(1030 * P, &[5]).unwrap();
        assert_eq!(
            runs_in(&ram, 0, ram.len(), 2 << 20),
            vec![(3, 2), (700, 1), (1024, 512)]
        );
        assert_eq!(runs(&ram, 1024 * P, 512 * P), vec![(1024, 1), (1030, 1)]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: ioctl on /proc/self/pagemap")]
    fn more_runs_than_one_call_returns_are_all_found() {
        let _one = one_at_a_time();
        let mut ram = GuestRam::new(4 << 20, BackingKind::Anonymous { thp: false }).unwrap();
        // Every third page: 342 runs, more than one call's RUNS.
        for page in (0..ram.len() / P).step_by(3) {
            ram.write(page * P, &[9]).unwrap();
        }
        // Page by page, and in pieces of 2 MiB whose first page was not written.
        let found = runs(&ram, P, ram.len() - P);
        let want: Vec<_> = (3..ram.len() / P).step_by(3).map(|p| (p, 1)).collect();
        assert!(want.len() > 3 * RUNS);
        assert_eq!(found, want);
        assert!(ram.discard(0, P, DiscardOp::DontNeed).unwrap().is_zeroed());
        let found = runs_in(&ram, 0, ram.len(), 2 << 20);
        assert_eq!(found, want);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: memfd_create, ioctl")]
    fn shared_memory_and_bad_ranges_are_refused() {
        let _one = one_at_a_time();
        let shared = GuestRam::new(4 << 20, BackingKind::Memfd).unwrap();
        let none = |_, _| panic!("no run of a refused scan");
        let shared_scan = |offset, len| shared.for_each_maybe_written(offset, len, P, none);
        assert_eq!(shared_scan(0, P), Err(ScanError::Backing));
        let ram = GuestRam::new(4 << 20, BackingKind::Anonymous { thp: false }).unwrap();
        for (offset, len) in [(0, 0), (1, P), (0, P + 1), (ram.len(), P), (usize::MAX, P)] {
            assert!(
                matches!(
                    ram.for_each_maybe_written(offset, len, P, none),
                    Err(ScanError::Range { .. })
                ),
                "{offset:#x}+{len:#x}"
            );
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: ioctl on /proc/self/pagemap, close")]
    fn a_kept_descriptor_the_program_closed_or_reused_is_replaced() {
        let (_one, mut ram) = page_seven_written();
        let kept = KEPT.load(Acquire);
        assert_ne!(kept, 0, "the first scan keeps its descriptor");
        // The program closes it (as a daemon closing every descriptor does)...
        // SAFETY: the test owns the kept descriptor; nothing else uses it meanwhile.
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(unpack(kept).1) });
        assert_eq!(runs(&ram, 0, ram.len()), vec![(7, 1)], "after a close");
        // ... and opens another file under its number.
        let kept = KEPT.load(Acquire);
        // SAFETY: as above.
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(unpack(kept).1) });
        let other = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(other.as_raw_fd(), unpack(kept).1, "the number reused");
        ram.write(9 * P, &[1]).unwrap();
        assert_eq!(
            runs(&ram, 0, ram.len()),
            vec![(7, 1), (9, 1)],
            "after a reuse"
        );
        assert_ne!(unpack(KEPT.load(Acquire)).1, other.as_raw_fd());
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: fork, ioctl on /proc/self/pagemap")]
    fn a_child_of_fork_reads_its_own_page_tables_not_its_parents() {
        // Scanned once here: the descriptor is kept in the parent.
        let (_one, mut ram) = page_seven_written();
        // SAFETY: the child only writes its copy of the RAM, scans (no allocation) and
        // leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // The child writes a page its parent did not: its own scan must see it.
            ram.write(5 * P, &[1]).unwrap();
            let mut found = [0usize; 4];
            let mut n = 0;
            let ok = ram
                .for_each_maybe_written(0, ram.len(), P, |o, len| {
                    if n < found.len() {
                        found[n] = o / P * 1000 + len / P;
                    }
                    n += 1;
                })
                .is_ok();
            let right = ok && n == 2 && found[..2] == [5001, 7001];
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(if right { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child scanned its parent's page tables (status {status:#x})"
        );
        assert_eq!(runs(&ram, 0, ram.len()), vec![(7, 1)], "the parent's own");
    }

    #[test]
    fn the_ioctl_number_is_the_kernels() {
        // `_IOWR('f', 16, struct pm_scan_arg)` with its 96 bytes, as the kernel defines it.
        assert_eq!(PmScanArg::SIZE, 96);
        assert_eq!(PAGEMAP_SCAN, 0xc060_6610);
    }
}
