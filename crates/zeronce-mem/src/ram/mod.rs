//! [`GuestRam`]: one contiguous mapping of "guest RAM", backed by private anonymous
//! memory (with THP), a shared memfd, or a hugetlb memfd.
//!
//! # Soundness
//!
//! A `GuestRam` owns its mapping exclusively, like a `Box<[u8]>`. Every operation that
//! changes the contents — writes, zeroing, and discards (the kernel changing what the
//! pages read) — takes `&mut self`, so no `&[u8]` handed out by [`GuestRam::as_slice`] can
//! be alive across it: the borrow checker enforces what the kernel's side effects need.
//! Internally, byte slices over the mapping are created only for the duration of one
//! method call. Sharing a `GuestRam` between threads (`&GuestRam`) therefore only allows
//! concurrent reads. Memory that has never been touched reads zero (anonymous zero page,
//! or a file hole), so a slice over it is always initialised.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use rustix::io::Errno;
use rustix::mm::{madvise, Advice};

use mapping::{map_anonymous_aligned, map_memfd, map_shared, unmap};

use crate::discard::{check_range, discard_raw, Backing, DiscardError, DiscardOp, ZeroGuarantee};
use crate::resident::{file_allocated_bytes, resident_bytes, ResidentError};
use crate::scan::{self, ScanError};
use crate::zeroing::{zero_range_hinted, ZeroKernel};
use crate::PAGE_SIZE;

pub(crate) use zeronce_types::{HUGE_PAGE_1G, HUGE_PAGE_2M};

/// A hugetlb page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HugePageSize {
    /// 2 MiB pages.
    Size2M,
    /// 1 GiB pages.
    Size1G,
}

impl HugePageSize {
    /// The size in bytes.
    pub fn bytes(self) -> usize {
        match self {
            HugePageSize::Size2M => HUGE_PAGE_2M,
            HugePageSize::Size1G => HUGE_PAGE_1G,
        }
    }
}

/// What to back a [`GuestRam`] with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackingKind {
    /// Private anonymous memory, 2 MiB aligned; `thp` asks for transparent huge pages
    /// (`MADV_HUGEPAGE`).
    Anonymous {
        /// Whether to `madvise(MADV_HUGEPAGE)` the mapping.
        thp: bool,
    },
    /// A shared mapping of a memfd (shmem), `MFD_CLOEXEC`.
    Memfd,
    /// A shared mapping of a hugetlb memfd (`MFD_HUGETLB`); needs reserved huge pages.
    Hugetlb(HugePageSize),
}

impl BackingKind {
    /// The [`Backing`] (discard semantics) of this kind.
    pub fn backing(self) -> Backing {
        match self {
            BackingKind::Anonymous { .. } => Backing::PrivateAnonymous,
            BackingKind::Memfd => Backing::SharedFile,
            BackingKind::Hugetlb(size) => Backing::Hugetlb {
                page_size: size.bytes(),
            },
        }
    }
}

/// Why a [`GuestRam`] could not be created.
#[derive(Debug, thiserror::Error)]
pub enum RamError {
    /// The size is zero or not a multiple of the backing's page size.
    #[error("guest RAM size {size:#x} is not a positive multiple of {page_size:#x}")]
    BadSize {
        /// Requested size.
        size: usize,
        /// Required granularity.
        page_size: usize,
    },
    /// Not enough huge pages are reserved (`/proc/sys/vm/nr_hugepages` or
    /// `/sys/kernel/mm/hugepages/hugepages-<N>kB/nr_hugepages`).
    #[error(
        "need {needed} free {}-KiB huge pages, {available} available: reserve some with \
         `echo N > /sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages`",
        page_size / 1024, page_size / 1024
    )]
    NoHugePages {
        /// Huge page size.
        page_size: usize,
        /// Pages the mapping needs.
        needed: u64,
        /// Pages free and unreserved.
        available: u64,
    },
    /// The hugetlb pool could not be read (no hugetlb support for this size).
    #[error("hugetlb pool unavailable: {0}")]
    HugetlbPool(#[from] ResidentError),
    /// A system call failed.
    #[error("{call} failed: {errno}")]
    Os {
        /// The system call.
        call: &'static str,
        /// The error the kernel returned.
        errno: Errno,
    },
}

/// A byte range that does not lie inside the [`GuestRam`].
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
#[error("range {offset:#x}+{len:#x} is outside guest RAM of {size:#x} bytes")]
pub struct RangeError {
    /// Start offset.
    pub offset: usize,
    /// Length.
    pub len: usize,
    /// Size of the guest RAM.
    pub size: usize,
}

/// A contiguous mapping of guest RAM. See the module docs for why its API is sound.
#[derive(Debug)]
pub struct GuestRam {
    ptr: NonNull<u8>,
    len: usize,
    /// The alignment the mapping was made with (what unmapping it needs under Miri).
    align: usize,
    kind: BackingKind,
    fd: Option<OwnedFd>,
}

// SAFETY: `GuestRam` owns its mapping exclusively (like `Box<[u8]>`); contents change
// only through `&mut self`, so `&GuestRam` on several threads only permits concurrent
// reads, and moving it to another thread moves that ownership. `OwnedFd` is Send + Sync.
unsafe impl Send for GuestRam {}
// SAFETY: see `Send` above.
unsafe impl Sync for GuestRam {}

/// Makes and removes the memory behind a `GuestRam`: real mappings (`mmap`, memfd),
/// or, under Miri, which cannot make them, heap allocations with the same alignment that
/// read zero, so the unsafe code over them can be checked.
#[cfg(not(miri))]
mod mapping;
#[cfg(miri)]
#[path = "heap.rs"]
mod mapping;

fn os(call: &'static str) -> impl Fn(Errno) -> RamError {
    move |errno| RamError::Os { call, errno }
}

impl GuestRam {
    /// Maps `size` bytes of guest RAM backed as `kind`. `size` must be a positive multiple
    /// of the backing's page size ([`PAGE_SIZE`], or the huge page size for hugetlb).
    /// Anonymous RAM starts on a 2 MiB boundary (so THP backs it from the first byte).
    pub fn new(size: usize, kind: BackingKind) -> Result<GuestRam, RamError> {
        Self::new_aligned(size, kind, HUGE_PAGE_2M)
    }

    /// [`GuestRam::new`], anonymous RAM starting at a multiple of `align` (rounded up to a
    /// power of two, at least 2 MiB): an allocator whose largest block is `align` bytes
    /// then has every block aligned to its size in the address space too. A file-backed
    /// RAM is where the kernel maps it (aligned to its page size).
    pub fn new_aligned(size: usize, kind: BackingKind, align: usize) -> Result<GuestRam, RamError> {
        let page_size = kind.backing().page_size();
        let bad_size = RamError::BadSize { size, page_size };
        if size == 0 || !size.is_multiple_of(page_size) {
            return Err(bad_size);
        }
        let align = align
            .max(HUGE_PAGE_2M)
            .checked_next_power_of_two()
            .ok_or(bad_size)?;
        let (ptr, fd) = match kind {
            BackingKind::Anonymous { thp } => (map_anonymous_aligned(size, thp, align)?, None),
            BackingKind::Memfd | BackingKind::Hugetlb(_) => {
                let (ptr, fd) = map_memfd(size, kind)?;
                (ptr, Some(fd))
            }
        };
        Self::from_mapping(ptr, size, align, kind, fd)
    }

    /// Wraps a new mapping of ours.
    fn from_mapping(
        ptr: *mut u8,
        len: usize,
        align: usize,
        kind: BackingKind,
        fd: Option<OwnedFd>,
    ) -> Result<GuestRam, RamError> {
        let ptr = NonNull::new(ptr).ok_or(RamError::Os {
            call: "mmap",
            errno: Errno::NOMEM,
        })?;
        Ok(GuestRam {
            ptr,
            len,
            align,
            kind,
            fd,
        })
    }

    /// Maps all of an existing file shared (`MAP_SHARED`, from offset 0), e.g. a file on
    /// a hugetlbfs mount (`kind` = [`BackingKind::Hugetlb`]) or a memfd. The mapping takes
    /// ownership of `file`; pages already allocated by the file are not touched.
    ///
    /// The file may be mapped elsewhere too (that is what it is for). The guarantees of
    /// the module docs then hold only as long as no other mapping writes it while this
    /// one is alive: a caller shares such files by protocol (a pool hands a file to one
    /// client at a time and maps it only while no client holds it).
    pub fn map_file(file: OwnedFd, kind: BackingKind) -> Result<GuestRam, RamError> {
        let page_size = kind.backing().page_size();
        if matches!(kind, BackingKind::Anonymous { .. }) {
            return Err(RamError::Os {
                call: "mmap (anonymous kind for a file)",
                errno: Errno::INVAL,
            });
        }
        let size = rustix::fs::fstat(&file).map_err(os("fstat"))?.st_size;
        let size = usize::try_from(size).unwrap_or(0);
        if size == 0 || !size.is_multiple_of(page_size) {
            return Err(RamError::BadSize { size, page_size });
        }
        // Other mappings of the file are the caller's protocol (see the docs above).
        let p = map_shared(&file, size).map_err(os("mmap"))?;
        Self::from_mapping(p, size, page_size, kind, Some(file))
    }

    /// Faults `[offset, offset + len)` in for writing without writing a byte
    /// (`MADV_POPULATE_WRITE`, Linux 5.14): what a VMM's memory preallocation does. For a
    /// file the kernel allocates (and zeroes) the missing pages.
    ///
    /// Takes `&self`: no byte changes what it reads, so threads may populate disjoint
    /// (or overlapping) parts at once, as a VMM's preallocation threads do.
    pub fn populate_write(&self, offset: usize, len: usize) -> Result<(), RamError> {
        let r = self.check(offset, len).map_err(|_| RamError::BadSize {
            size: len,
            page_size: self.backing().page_size(),
        })?;
        // SAFETY: the range is inside our live mapping; populating changes no contents
        // (missing pages appear zero-filled, which is what they read already).
        unsafe {
            madvise(
                self.ptr.as_ptr().add(r.start).cast(),
                len,
                Advice::LinuxPopulateWrite,
            )
        }
        .map_err(os("madvise(MADV_POPULATE_WRITE)"))
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a `GuestRam` is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What it was created as.
    pub fn kind(&self) -> BackingKind {
        self.kind
    }

    /// Its discard semantics.
    pub fn backing(&self) -> Backing {
        self.kind.backing()
    }

    /// The backing memfd (file offset 0 = offset 0 of the mapping), if file-backed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// The start of the mapping, for benchmarks and bridges. Writing through it while a
    /// slice from [`GuestRam::as_slice`] is alive is undefined behaviour.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The whole mapping as bytes. Discards need `&mut self`, so they cannot happen while
    /// this borrow lives. Reading faults pages in (anonymous: the shared zero page).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live for `self`'s lifetime, `len` bytes, readable, and
        // always initialised (untouched pages read zero); it is mutated only through
        // `&mut self`, which cannot coexist with this shared borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole mapping as mutable bytes (unique borrow: no discard while it lives).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` makes this borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Checks that `[offset, offset + len)` lies inside; returns it as a `Range`.
    pub fn check(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>, RangeError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(offset..end),
            _ => Err(RangeError {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copies `buf.len()` bytes from `offset` into `buf`.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), RangeError> {
        let r = self.check(offset, buf.len())?;
        buf.copy_from_slice(&self.as_slice()[r]);
        Ok(())
    }

    /// Copies `data` to `offset`.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), RangeError> {
        let r = self.check(offset, data.len())?;
        self.as_mut_slice()[r].copy_from_slice(data);
        Ok(())
    }

    /// Sets `len` bytes from `offset` to `byte`.
    pub fn fill(&mut self, offset: usize, len: usize, byte: u8) -> Result<(), RangeError> {
        let r = self.check(offset, len)?;
        self.as_mut_slice()[r].fill(byte);
        Ok(())
    }

    /// Whether `len` bytes from `offset` all read zero (word-at-a-time, early exit per
    /// page). Reading faults untouched pages in (without allocating for anonymous memory).
    pub fn is_zero(&self, offset: usize, len: usize) -> Result<bool, RangeError> {
        let r = self.check(offset, len)?;
        Ok(bytes_are_zero(&self.as_slice()[r]))
    }

    /// Faults `[offset, offset + len)` in for writing without changing its contents, one
    /// byte every `stride` bytes (a `stride` of 0 means [`PAGE_SIZE`]); see
    /// `touch_for_write`.
    pub fn touch(&mut self, offset: usize, len: usize, stride: usize) -> Result<(), RangeError> {
        let r = self.check(offset, len)?;
        touch_for_write(&mut self.as_mut_slice()[r], stride);
        Ok(())
    }

    /// Zeroes `len` bytes from `offset` with [`ZeroKernel::auto`]; the page holding
    /// `hint_offset` (an offset into the RAM, ignored if outside the range) is zeroed last,
    /// cache-friendly, so it is hot. Returns the kernel used.
    pub fn zero(
        &mut self,
        offset: usize,
        len: usize,
        hint_offset: Option<usize>,
    ) -> Result<ZeroKernel, RangeError> {
        let kernel = ZeroKernel::auto(len);
        self.zero_with(offset, len, kernel, hint_offset)?;
        Ok(kernel)
    }

    /// As [`GuestRam::zero`] with an explicit kernel (an unavailable one falls back to
    /// `write_bytes`).
    pub fn zero_with(
        &mut self,
        offset: usize,
        len: usize,
        kernel: ZeroKernel,
        hint_offset: Option<usize>,
    ) -> Result<(), RangeError> {
        let r = self.check(offset, len)?;
        let hint = hint_offset.and_then(|h| h.checked_sub(offset));
        // SAFETY: the range is inside the live, writable mapping; `&mut self` guarantees
        // no reference to its contents is alive during the call.
        unsafe { zero_range_hinted(self.ptr.as_ptr().add(r.start), len, kernel, hint) };
        Ok(())
    }

    /// Discards `len` bytes from `offset` with `op` (page-aligned, whole huge pages for
    /// hugetlb) and says whether the range now reads zero. On error the memory is
    /// untouched, except for [`DiscardError::Os`].
    pub fn discard(
        &mut self,
        offset: usize,
        len: usize,
        op: DiscardOp,
    ) -> Result<ZeroGuarantee, DiscardError> {
        let backing = self.backing();
        check_range(offset, len, backing)?;
        let r = self
            .check(offset, len)
            .map_err(|e| DiscardError::OutOfRange {
                start: e.offset,
                len: e.len,
                limit: e.size,
            })?;
        let file = self.fd().map(|fd| (fd, r.start as u64));
        // SAFETY: the range is inside our live mapping (checked above) of kind `backing`,
        // at file offset `r.start` of `fd`; `&mut self` guarantees no Rust reference to
        // the contents is alive while the kernel changes them.
        unsafe { discard_raw(self.ptr.as_ptr().add(r.start), len, op, backing, file) }?;
        Ok(op.zero_guarantee(backing))
    }

    /// Bytes of the range resident in memory (`mincore`; for memfd: held by the file).
    pub fn resident_bytes(&self, offset: usize, len: usize) -> Result<usize, ResidentError> {
        let r = self.check(offset, len).map_err(|_| ResidentError::Os {
            call: "mincore",
            errno: Errno::NOMEM,
        })?;
        // `r.start <= self.len`, so the pointer stays inside or one past the mapping.
        resident_bytes(self.ptr.as_ptr().wrapping_add(r.start), len)
    }

    /// Bytes the backing file has allocated (`None` for anonymous memory).
    pub fn file_allocated_bytes(&self) -> Option<Result<u64, ResidentError>> {
        self.fd().map(file_allocated_bytes)
    }

    /// Calls `f` with the offset and length of each run of pages of `[offset, offset +
    /// len)` (page aligned) that may not read zero, in address order: every page outside
    /// those runs reads zero (never touched, discarded, or only read: the kernel's zero
    /// page). From the page tables (`PAGEMAP_SCAN`, Linux 6.7+), no byte read. A piece of
    /// `granule` bytes whose first page may hold data is one run whole, its other pages
    /// not looked at (one entry read, not all). Private anonymous memory only
    /// ([`ScanError::Backing`] otherwise). On an error `f` may have seen the runs of a
    /// first part of the range; those are right.
    pub fn for_each_maybe_written(
        &self,
        offset: usize,
        len: usize,
        granule: usize,
        mut f: impl FnMut(usize, usize),
    ) -> Result<(), ScanError> {
        if !matches!(self.kind, BackingKind::Anonymous { .. }) {
            return Err(ScanError::Backing);
        }
        let r = self
            .check(offset, len)
            .map_err(|_| ScanError::Range { offset, len })?;
        let base = self.ptr.as_ptr() as usize;
        scan::for_each_maybe_written(base + r.start, len, granule, |addr, n| f(addr - base, n))
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        // SAFETY: we own the mapping of `len` bytes at `ptr`, made by `mapping`; `&mut
        // self` means no reference into it survives. The fd closes after (the mapping
        // keeps the file).
        unsafe { unmap(self.ptr, self.len, self.align) };
    }
}

/// Faults `bytes` in for writing, one byte every `stride` bytes (0 means [`PAGE_SIZE`]),
/// without changing contents: a compare-and-exchange of 0 with 0, which the CPU performs
/// as a write access whatever the byte holds. A read followed by a write of the same byte
/// would fault an untouched 4 KiB page twice (the read maps the shared zero page, the
/// write replaces it), and a compiler may fold an idempotent read-modify-write such as
/// `fetch_or(0)` into a plain load.
pub(crate) fn touch_for_write(bytes: &mut [u8], stride: usize) {
    let stride = if stride == 0 { PAGE_SIZE } else { stride };
    for i in (0..bytes.len()).step_by(stride) {
        let p: *mut u8 = &mut bytes[i];
        // SAFETY: `p` comes from a live `&mut u8` (valid, aligned for `AtomicU8`), and no
        // other access to that byte happens while the atomic exists.
        let byte = unsafe { AtomicU8::from_ptr(p) };
        // Either outcome leaves the byte as it was.
        let _ = byte.compare_exchange(0, 0, Relaxed, Relaxed);
    }
}

/// Whether every byte of `bytes` is zero: ORs 64-byte blocks word by word (vectorised),
/// checking once per page so a nonzero page stops the scan early.
pub(crate) fn bytes_are_zero(bytes: &[u8]) -> bool {
    let mut pages = bytes.chunks(PAGE_SIZE);
    pages.all(|page| {
        let mut words = page.chunks_exact(8);
        let acc = words.by_ref().fold(0u64, |a, w| {
            a | u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])
        });
        acc == 0 && words.remainder().iter().all(|&b| b == 0)
    })
}

#[cfg(test)]
mod tests;
