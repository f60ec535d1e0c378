//! mimalloc's blocks, as the C calls hand them out and take them back: the free mark that
//! tells a double free (see [`crate::routes`]), and the thread caches ([`super::cache`])
//! in front of mimalloc for blocks one thread frees for another.

use std::ffi::c_void;

use libmimalloc_sys as mi;

use super::{cache, or_enomem};
use crate::routes::ROUTES;
use crate::stderr::bad_pointer;

/// What mimalloc's plain calls give a block of at least this size.
const MI_ALIGN: usize = 16;
/// The least a mimalloc block handed out here holds: two words, the second its free mark
/// while it is free (see [`crate::routes`]). (glibc's least is 24 bytes.)
pub(super) const SMALL_MIN: usize = 16;

/// A mimalloc block of `size` bytes aligned to `align` (a power of two), zeroed if
/// `zeroed` (or `NULL` and `ENOMEM`).
pub(super) fn small_alloc(size: usize, align: usize, zeroed: bool) -> *mut c_void {
    let size = size.max(SMALL_MIN);
    let natural = align <= 8 || (align <= MI_ALIGN && size >= MI_ALIGN);
    // mimalloc's allocation functions take any size and a power-of-two alignment and
    // return a block or NULL.
    let p = match (natural, zeroed) {
        (true, false) => return small_malloc(size),
        // SAFETY: as above.
        (true, true) => unsafe { mi::mi_zalloc(size) },
        // SAFETY: as above.
        (false, false) => unsafe { mi::mi_malloc_aligned(size, align) },
        // SAFETY: as above.
        (false, true) => unsafe { mi::mi_zalloc_aligned(size, align) },
    };
    or_enomem(if zeroed { p } else { unmarked(p) })
}

/// C `malloc` of a small size: a block of at least `size` bytes at `malloc`'s alignment,
/// not zeroed, live (or `NULL` and `ENOMEM`): a freed one from the thread caches, else
/// mimalloc's.
#[inline(always)]
pub(super) fn small_malloc(size: usize) -> *mut c_void {
    let size = size.max(SMALL_MIN);
    let mut p = cache::take(size);
    if p.is_null() {
        // SAFETY: mimalloc's `malloc` takes any size and returns a block or NULL.
        p = unsafe { mi::mi_malloc(size) };
    }
    or_enomem(unmarked(p))
}

/// A new mimalloc block (or `NULL`) of at least [`SMALL_MIN`] bytes with its free-mark
/// word cleared: whatever it held, the block is live now.
#[inline(always)]
fn unmarked(p: *mut c_void) -> *mut c_void {
    if !p.is_null() {
        // SAFETY: a live block of at least `SMALL_MIN` bytes, aligned to 8 or more.
        unsafe { p.cast::<usize>().add(1).write(0) };
    }
    p
}

/// Aborts with one line when the mimalloc block `p` holds its free mark (freed already and
/// not handed out since: see [`crate::routes`]) or is not aligned as every block is; else
/// its mark word and the mark, for [`small_free`] to write.
///
/// # Safety
/// `p` is a block this allocator handed out from mimalloc (at least [`SMALL_MIN`] bytes;
/// freed memory of mimalloc's stays mapped).
#[inline(always)]
unsafe fn mark_word(call: &str, p: *mut c_void) -> (*mut usize, usize) {
    // Every block mimalloc hands out is aligned to 8 at least: a pointer that is not was
    // never handed out (and its mark word could not be read as one).
    if !(p as usize).is_multiple_of(8) {
        bad_pointer(call, p as usize);
    }
    let word = p.cast::<usize>().wrapping_add(1);
    let mark = ROUTES.free_mark(p as usize);
    // SAFETY: the caller's promise.
    if unsafe { word.read() } == mark {
        bad_pointer(call, p as usize);
    }
    (word, mark)
}

/// Gives a mimalloc block (or `NULL`) back, marked free; aborts on a double free.
///
/// # Safety
/// `p` is `NULL` or a live mimalloc block this allocator handed out.
#[inline(always)]
pub(super) unsafe fn small_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    let (word, mark) = unsafe { mark_word("free", p) };
    // SAFETY: the block is still the caller's until kept or given to mimalloc.
    unsafe {
        word.write(mark);
        if cache::in_a_run_of_frees() {
            kept_or_freed(p)
        } else {
            mi::mi_free(p)
        }
    }
}

/// A freed mimalloc block into this thread's cache, else to mimalloc: out of line, so that
/// a free that mimalloc takes (every free of a thread that allocates as much as it frees)
/// saves no registers.
///
/// # Safety
/// `p` is a live mimalloc block this allocator handed out, marked free.
#[inline(never)]
unsafe fn kept_or_freed(p: *mut c_void) {
    // SAFETY: the caller's promise.
    unsafe {
        if !cache::keep(p) {
            mi::mi_free(p)
        }
    }
}

/// `realloc` of a mimalloc block that stays mimalloc's; aborts on a freed one.
///
/// # Safety
/// `p` is a live mimalloc block this allocator handed out.
#[inline(always)]
pub(super) unsafe fn small_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's promise. A moved block's second word is a copy of the old
    // one's (both hold at least `SMALL_MIN` bytes): no mark of its own address.
    unsafe {
        mark_word("realloc", p);
        or_enomem(mi::mi_realloc(p, size.max(SMALL_MIN)))
    }
}
