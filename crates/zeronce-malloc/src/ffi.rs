//! The C allocation functions (`malloc`, `free`, … and glibc's `__libc_*` names; glibc's
//! extensions and C23's sized frees in [`extensions`]), thin shims over [`crate::runtime`]
//! (large blocks, zeronce) and mimalloc (the rest). With its child module, the only one
//! with `unsafe`: raw pointers, `errno`, mimalloc's C functions, the constructor and
//! destructor entries.
//!
//! Routing: an allocation of at least the threshold is offered to zeronce; what zeronce
//! declines, and everything smaller, is mimalloc's. A pointer given back goes to zeronce
//! if it lies in zeronce's range (two atomic loads, no lock), else to mimalloc. The common
//! cases — a small size, a pointer outside every zeronce range — are decided first by
//! [`ROUTES`] (one or two loads) and go straight to mimalloc.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use libmimalloc_sys as mi;

use crate::routes::ROUTES;
use crate::runtime;
use crate::stderr::{bad_pointer, write_stderr};
use huge::HUGE;
use small::{small_alloc, small_free, small_malloc, small_realloc, SMALL_MIN};

/// The alignment of `malloc`: no explicit one. mimalloc's plain calls align a block of
/// 16 bytes or more to 16 (glibc's `MALLOC_ALIGNMENT`), a smaller one to 8, as its own
/// override does (C17: suitable for any object that fits).
const NATURAL: usize = 1;
const PAGE: usize = 4096;

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno, valid for writes.
    unsafe { *libc::__errno_location() = e };
}

fn get_errno() -> c_int {
    // SAFETY: `__errno_location` returns this thread's errno, valid for reads.
    unsafe { *libc::__errno_location() }
}

/// Eight of the sixteen random bytes the kernel gives every process (`AT_RANDOM`), 0
/// without them: the free mark's seed (read without allocating).
pub(crate) fn aux_random() -> u64 {
    // SAFETY: `getauxval` reads the process's auxiliary vector.
    let at = unsafe { libc::getauxval(libc::AT_RANDOM) } as *const u64;
    if at.is_null() {
        return 0;
    }
    // SAFETY: `AT_RANDOM` points at 16 bytes that live as long as the process.
    unsafe { at.read_unaligned() }
}

/// `p`, or `NULL` with `errno = ENOMEM`.
fn or_enomem(p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

/// A block of `size` bytes aligned to `align` (a power of two), zeroed if `zeroed`. An
/// alignment of the threshold or more is zeronce's whatever the size (its blocks are
/// aligned to their size and checked at `free`; mimalloc's aligned huge blocks are
/// neither checked for double frees nor for pointers inside them).
fn alloc(size: usize, align: usize, zeroed: bool) -> *mut c_void {
    if let Some(rt) = runtime::get() {
        if size.max(align) >= rt.threshold() {
            if rt.refuses(size) {
                return or_enomem(null_mut());
            }
            return keeping_errno(|| match rt.large_alloc(size, align, zeroed) {
                Some(addr) => addr as *mut c_void,
                None => declined_alloc(size, align, zeroed),
            });
        } else {
            rt.count_small(size);
        }
    }
    small_alloc(size, align, zeroed)
}

/// `large()`, a large allocation, with `errno` as it was before when it succeeds:
/// zeronce's and mimalloc's system calls on the way (a `madvise` refused, a first `mmap`
/// retried) may set it, and glibc's successful calls leave it alone.
#[inline]
fn keeping_errno(large: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let errno = get_errno();
    let p = large();
    if !p.is_null() {
        set_errno(errno);
    }
    p
}

/// A block from the threshold up that zeronce declined: a listed mapping of its own (it
/// reads zero), or mimalloc's when none can be listed ([`huge`]).
#[cold]
fn declined_alloc(size: usize, align: usize, zeroed: bool) -> *mut c_void {
    match HUGE.alloc(size, align) {
        Some(addr) => addr as *mut c_void,
        None => small_alloc(size, align, zeroed),
    }
}

/// The usable size of a live block; aborts for a pointer in zeronce's range that is not
/// a live block.
///
/// # Safety
/// `p` is a live block of this allocator (or in zeronce's range).
unsafe fn usable(call: &str, p: *mut c_void) -> usize {
    let addr = p as usize;
    if ROUTES.may_be_large(addr) {
        if let Some(rt) = runtime::current().filter(|rt| rt.owns(addr)) {
            return rt
                .large_usable(addr)
                .unwrap_or_else(|| bad_pointer(call, addr));
        }
    }
    if let Some(len) = HUGE.listed(call, addr) {
        return len;
    }
    // SAFETY: a live mimalloc block (the caller's promise).
    unsafe { mi::mi_usable_size(p) }
}

/// Moves a live block of `old` usable bytes to a new one of `size` bytes.
///
/// # Safety
/// `p` is a live block of at least `old` bytes, freed here on success.
unsafe fn moved(p: *mut c_void, old: usize, size: usize, new: *mut c_void) -> *mut c_void {
    if !new.is_null() {
        // SAFETY: both blocks are live, distinct, and hold at least this many bytes.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), new.cast(), old.min(size)) };
        // SAFETY: `p` is live and no longer used.
        unsafe { c_free(p) };
    }
    new
}

/// C `malloc`.
#[inline(always)]
fn c_malloc(size: usize) -> *mut c_void {
    if ROUTES.is_small(size) {
        return small_malloc(size);
    }
    alloc(size, NATURAL, false)
}

/// C `calloc`: `NULL` and `ENOMEM` when `n * size` overflows. A zeronce block known to be
/// zero is not written.
#[inline(always)]
fn c_calloc(n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) if ROUTES.is_small(total) => {
            // SAFETY: mimalloc's `zalloc` takes any size and returns a zeroed block or NULL.
            or_enomem(unsafe { mi::mi_zalloc(total.max(SMALL_MIN)) })
        }
        Some(total) => alloc(total, NATURAL, true),
        None => or_enomem(null_mut()),
    }
}

/// C `free`: `NULL` is ignored; a pointer in zeronce's range that is not a live block, or
/// a mimalloc block freed already (a double free), aborts with one line on stderr.
///
/// # Safety
/// `p` is `NULL` or a live block of this allocator.
#[inline(always)]
unsafe fn c_free(p: *mut c_void) {
    let addr = p as usize;
    if !ROUTES.may_be_large(addr) && !HUGE.may_contain(addr) {
        // SAFETY: `NULL` or, outside every zeronce range and every listed mapping, a live
        // mimalloc block (the caller's promise).
        return unsafe { small_free(p) };
    }
    // SAFETY: the caller's promise.
    unsafe { free_in_span(p) }
}

/// `free` of a pointer that may be zeronce's or a listed mapping ([`huge`]): out of line,
/// so that the fast route of [`c_free`] saves no registers.
///
/// # Safety
/// As [`c_free`].
#[inline(never)]
unsafe fn free_in_span(p: *mut c_void) {
    let addr = p as usize;
    if let Some(rt) = runtime::current() {
        if rt.owns(addr) {
            if !rt.large_free(addr) {
                bad_pointer("free", addr);
            }
            return;
        }
    }
    if HUGE.listed("free", addr).is_some() {
        return HUGE.free(addr);
    }
    // SAFETY: neither zeronce's nor listed, so a live mimalloc block (the caller's
    // promise).
    unsafe { small_free(p) }
}

/// C `realloc`, with glibc's `realloc(p, 0)`: frees `p` and returns `NULL`. A zeronce
/// block grows in place when its buddies are free; a block that crosses the threshold
/// moves between mimalloc and zeronce.
///
/// # Safety
/// `p` is `NULL` or a live block of this allocator.
#[inline(always)]
unsafe fn c_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return c_malloc(size);
    }
    if size == 0 {
        // SAFETY: the caller's promise.
        unsafe { c_free(p) };
        return null_mut();
    }
    let addr = p as usize;
    if ROUTES.is_small(size) && !ROUTES.may_be_large(addr) && !HUGE.may_contain(addr) {
        // SAFETY: a live mimalloc block (the caller's promise) staying mimalloc's.
        return unsafe { small_realloc(p, size) };
    }
    let rt = runtime::get();
    let large = rt.is_some_and(|rt| size >= rt.threshold());
    if let Some(old) = HUGE.listed("realloc", addr) {
        // Still from the threshold up: resized where it is, its pages moved, not copied.
        if let Some(new) = large.then(|| HUGE.resize(addr, size)).flatten() {
            return new as *mut c_void;
        }
        // SAFETY: a live listed block of `old` usable bytes.
        return unsafe { moved(p, old, size, c_malloc(size)) };
    }
    if large && rt.is_some_and(|rt| rt.refuses(size)) {
        // `p` stays as it was, as when a move finds no room.
        return or_enomem(null_mut());
    }
    if let Some(rt) = rt.filter(|rt| rt.owns(addr)) {
        let old = rt
            .large_usable(addr)
            .unwrap_or_else(|| bad_pointer("realloc", addr));
        if large && rt.large_grow(addr, old, size) {
            return p;
        }
        // SAFETY: a live zeronce block of `old` usable bytes.
        return unsafe { moved(p, old, size, c_malloc(size)) };
    }
    if !large {
        // SAFETY: a live mimalloc block (the caller's promise).
        return unsafe { small_realloc(p, size) };
    }
    keeping_errno(|| {
        let new = match rt.and_then(|rt| rt.large_alloc(size, NATURAL, false)) {
            Some(new) => new as *mut c_void,
            None => declined_alloc(size, NATURAL, false),
        };
        // SAFETY: a live mimalloc block (the caller's promise), moved to zeronce or, as
        // any block zeronce declines, to a listed mapping.
        unsafe { moved(p, mi::mi_usable_size(p), size, new) }
    })
}

/// C `reallocarray`: `realloc(p, n * size)`, or `NULL` and `ENOMEM` (`p` untouched) when
/// the product overflows.
///
/// # Safety
/// As [`realloc`].
#[inline(always)]
unsafe fn c_reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: the caller's promise.
        Some(total) => unsafe { c_realloc(p, total) },
        None => or_enomem(null_mut()),
    }
}

/// C `posix_memalign`: `EINVAL` unless `align` is a power of two and a multiple of
/// `sizeof(void *)`; `ENOMEM` when out of memory (`*out` untouched then).
///
/// # Safety
/// `out` is valid for a pointer write.
#[inline(always)]
unsafe fn c_posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let p = alloc(size, align, false);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's promise.
    unsafe { *out = p };
    0
}

/// C11 `aligned_alloc`: `NULL` and `EINVAL` unless `align` is a power of two (as glibc
/// 2.38 and later).
#[inline(always)]
fn c_aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    alloc(size, align, false)
}

/// `memalign`, as glibc's: an alignment that is not a power of two is rounded up to one;
/// `NULL` and `EINVAL` when there is none.
#[inline(always)]
fn c_memalign(align: usize, size: usize) -> *mut c_void {
    match align.max(1).checked_next_power_of_two() {
        Some(align) => alloc(size, align, false),
        None => {
            set_errno(libc::EINVAL);
            null_mut()
        }
    }
}

/// `valloc`: page aligned.
#[inline(always)]
fn c_valloc(size: usize) -> *mut c_void {
    alloc(size, PAGE, false)
}

/// `pvalloc`: page aligned, the size rounded up to whole pages (one page for 0).
#[inline(always)]
fn c_pvalloc(size: usize) -> *mut c_void {
    match size.max(1).checked_next_multiple_of(PAGE) {
        Some(size) => alloc(size, PAGE, false),
        None => or_enomem(null_mut()),
    }
}

/// `malloc_usable_size`: bytes the caller may use (0 for `NULL`). For a zeronce block,
/// its size rounded up to pages: the block's untouched tail stays unbacked (a resident
/// one is given back after the hold).
///
/// # Safety
/// `p` is `NULL` or a live block of this allocator.
#[inline(always)]
unsafe fn c_malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    // SAFETY: the caller's promise.
    unsafe { usable("malloc_usable_size", p) }
}

/// Exports an implementation under its C names. The implementations call one another
/// directly, never through an exported name: loaded with `dlopen`, this library's own
/// calls to `free` would otherwise bind to glibc's (the first definition in the global
/// scope) and hand it zeronce's blocks.
///
/// glibc's internal names (`__libc_malloc`, …) are exported too: some programs and
/// libraries call them directly (memory debuggers, code that wraps `malloc` and calls the
/// "real" one), and without them such a call would reach glibc's allocator and its block
/// later come to ours. mimalloc's and tcmalloc's glibc overrides export the same names.
macro_rules! export {
    ($imp:ident $params:tt -> $ret:ty as $($(#[$doc:meta])* $name:ident),+) => {
        $( export!(@one $imp $params $ret, [$(#[$doc])*] $name); )+
    };
    (@one $imp:ident ($($arg:ident: $ty:ty),*) $ret:ty, [$($attr:tt)*] $name:ident) => {
        $($attr)*
        ///
        /// # Safety
        /// Pointer arguments are `NULL` or what this allocator handed out (live), and an
        /// output pointer is valid for a write, as for the C function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller's promise, as for the C function.
            #[allow(unused_unsafe)]
            unsafe { $imp($($arg),*) }
        }
    };
}

mod cache;
mod extensions;
mod huge;
mod small;
mod spin;
pub(crate) use extensions::mimalloc_committed;

export!(c_malloc(size: usize) -> *mut c_void as
    /// C `malloc`.
    malloc,
    /// glibc's `__libc_malloc`: `malloc`.
    __libc_malloc);
export!(c_calloc(n: usize, size: usize) -> *mut c_void as
    /// C `calloc`: `NULL` and `ENOMEM` when `n * size` overflows; a zeronce block known to
    /// be zero is not written.
    calloc,
    /// glibc's `__libc_calloc`: `calloc`.
    __libc_calloc);
export!(c_free(p: *mut c_void) -> () as
    /// C `free`: `NULL` is ignored; a pointer in zeronce's range that is not a live block
    /// (a double free) aborts with one line on stderr.
    free,
    /// `cfree`: `free` (old glibc programs).
    cfree,
    /// glibc's `__libc_free`: `free`.
    __libc_free);
export!(c_realloc(p: *mut c_void, size: usize) -> *mut c_void as
    /// C `realloc`, with glibc's `realloc(p, 0)`: frees `p`, returns `NULL`.
    realloc,
    /// glibc's `__libc_realloc`: `realloc`.
    __libc_realloc);
export!(c_reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void as
    /// C `reallocarray`: `realloc(p, n * size)`, `ENOMEM` when the product overflows.
    reallocarray);
export!(c_posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int as
    /// C `posix_memalign`: `EINVAL` for a bad alignment, `ENOMEM` when out of memory.
    posix_memalign,
    /// glibc's `__posix_memalign`: `posix_memalign`.
    __posix_memalign);
export!(c_aligned_alloc(align: usize, size: usize) -> *mut c_void as
    /// C11 `aligned_alloc`: `EINVAL` unless `align` is a power of two.
    aligned_alloc);
export!(c_memalign(align: usize, size: usize) -> *mut c_void as
    /// `memalign`: an alignment that is not a power of two is rounded up.
    memalign,
    /// glibc's `__libc_memalign`: `memalign`.
    __libc_memalign);
export!(c_valloc(size: usize) -> *mut c_void as
    /// `valloc`: page aligned.
    valloc,
    /// glibc's `__libc_valloc`: `valloc`.
    __libc_valloc);
export!(c_pvalloc(size: usize) -> *mut c_void as
    /// `pvalloc`: page aligned, whole pages.
    pvalloc,
    /// glibc's `__libc_pvalloc`: `pvalloc`.
    __libc_pvalloc);
export!(c_malloc_usable_size(p: *mut c_void) -> usize as
    /// `malloc_usable_size`: bytes the caller may use (0 for `NULL`).
    malloc_usable_size);

extern "C" fn fork_prepare() {
    if let Some(rt) = runtime::current() {
        rt.fork_prepare();
    }
    // Last: no thread holds them across a `fork` then (a child has none of the others).
    cache::lock_all();
    HUGE.lock();
}

extern "C" fn fork_parent() {
    HUGE.unlock();
    cache::unlock_all();
    if let Some(rt) = runtime::current() {
        rt.fork_parent();
    }
}

extern "C" fn fork_child() {
    HUGE.unlock();
    cache::unlock_all();
    if let Some(rt) = runtime::current() {
        rt.fork_child();
    }
}

/// The library's constructor: reads the settings if no allocation did yet, registers the
/// `fork` handlers. (Allocation needs no constructor: the first call of any thread sets
/// the allocator up, which may come before this one runs.)
extern "C" fn on_load() {
    // Read the settings now if no allocation did (a bad value is told even then).
    let _ = runtime::get();
    // SAFETY: three handlers with the signature `pthread_atfork` wants, valid for the
    // life of the process (this library is never unloaded while in use as the allocator).
    let r =
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if r != 0 {
        write_stderr(b"zeronce: pthread_atfork failed: a fork child may deadlock\n");
    }
}

/// The library's destructor: the `ZERONCE_SHOW_STATS` report.
extern "C" fn on_unload() {
    if let Some(rt) = runtime::current() {
        rt.report_at_exit();
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;
