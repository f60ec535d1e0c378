//! glibc's allocator extensions and C23's sized frees, so that a program calling them
//! talks to this allocator, not to glibc's idle one: without them `malloc_trim` would trim
//! glibc's empty heap and give nothing back, and `mallinfo2` would describe it (all zero).
//!
//! - `malloc_trim(pad)`: gives back at once what zeronce holds and no allocation uses (free
//!   blocks reported whatever the delay, the per-thread kept blocks first, live blocks'
//!   resident tails), then asks mimalloc to return what it can (`mi_collect`). `pad` is
//!   ignored (nothing here grows a heap top). 1 if memory went back, else 0, as glibc.
//! - `mallinfo2()`, `mallinfo()`: `arena` and `uordblks` are what mimalloc has committed
//!   (its release build does not count bytes in use, so that is an upper bound on the small
//!   side), `hblkhd` the bytes of live zeronce blocks (glibc's field for its own `mmap`ed
//!   large chunks), `usmblks` their peak; the rest 0. `mallinfo` clamps to `int`.
//! - `malloc_stats()`: the `ZERONCE_SHOW_STATS` report, on stderr, now.
//! - `malloc_info(0, fp)`: the same figures as XML on `fp`; `EINVAL` for other options.
//! - `mallopt(param, value)`: accepted and ignored (returns 1): glibc's tunables
//!   (`M_ARENA_MAX`, `M_MMAP_THRESHOLD`, …) steer glibc's heap, which serves nothing here.
//!   zeronce's settings are its environment variables.
//! - `free_sized(p, size)`, `free_aligned_sized(p, align, size)` (C23): `free`, after a
//!   check that costs one usable-size lookup: a size larger than the block, or a pointer
//!   not aligned as claimed, is not what the block was allocated with, and aborts with one
//!   line, as a pointer never handed out does.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use libmimalloc_sys as mi;

use super::{c_free, usable};
use crate::runtime;
use crate::stderr::write_stderr;

/// What mimalloc has committed now and at the most, in bytes.
pub(crate) fn mimalloc_committed() -> (usize, usize) {
    let (mut now, mut peak) = (0usize, 0usize);
    // SAFETY: `mi_process_info` writes the figures whose pointers are not NULL.
    unsafe {
        mi::mi_process_info(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut now,
            &mut peak,
            std::ptr::null_mut(),
        )
    };
    (now, peak)
}

/// `malloc_trim`: zeronce's free blocks reported now, then the thread caches and mimalloc's
/// free pages given back; 1 if anything went: zeronce reported pages, or mimalloc's
/// committed bytes or the process's anonymous RSS fell (mimalloc's purges lower the RSS
/// without lowering its committed count).
fn c_malloc_trim(_pad: usize) -> c_int {
    let large = runtime::current().is_some_and(|rt| rt.trim());
    let anon_rss = || zeronce_mem::ProcessRss::read().ok().map(|r| r.anon);
    let (committed, rss) = (mimalloc_committed().0, anon_rss());
    super::cache::release_reachable();
    // SAFETY: `mi_collect` takes no pointer; `true` returns what can be returned now.
    unsafe { mi::mi_collect(true) };
    let rss_fell = matches!((rss, anon_rss()), (Some(before), Some(after)) if after < before);
    let small = mimalloc_committed().0 < committed || rss_fell;
    c_int::from(large || small)
}

/// The figures of `mallinfo2`, `malloc_info` and friends.
struct Figures {
    small_committed: usize,
    small_peak: usize,
    large_live: usize,
    large_peak: usize,
}

fn figures() -> Figures {
    let (small_committed, small_peak) = mimalloc_committed();
    let (live, peak) = runtime::current().map_or((0, 0), |rt| rt.large_live());
    Figures {
        small_committed,
        small_peak,
        large_live: usize::try_from(live).unwrap_or(usize::MAX),
        large_peak: usize::try_from(peak).unwrap_or(usize::MAX),
    }
}

fn c_mallinfo2() -> libc::mallinfo2 {
    let f = figures();
    libc::mallinfo2 {
        arena: f.small_committed,
        ordblks: 0,
        smblks: 0,
        hblks: 0,
        hblkhd: f.large_live,
        usmblks: f.large_peak,
        fsmblks: 0,
        uordblks: f.small_committed,
        fordblks: 0,
        keepcost: 0,
    }
}

fn c_mallinfo() -> libc::mallinfo {
    let m = c_mallinfo2();
    let int = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
    libc::mallinfo {
        arena: int(m.arena),
        ordblks: 0,
        smblks: 0,
        hblks: 0,
        hblkhd: int(m.hblkhd),
        usmblks: int(m.usmblks),
        fsmblks: 0,
        uordblks: int(m.uordblks),
        fordblks: 0,
        keepcost: 0,
    }
}

fn c_malloc_stats() {
    match runtime::get() {
        Some(rt) => write_stderr(rt.report().as_bytes()),
        None => write_stderr(b"zeronce: no statistics while the allocator is being set up\n"),
    }
}

/// # Safety
/// `fp` is an open `FILE *` (or `NULL`: `EINVAL`).
unsafe fn c_malloc_info(options: c_int, fp: *mut libc::FILE) -> c_int {
    if options != 0 || fp.is_null() {
        return libc::EINVAL;
    }
    let f = figures();
    let threshold = runtime::get().map_or(0, |rt| rt.threshold());
    let xml = format!(
        "<malloc version=\"zeronce-1\">\n\
         <large allocator=\"zeronce\" threshold=\"{threshold}\" live=\"{}\" peak=\"{}\"/>\n\
         <small allocator=\"mimalloc\" committed=\"{}\" peak=\"{}\"/>\n\
         <total type=\"mmap\" count=\"0\" size=\"{}\"/>\n\
         <system type=\"current\" size=\"{}\"/>\n\
         <system type=\"max\" size=\"{}\"/>\n\
         </malloc>\n",
        f.large_live,
        f.large_peak,
        f.small_committed,
        f.small_peak,
        f.large_live,
        f.small_committed + f.large_live,
        f.small_peak + f.large_peak,
    );
    // SAFETY: `xml` holds `len` bytes; `fp` is an open stream (the caller's promise).
    let written = unsafe { libc::fwrite(xml.as_ptr().cast(), 1, xml.len(), fp) };
    if written == xml.len() {
        0
    } else {
        -1
    }
}

fn c_mallopt(_param: c_int, _value: c_int) -> c_int {
    1
}

/// One line on stderr and `abort()`: a sized free whose size or alignment is not the
/// block's.
fn bad_size(call: &str, p: *mut c_void, what: &str) -> ! {
    write_stderr(
        format!(
            "zeronce: {call}(): invalid size for {p:p}: {what} (not what it was allocated with)\n"
        )
        .as_bytes(),
    );
    std::process::abort()
}

/// C23 `free_sized`.
///
/// # Safety
/// As `free`.
unsafe fn c_free_sized(p: *mut c_void, size: usize) {
    if !p.is_null() {
        // SAFETY: the caller's promise.
        let usable = unsafe { usable("free_sized", p) };
        if size > usable {
            bad_size(
                "free_sized",
                p,
                &format!("{size} bytes, the block holds {usable}"),
            );
        }
    }
    // SAFETY: the caller's promise.
    unsafe { c_free(p) }
}

/// C23 `free_aligned_sized`.
///
/// # Safety
/// As `free`.
unsafe fn c_free_aligned_sized(p: *mut c_void, align: usize, size: usize) {
    if !p.is_null() && (!align.is_power_of_two() || !(p as usize).is_multiple_of(align)) {
        bad_size("free_aligned_sized", p, &format!("not aligned to {align}"));
    }
    // SAFETY: the caller's promise.
    unsafe { c_free_sized(p, size) }
}

export!(c_malloc_trim(pad: usize) -> c_int as
    /// glibc's `malloc_trim`: gives back at once what no allocation uses; 1 if any.
    malloc_trim);
export!(c_mallinfo2() -> libc::mallinfo2 as
    /// glibc's `mallinfo2`: mimalloc's committed bytes, zeronce's live and peak bytes.
    mallinfo2);
export!(c_mallinfo() -> libc::mallinfo as
    /// glibc's `mallinfo`: `mallinfo2` clamped to `int`.
    mallinfo);
export!(c_malloc_stats() -> () as
    /// glibc's `malloc_stats`: the statistics report, on stderr.
    malloc_stats);
export!(c_malloc_info(options: c_int, fp: *mut libc::FILE) -> c_int as
    /// glibc's `malloc_info`: the statistics as XML on `fp`; `EINVAL` unless `options` is 0.
    malloc_info);
export!(c_mallopt(param: c_int, value: c_int) -> c_int as
    /// glibc's `mallopt`: accepted and ignored (glibc's tunables steer glibc's heap).
    mallopt);
export!(c_free_sized(p: *mut c_void, size: usize) -> () as
    /// C23 `free_sized`: `free`; aborts if `size` is larger than the block.
    free_sized);
export!(c_free_aligned_sized(p: *mut c_void, align: usize, size: usize) -> () as
    /// C23 `free_aligned_sized`: `free`; aborts if `p` is not aligned to `align` or `size`
    /// is larger than the block.
    free_aligned_sized);
