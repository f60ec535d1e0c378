//! Under Miri, which cannot make real mappings: the memory behind a
//! [`GuestRam`](super::GuestRam) comes from the global allocator, aligned as a mapping
//! would be and
//! reading zero like fresh anonymous memory, so Miri checks every access the wrappers
//! make. File-backed kinds need `memfd_create` and are refused as unsupported (`ENOSYS`);
//! so are discards and residency queries, which are system calls on the real mapping.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use rustix::io::Errno;

use super::{BackingKind, RamError};

/// The layout of a heap "mapping" of `size` bytes aligned to `align`.
fn layout(size: usize, align: usize) -> Result<Layout, RamError> {
    Layout::from_size_align(size, align).map_err(|_| RamError::Os {
        call: "alloc",
        errno: Errno::NOMEM,
    })
}

/// `size` zeroed heap bytes, aligned as a mapping (the `thp` advice has nothing to act on).
pub(super) fn map_anonymous_aligned(
    size: usize,
    _thp: bool,
    align: usize,
) -> Result<*mut u8, RamError> {
    // SAFETY: `size` is non-zero (`GuestRam::new` refuses 0), so the layout is valid for
    // `alloc_zeroed`; a null result is turned into an error by the caller.
    Ok(unsafe { alloc_zeroed(layout(size, align)?) })
}

/// Refused: a memfd needs `memfd_create`.
pub(super) fn map_memfd(_size: usize, _kind: BackingKind) -> Result<(*mut u8, OwnedFd), RamError> {
    Err(RamError::Os {
        call: "memfd_create",
        errno: Errno::NOSYS,
    })
}

/// Refused: a shared file mapping needs `mmap`.
pub(super) fn map_shared(_fd: &OwnedFd, _size: usize) -> Result<*mut u8, Errno> {
    Err(Errno::NOSYS)
}

/// Frees a heap "mapping" made by [`map_anonymous_aligned`].
///
/// # Safety
///
/// `ptr` and `len` come from one [`map_anonymous_aligned`] call, owned by the caller, and
/// no reference into it is alive.
pub(super) unsafe fn unmap(ptr: NonNull<u8>, len: usize, align: usize) {
    let layout = layout(len, align).expect("the layout it was allocated with");
    // SAFETY: the caller's contract; `layout` is the one `map_anonymous_aligned` used.
    unsafe { dealloc(ptr.as_ptr(), layout) }
}
