//! The zeroing kernels themselves: raw loops over `[ptr, ptr + len)`.
//!
//! Every function here is `unsafe` with the same contract: `ptr` is valid for writes of
//! `len` bytes and no Rust reference to those bytes is alive. The x86-64 kernels handle
//! any alignment and length: the unaligned head and tail go through `write_bytes`.
//!
//! Miri cannot interpret inline assembly (`rep stosb`, `clzero`, and the non-temporal
//! stores, which `core::arch` writes as assembly) nor `sfence`. Under `cfg(miri)` each of
//! those instructions is replaced by an ordinary store of the same bytes with the same
//! alignment requirement, and `sfence` by a sequentially consistent fence, so Miri checks
//! every address, bound and alignment the kernels compute. Their prefetches (hints that
//! change nothing a program can see) are left out there.
//!
//! The cache-bypassing kernels go page by page and ask for the address translation of a
//! page a few pages ahead before they store to the current one ([`page_by_page`]).

/// Plain `core::ptr::write_bytes` (the compiler's memset).
///
/// # Safety
/// `ptr` valid for writes of `len` bytes, not borrowed by any live reference.
#[inline]
pub(crate) unsafe fn write_bytes(ptr: *mut u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { core::ptr::write_bytes(ptr, 0, len) }
}

/// Splits `[ptr, ptr+len)` into an unaligned head, an `align`-aligned body whose length
/// is a multiple of `align`, and a tail; zeroes head and tail with `write_bytes` and
/// returns the body `(ptr, len)`.
///
/// # Safety
/// As for [`write_bytes`].
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn edges(ptr: *mut u8, len: usize, align: usize) -> (*mut u8, usize) {
    let head = ptr.align_offset(align).min(len);
    let body = (len - head) & !(align - 1);
    let tail = len - head - body;
    // SAFETY: head and tail lie inside the caller's range; the body starts `head` bytes in.
    unsafe {
        write_bytes(ptr, head);
        write_bytes(ptr.add(head + body), tail);
        (ptr.add(head), body)
    }
}

/// `rep stosb` (fast with ERMS/FSRM; cache-allocating, good for small ranges).
///
/// # Safety
/// As for [`write_bytes`].
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) unsafe fn rep_stosb(ptr: *mut u8, len: usize) {
    // Stand-in for Miri: the same `len` bytes from `ptr`.
    #[cfg(miri)]
    // SAFETY: forwarded caller contract.
    unsafe {
        write_bytes(ptr, len)
    };
    // SAFETY: `rep stosb` writes exactly `rcx` = `len` bytes of `al` = 0 forwards from
    // `rdi` = `ptr` (the ABI guarantees the direction flag is clear), all inside the
    // caller's range; it touches no stack and no flags besides the ones declared.
    #[cfg(not(miri))]
    unsafe {
        core::arch::asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") ptr => _,
            in("al") 0u8,
            options(nostack, preserves_flags)
        );
    }
}

/// Bytes ahead of the stores whose address translation the cache-bypassing kernels ask
/// for. A streaming store to a page missing from the TLB waits for its page walk, and
/// the walk misses the cache when the page tables were pushed out of it (by the kernel's
/// own zeroing at the faults of a large buffer, say; under a hypervisor a walk reads the
/// host's tables too). A prefetch of a later page starts that walk early, beside the
/// stores. `malloc_work firstpass stream|stream-ahead` (256 MiB of 4 KiB pages faulted
/// in, then zeroed twice; AMD family 26 VM): the first zeroing 4.5-5.3 ms without and
/// 2.9-3.0 ms with the prefetch, the second 2.8 ms both; distances from 2 to 32 pages
/// gave the same.
const AHEAD: usize = 4 * crate::PAGE_SIZE;

/// Runs `zero` over `[ptr, ptr + len)` in pieces that do not cross a page boundary,
/// prefetching the byte [`AHEAD`] bytes past each piece's start when it is inside the
/// range (a prefetch never faults: a page not yet mapped stays unmapped).
///
/// # Safety
/// As for [`write_bytes`]; `zero` gets pieces of the caller's range, in order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn page_by_page(ptr: *mut u8, len: usize, mut zero: impl FnMut(*mut u8, usize)) {
    let page = crate::PAGE_SIZE;
    let (mut p, mut left) = (ptr, len);
    while left > 0 {
        let piece = (page - (p as usize & (page - 1))).min(left);
        if left > AHEAD {
            // SAFETY: a prefetch only hints the cache and the TLB: it reads nothing the
            // program sees and never faults; the address is inside the caller's range.
            #[cfg(not(miri))]
            unsafe {
                use core::arch::x86_64::{_mm_prefetch, _MM_HINT_NTA};
                _mm_prefetch::<_MM_HINT_NTA>(p.add(AHEAD).cast::<i8>());
            }
        }
        zero(p, piece);
        // SAFETY: `piece <= left`: still inside (or one past the end of) the range.
        p = unsafe { p.add(piece) };
        left -= piece;
    }
}

/// Calls `line` with each 64-byte line of the 64-byte aligned range `[body, body +
/// len)`, page by page ([`page_by_page`]), then fences the stores ([`store_fence`]): the
/// loop of the non-temporal store kernels, which differ only in how they store a line.
///
/// # Safety
/// As for [`write_bytes`]; `body` and `len` are multiples of 64; `line` stores only
/// inside the line it is given.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn each_line(body: *mut u8, len: usize, mut line: impl FnMut(*mut u8)) {
    let lines = |mut p: *mut u8, n: usize| {
        let end = p.wrapping_add(n);
        while p < end {
            line(p);
            p = p.wrapping_add(64);
        }
    };
    // SAFETY: forwarded contract.
    unsafe { page_by_page(body, len, lines) };
    store_fence();
}

/// Non-temporal 16-byte stores (`movntdq`) + `sfence`.
///
/// # Safety
/// As for [`write_bytes`].
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn nt_sse2(ptr: *mut u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_setzero_si128};
    // SAFETY: forwarded contract; `edges` returns a 64-byte-aligned body inside the range.
    let (body, body_len) = unsafe { edges(ptr, len, 64) };
    // SAFETY: SSE2 is part of the x86-64 baseline, so the intrinsic's target feature is
    // always present.
    let z = unsafe { _mm_setzero_si128() };
    let line = |p: *mut u8| {
        let q = p.cast::<__m128i>();
        for i in 0..4 {
            // SAFETY: `q + i` is one of the four 16-byte-aligned quarters of the line
            // `each_line` gives, inside the caller's range; SSE2 is x86-64 baseline.
            unsafe {
                #[cfg(not(miri))]
                core::arch::x86_64::_mm_stream_si128(q.add(i), z);
                #[cfg(miri)]
                q.add(i).write(z);
            }
        }
    };
    // SAFETY: forwarded contract; the body is 64-byte aligned, a multiple of 64 long.
    unsafe { each_line(body, body_len, line) };
}

/// Non-temporal 32-byte stores (`vmovntdq`) + `sfence`.
///
/// # Safety
/// As for [`write_bytes`], and the CPU must support AVX2 (check
/// `is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn nt_avx2(ptr: *mut u8, len: usize) {
    use core::arch::x86_64::{__m256i, _mm256_setzero_si256};
    // SAFETY: forwarded contract; the body is 64-byte aligned inside the range.
    let (body, body_len) = unsafe { edges(ptr, len, 64) };
    let z = _mm256_setzero_si256();
    let line = |p: *mut u8| {
        let q = p.cast::<__m256i>();
        for i in 0..2 {
            // SAFETY: `q + i` is one of the two 32-byte-aligned halves of the line
            // `each_line` gives, inside the caller's range; AVX2 availability is the
            // caller's contract.
            unsafe {
                #[cfg(not(miri))]
                core::arch::x86_64::_mm256_stream_si256(q.add(i), z);
                #[cfg(miri)]
                q.add(i).write(z);
            }
        }
    };
    // SAFETY: forwarded contract; the body is 64-byte aligned, a multiple of 64 long.
    unsafe { each_line(body, body_len, line) };
}

/// AMD `clzero`: zeroes one whole 64-byte cache line per instruction, without reading it
/// (weakly ordered like non-temporal stores) + `sfence`.
///
/// # Safety
/// As for [`write_bytes`], and the CPU must support `clzero` (see
/// [`super::has_clzero`]).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn clzero(ptr: *mut u8, len: usize) {
    // SAFETY: forwarded contract; the body is 64-byte aligned inside the range, so each
    // `clzero` zeroes a line entirely inside it.
    let (body, body_len) = unsafe { edges(ptr, len, 64) };
    // SAFETY: each piece `page_by_page` hands out is inside the caller's range and 64-byte
    // aligned at both ends (as the body is); CPU support is the caller's contract.
    let lines = |p: *mut u8, n: usize| unsafe { clzero_lines(p, p.wrapping_add(n)) };
    // SAFETY: forwarded contract.
    unsafe { page_by_page(body, body_len, lines) };
    store_fence();
}

/// `clzero` of every line of `[p, end)`, four lines an iteration while they last.
///
/// # Safety
/// As for [`clzero`]; `p` and `end` are 64-byte aligned.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn clzero_lines(mut p: *mut u8, end: *mut u8) {
    while p < end {
        // SAFETY: `clzero` zeroes the 64-byte line containing `rax`; `p` is line-aligned
        // and the line lies inside the caller's range; CPU support is the caller's
        // contract. Four lines per iteration: `p + 256 <= end` is checked first.
        unsafe {
            if end.offset_from(p) >= 256 {
                #[cfg(miri)]
                clzero_stand_in(p, 4);
                #[cfg(not(miri))]
                core::arch::asm!(
                    "clzero",
                    "add rax, 64",
                    "clzero",
                    "add rax, 64",
                    "clzero",
                    "add rax, 64",
                    "clzero",
                    inout("rax") p => _,
                    options(nostack)
                );
                p = p.add(256);
            } else {
                #[cfg(miri)]
                clzero_stand_in(p, 1);
                #[cfg(not(miri))]
                core::arch::asm!("clzero", in("rax") p, options(nostack, preserves_flags));
                p = p.add(64);
            }
        }
    }
}

/// A 64-byte cache line: what one `clzero` zeroes.
#[cfg(all(target_arch = "x86_64", miri))]
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

/// Miri's stand-in for `lines` `clzero` instructions from `p`: aligned stores of whole
/// cache lines.
///
/// # Safety
/// `p` is 64-byte aligned and `lines` lines from it are inside the caller's range.
#[cfg(all(target_arch = "x86_64", miri))]
unsafe fn clzero_stand_in(p: *mut u8, lines: usize) {
    let line = p.cast::<CacheLine>();
    for i in 0..lines {
        // SAFETY: the function's contract.
        unsafe { line.add(i).write(CacheLine([0; 64])) };
    }
}

/// Orders the weakly ordered non-temporal stores (and `clzero`) before every later store,
/// so later normal stores, and other threads that synchronise with this one, see the
/// zeroes first: `sfence`. Miri cannot interpret `sfence`; the non-temporal stores it
/// emulates are ordered by its memory model's sequentially consistent fence instead.
#[cfg(target_arch = "x86_64")]
#[inline]
fn store_fence() {
    #[cfg(not(miri))]
    // SAFETY: SSE is part of the x86-64 baseline; `sfence` only orders stores.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(miri)]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
