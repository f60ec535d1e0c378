//! The real mappings behind a [`GuestRam`](super::GuestRam): private anonymous memory
//! aligned for THP, and shared mappings of a memfd (shmem or hugetlb).

use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use rustix::io::Errno;
use rustix::mm::{madvise, mmap, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};

use super::{os, BackingKind, HugePageSize, RamError};
use crate::resident::HugetlbPoolCounters;
use crate::PAGE_SIZE;

/// Creates a memfd of `size` bytes for `kind` (shmem, or hugetlb after checking that the
/// pool has enough free pages) and maps it shared.
pub(super) fn map_memfd(size: usize, kind: BackingKind) -> Result<(*mut u8, OwnedFd), RamError> {
    let page_size = kind.backing().page_size();
    let needed = (size / page_size) as u64;
    let mut flags = MemfdFlags::CLOEXEC;
    if let BackingKind::Hugetlb(hp) = kind {
        let pool = HugetlbPoolCounters::read(page_size)?;
        if pool.available() < needed {
            return Err(RamError::NoHugePages {
                page_size,
                needed,
                available: pool.available(),
            });
        }
        flags |= MemfdFlags::HUGETLB
            | match hp {
                HugePageSize::Size2M => MemfdFlags::HUGE_2MB,
                HugePageSize::Size1G => MemfdFlags::HUGE_1GB,
            };
    }
    let fd = memfd_create("zeronce-guest-ram", flags).map_err(os("memfd_create"))?;
    ftruncate(&fd, size as u64).map_err(os("ftruncate"))?;
    let p = map_shared(&fd, size).map_err(|errno| match (kind, errno) {
        // Raced with another user of the pool: same typed error.
        (BackingKind::Hugetlb(_), Errno::NOMEM) => RamError::NoHugePages {
            page_size,
            needed,
            available: 0,
        },
        _ => RamError::Os {
            call: "mmap",
            errno,
        },
    })?;
    Ok((p, fd))
}

/// Maps `size` bytes of `fd` shared, read-write, from offset 0.
pub(super) fn map_shared(fd: &OwnedFd, size: usize) -> Result<*mut u8, Errno> {
    let rw = ProtFlags::READ | ProtFlags::WRITE;
    // SAFETY: a new shared mapping at a kernel-chosen address aliases no Rust object.
    let p = unsafe { mmap(std::ptr::null_mut(), size, rw, MapFlags::SHARED, fd, 0) }?;
    Ok(p.cast::<u8>())
}

/// Maps `size` bytes of private anonymous memory aligned to `align` (a power of two, 2 MiB
/// at least, so THP can back it from the first byte), optionally with `MADV_HUGEPAGE`.
pub(super) fn map_anonymous_aligned(
    size: usize,
    thp: bool,
    align: usize,
) -> Result<*mut u8, RamError> {
    let rw = ProtFlags::READ | ProtFlags::WRITE;
    // Reserved with room to slide to the alignment; the ends are unmapped below.
    let padded = size.checked_add(align).ok_or(RamError::BadSize {
        size,
        page_size: PAGE_SIZE,
    })?;
    // No swap reserved up front (`MAP_NORESERVE`): a large range costs nothing until
    // touched, whatever the overcommit heuristic thinks of its size.
    let flags = MapFlags::PRIVATE | MapFlags::NORESERVE;
    // SAFETY: a new private mapping at a kernel-chosen address aliases no Rust object.
    let raw = unsafe { mmap_anonymous(std::ptr::null_mut(), padded, rw, flags) }
        .map_err(os("mmap"))?
        .cast::<u8>();
    let head = raw.align_offset(align);
    let tail = padded - head - size;
    // SAFETY: head and tail are page-aligned parts of the mapping we just made (the
    // kernel returns page-aligned addresses, and `size` is page-aligned), not used by
    // anything.
    unsafe {
        if head > 0 {
            munmap(raw.cast(), head).map_err(os("munmap"))?;
        }
        if tail > 0 {
            munmap(raw.add(head + size).cast(), tail).map_err(os("munmap"))?;
        }
    }
    let ptr = raw.wrapping_add(head);
    if thp {
        // SAFETY: advisory only, on our own new mapping; contents are unchanged.
        if let Err(errno) = unsafe { madvise(ptr.cast(), size, Advice::LinuxHugepage) } {
            tracing::debug!(%errno, "MADV_HUGEPAGE refused (THP disabled?)");
        }
    }
    Ok(ptr)
}

/// Unmaps a mapping made here.
///
/// # Safety
///
/// `ptr` and `len` are a whole mapping made by this module, owned by the caller, and no
/// reference into it is alive (`_align`: what the heap version needs).
pub(super) unsafe fn unmap(ptr: NonNull<u8>, len: usize, _align: usize) {
    // SAFETY: the caller's contract.
    if let Err(errno) = unsafe { munmap(ptr.as_ptr().cast(), len) } {
        tracing::warn!(%errno, "munmap of guest RAM failed");
    }
}
