//! Discard operations: giving a range of memory back to the kernel, and what each one
//! guarantees about the contents afterwards, per kind of backing (docs/ARCHITECTURE.md §5).
//!
//! | op | private anonymous | shared file (memfd, shmem) | hugetlb memfd |
//! |---|---|---|---|
//! | [`DiscardOp::DontNeed`] | freed, reads zero | frees nothing, contents survive | frees nothing |
//! | [`DiscardOp::PunchHole`] | unsupported | freed, reads zero | freed, reads zero (whole huge pages) |
//! | [`DiscardOp::Remove`] | unsupported | freed, reads zero | freed, reads zero (whole huge pages) |
//! | [`DiscardOp::Free`] | lazily freed, **may keep old data** | unsupported | unsupported |
//!
//! [`discard_raw`] is the single primitive that issues the system call; everything else
//! (`GuestRam::discard`, the balloon device's guest-memory bridge) goes through it.

use std::fmt;
use std::os::fd::BorrowedFd;

use rustix::fs::{fallocate, FallocateFlags};
use rustix::io::Errno;
use rustix::mm::{madvise, Advice};

pub use zeronce_types::{ZeroGuarantee, PAGE_SIZE};

/// A way of handing memory back to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiscardOp {
    /// `madvise(MADV_DONTNEED)`: drops the page-table entries. Private anonymous memory
    /// is freed and refaults as zero; on shared mappings the file keeps the pages.
    DontNeed,
    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)` on the backing file:
    /// frees the file's pages; later reads see zero.
    PunchHole,
    /// `madvise(MADV_REMOVE)`: punches a hole in the backing file through the mapping.
    Remove,
    /// `madvise(MADV_FREE)`: lazily freed under memory pressure only; until then the old
    /// contents survive, so it never guarantees zero.
    Free,
}

/// What kind of memory a mapping is, which decides what each [`DiscardOp`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// `MAP_PRIVATE | MAP_ANONYMOUS` memory (possibly THP-backed).
    PrivateAnonymous,
    /// A shared file mapping: memfd, shmem, tmpfs or any other `MAP_SHARED` file.
    SharedFile,
    /// A hugetlbfs file or `MFD_HUGETLB` memfd, mapped shared; discards work on whole
    /// huge pages of `page_size` bytes only.
    Hugetlb {
        /// Size of one huge page in bytes (2 MiB or 1 GiB on x86-64).
        page_size: usize,
    },
}

impl Backing {
    /// The granularity discards must respect: [`PAGE_SIZE`], or the huge page size.
    pub fn page_size(self) -> usize {
        match self {
            Backing::PrivateAnonymous | Backing::SharedFile => PAGE_SIZE,
            Backing::Hugetlb { page_size } => page_size,
        }
    }

    /// Whether discards of this backing act on a file (and so need its descriptor for
    /// [`DiscardOp::PunchHole`]).
    pub fn is_file(self) -> bool {
        !matches!(self, Backing::PrivateAnonymous)
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backing::PrivateAnonymous => f.write_str("private anonymous"),
            Backing::SharedFile => f.write_str("shared file"),
            Backing::Hugetlb { page_size } => write!(f, "hugetlb ({} KiB pages)", page_size / 1024),
        }
    }
}

impl fmt::Display for DiscardOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DiscardOp::DontNeed => "MADV_DONTNEED",
            DiscardOp::PunchHole => "fallocate(PUNCH_HOLE)",
            DiscardOp::Remove => "MADV_REMOVE",
            DiscardOp::Free => "MADV_FREE",
        })
    }
}

impl DiscardOp {
    /// Every op, in declaration order.
    pub const ALL: [DiscardOp; 4] = [
        DiscardOp::DontNeed,
        DiscardOp::PunchHole,
        DiscardOp::Remove,
        DiscardOp::Free,
    ];

    /// Whether, after this op succeeds on `backing`, the range is guaranteed to read zero
    /// AND its memory is really returned. `DontNeed`: only for private anonymous memory
    /// (on shared mappings it frees nothing). `PunchHole` / `Remove`: for shared files and
    /// hugetlb, not for private anonymous memory (where they fail). `Free`: never (lazily
    /// freed, old contents may survive).
    pub fn guarantees_zero(self, backing: Backing) -> bool {
        match self {
            DiscardOp::DontNeed => backing == Backing::PrivateAnonymous,
            DiscardOp::PunchHole | DiscardOp::Remove => backing.is_file(),
            DiscardOp::Free => false,
        }
    }

    /// The op that returns memory with a zero guarantee for `backing`: `DontNeed` for
    /// private anonymous memory, `PunchHole` for shared files and hugetlb.
    pub fn best_for(backing: Backing) -> DiscardOp {
        match backing {
            Backing::PrivateAnonymous => DiscardOp::DontNeed,
            Backing::SharedFile | Backing::Hugetlb { .. } => DiscardOp::PunchHole,
        }
    }

    /// Whether the kernel accepts this op on `backing` at all (otherwise `discard_raw`
    /// returns [`DiscardError::Unsupported`] without a system call).
    pub fn supported_on(self, backing: Backing) -> bool {
        match self {
            DiscardOp::DontNeed => true,
            DiscardOp::PunchHole | DiscardOp::Remove => backing.is_file(),
            DiscardOp::Free => backing == Backing::PrivateAnonymous,
        }
    }
}

impl DiscardOp {
    /// [`DiscardOp::guarantees_zero`] as a [`ZeroGuarantee`].
    pub(crate) fn zero_guarantee(self, backing: Backing) -> ZeroGuarantee {
        if self.guarantees_zero(backing) {
            ZeroGuarantee::Zeroed
        } else {
            ZeroGuarantee::NotZeroed
        }
    }
}

/// Why a discard was refused or failed. The memory is untouched on every variant except
/// [`DiscardError::Os`], where the kernel may have acted on a prefix of the range.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiscardError {
    /// The range is empty.
    #[error("empty discard range at {addr:#x}")]
    Empty {
        /// Start of the range (address or offset).
        addr: usize,
    },
    /// Start or length is not a multiple of the backing's page size.
    #[error("discard range {addr:#x}+{len:#x} is not aligned to {page_size:#x}-byte pages")]
    Unaligned {
        /// Start of the range (address or offset).
        addr: usize,
        /// Length of the range.
        len: usize,
        /// The required alignment.
        page_size: usize,
    },
    /// The range overflows, or does not lie inside the mapping.
    #[error("discard range {start:#x}+{len:#x} is outside 0..{limit:#x}")]
    OutOfRange {
        /// Start of the range (address or offset).
        start: usize,
        /// Length of the range.
        len: usize,
        /// End of the valid space (`usize::MAX` for an address overflow).
        limit: usize,
    },
    /// The huge page size of a [`Backing::Hugetlb`] is not a power of two ≥ [`PAGE_SIZE`].
    #[error("invalid huge page size {page_size:#x}")]
    BadPageSize {
        /// The rejected page size.
        page_size: usize,
    },
    /// The kernel does not support this op on this backing.
    #[error("{op} is not supported on {backing} memory")]
    Unsupported {
        /// The op.
        op: DiscardOp,
        /// The backing.
        backing: Backing,
    },
    /// The op needs the backing file descriptor and none was given.
    #[error("{op} needs the backing file descriptor")]
    MissingFile {
        /// The op.
        op: DiscardOp,
    },
    /// The system call failed.
    #[error("{op} failed: {errno}")]
    Os {
        /// The op.
        op: DiscardOp,
        /// The error the kernel returned.
        errno: Errno,
    },
}

/// Checks `start`/`len` against `backing`'s page size: non-empty, aligned, no overflow.
/// Shared by [`discard_raw`] (addresses) and range checks on offsets.
pub(crate) fn check_range(start: usize, len: usize, backing: Backing) -> Result<(), DiscardError> {
    let page_size = backing.page_size();
    if !page_size.is_power_of_two() || page_size < PAGE_SIZE {
        return Err(DiscardError::BadPageSize { page_size });
    }
    if len == 0 {
        return Err(DiscardError::Empty { addr: start });
    }
    if !start.is_multiple_of(page_size) || !len.is_multiple_of(page_size) {
        return Err(DiscardError::Unaligned {
            addr: start,
            len,
            page_size,
        });
    }
    if start.checked_add(len).is_none() {
        return Err(DiscardError::OutOfRange {
            start,
            len,
            limit: usize::MAX,
        });
    }
    Ok(())
}

/// Discards `[addr, addr + len)` with `op`. The single raw primitive everything else
/// calls (`GuestRam::discard` and the balloon's vm-memory bridge).
///
/// Checks, before any system call: `len > 0`; `addr` and `len` are multiples of the
/// backing's page size (whole huge pages for [`Backing::Hugetlb`]); no overflow of the
/// address or file-offset range; `op` is supported on `backing`; `file` is given for
/// [`DiscardOp::PunchHole`]. Whether the range reads zero afterwards is
/// [`DiscardOp::guarantees_zero`].
///
/// # Safety
///
/// `[addr, addr + len)` must lie inside a live mapping owned by the caller, of the kind
/// `backing` says, whose contents no Rust reference currently borrows (guest memory is
/// accessed only through raw pointers). `file` = the fd backing that mapping and the file
/// offset of `addr` (needed for `PunchHole`, which acts on the file).
pub(crate) unsafe fn discard_raw(
    addr: *mut u8,
    len: usize,
    op: DiscardOp,
    backing: Backing,
    file: Option<(BorrowedFd<'_>, u64)>,
) -> Result<(), DiscardError> {
    check_range(addr as usize, len, backing)?;
    if !op.supported_on(backing) {
        return Err(DiscardError::Unsupported { op, backing });
    }
    let os = |errno| DiscardError::Os { op, errno };
    let advice = match op {
        DiscardOp::DontNeed => Advice::LinuxDontNeed,
        DiscardOp::Remove => Advice::LinuxRemove,
        DiscardOp::Free => Advice::LinuxFree,
        DiscardOp::PunchHole => {
            let (fd, offset) = file.ok_or(DiscardError::MissingFile { op })?;
            let overflow = DiscardError::OutOfRange {
                start: addr as usize,
                len,
                limit: usize::MAX,
            };
            let len64 = u64::try_from(len).map_err(|_| overflow.clone())?;
            // fallocate takes signed 64-bit offsets: the end must fit in i64.
            match offset.checked_add(len64) {
                Some(end) if end <= i64::MAX as u64 => {}
                _ => return Err(overflow),
            }
            let ps = backing.page_size() as u64;
            if !offset.is_multiple_of(ps) {
                return Err(DiscardError::Unaligned {
                    addr: usize::try_from(offset).unwrap_or(usize::MAX),
                    len,
                    page_size: backing.page_size(),
                });
            }
            let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            return fallocate(fd, mode, offset, len64).map_err(os);
        }
    };
    // SAFETY: the caller guarantees the range is inside a live mapping it owns and that
    // no Rust reference borrows its contents, so the kernel changing what the pages read
    // (zero after DONTNEED/REMOVE, possibly zero after FREE) invalidates no reference.
    // The range was checked to be non-empty, page-aligned and non-overflowing above.
    unsafe { madvise(addr.cast(), len, advice) }.map_err(os)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::mm::{mmap_anonymous, munmap, MapFlags, ProtFlags};

    const HUGE_2M: Backing = Backing::Hugetlb { page_size: 2 << 20 };

    #[test]
    fn zero_guarantee_table() {
        use Backing::*;
        use DiscardOp::*;
        assert!(DontNeed.guarantees_zero(PrivateAnonymous));
        assert!(!DontNeed.guarantees_zero(SharedFile));
        assert!(!DontNeed.guarantees_zero(HUGE_2M));
        for op in [PunchHole, Remove] {
            assert!(!op.guarantees_zero(PrivateAnonymous));
            assert!(op.guarantees_zero(SharedFile));
            assert!(op.guarantees_zero(HUGE_2M));
        }
        for b in [PrivateAnonymous, SharedFile, HUGE_2M] {
            assert!(!Free.guarantees_zero(b));
            let best = DiscardOp::best_for(b);
            assert!(best.guarantees_zero(b) && best.supported_on(b), "{b}");
            // A zero guarantee implies the op is supported.
            for op in DiscardOp::ALL {
                assert!(!op.guarantees_zero(b) || op.supported_on(b), "{op} {b}");
            }
        }
        assert_eq!(DiscardOp::best_for(PrivateAnonymous), DontNeed);
        assert_eq!(DiscardOp::best_for(SharedFile), PunchHole);
        assert_eq!(DiscardOp::best_for(HUGE_2M), PunchHole);
    }

    #[test]
    fn range_checks() {
        let anon = Backing::PrivateAnonymous;
        assert_eq!(check_range(0x1000, 0x2000, anon), Ok(()));
        assert_eq!(
            check_range(0x1000, 0, anon),
            Err(DiscardError::Empty { addr: 0x1000 })
        );
        assert!(matches!(
            check_range(0x1001, 0x1000, anon),
            Err(DiscardError::Unaligned { .. })
        ));
        assert!(matches!(
            check_range(0x1000, 0x1800, anon),
            Err(DiscardError::Unaligned { .. })
        ));
        // Hugetlb: whole huge pages only.
        assert!(matches!(
            check_range(0x20_0000, 0x1000, HUGE_2M),
            Err(DiscardError::Unaligned {
                page_size: 0x20_0000,
                ..
            })
        ));
        assert_eq!(check_range(0x40_0000, 0x20_0000, HUGE_2M), Ok(()));
        assert!(matches!(
            check_range(usize::MAX - 0xfff, 0x2000, anon),
            Err(DiscardError::OutOfRange { .. })
        ));
        assert_eq!(
            check_range(0, 0x1000, Backing::Hugetlb { page_size: 3000 }),
            Err(DiscardError::BadPageSize { page_size: 3000 })
        );
    }

    /// A private anonymous test mapping of `pages` pages, filled with `byte`.
    struct Anon(*mut u8, usize);
    impl Anon {
        fn new(pages: usize, byte: u8) -> Anon {
            let len = pages * PAGE_SIZE;
            // SAFETY: a fresh mapping at a kernel-chosen address aliases nothing.
            let p = unsafe {
                mmap_anonymous(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE,
                )
            }
            .expect("mmap");
            // SAFETY: `p` is a fresh writable mapping of `len` bytes.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), byte, len) };
            Anon(p.cast(), len)
        }
        fn byte(&self, i: usize) -> u8 {
            assert!(i < self.1);
            // SAFETY: in bounds of the live mapping; no reference to it exists.
            unsafe { self.0.add(i).read() }
        }
    }
    impl Drop for Anon {
        fn drop(&mut self) {
            // SAFETY: we own the mapping; nothing refers to it any more.
            let _ = unsafe { munmap(self.0.cast(), self.1) };
        }
    }

    #[test]
    fn refused_ops_leave_memory_untouched() {
        let m = Anon::new(4, 0xab);
        let anon = Backing::PrivateAnonymous;
        let cases: [(usize, usize, DiscardOp, DiscardError); 4] = [
            (0, 0, DiscardOp::DontNeed, DiscardError::Empty { addr: 0 }),
            (
                1,
                PAGE_SIZE,
                DiscardOp::DontNeed,
                DiscardError::Unaligned {
                    addr: m.0 as usize + 1,
                    len: PAGE_SIZE,
                    page_size: PAGE_SIZE,
                },
            ),
            (
                0,
                PAGE_SIZE,
                DiscardOp::PunchHole,
                DiscardError::Unsupported {
                    op: DiscardOp::PunchHole,
                    backing: anon,
                },
            ),
            (
                0,
                PAGE_SIZE,
                DiscardOp::Remove,
                DiscardError::Unsupported {
                    op: DiscardOp::Remove,
                    backing: anon,
                },
            ),
        ];
        for (off, len, op, want) in cases {
            // SAFETY: the range is inside `m` (or rejected before any syscall), and no
            // reference to its contents exists.
            let got = unsafe { discard_raw(m.0.add(off), len, op, anon, None) };
            let want = match want {
                DiscardError::Empty { .. } => DiscardError::Empty {
                    addr: m.0 as usize + off,
                },
                w => w,
            };
            assert_eq!(got, Err(want));
        }
        for i in (0..m.1).step_by(512) {
            assert_eq!(m.byte(i), 0xab);
        }
    }

    #[test]
    fn punch_hole_needs_a_file() {
        let m = Anon::new(1, 1);
        // SAFETY: rejected before any syscall (no fd), memory untouched.
        let got = unsafe {
            discard_raw(
                m.0,
                PAGE_SIZE,
                DiscardOp::PunchHole,
                Backing::SharedFile,
                None,
            )
        };
        assert_eq!(
            got,
            Err(DiscardError::MissingFile {
                op: DiscardOp::PunchHole
            })
        );
        assert_eq!(m.byte(0), 1);
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: madvise")]
    fn dontneed_on_anonymous_reads_zero_only_in_range() {
        let m = Anon::new(3, 0x5a);
        // SAFETY: the middle page lies inside `m`, which no reference borrows.
        unsafe {
            discard_raw(
                m.0.add(PAGE_SIZE),
                PAGE_SIZE,
                DiscardOp::DontNeed,
                Backing::PrivateAnonymous,
                None,
            )
        }
        .expect("madvise");
        for i in 0..PAGE_SIZE {
            assert_eq!(m.byte(i), 0x5a);
            assert_eq!(m.byte(PAGE_SIZE + i), 0);
            assert_eq!(m.byte(2 * PAGE_SIZE + i), 0x5a);
        }
    }
}
