//! The library's own Rust allocator: mimalloc, except that blocks of [`BIG`] bytes and
//! more are anonymous mappings of their own.
//!
//! zeronce's tables for its 64 GiB range (a frame table of 192 MiB, bitmaps) are zeroed
//! allocations that must cost nothing until written: a fresh mapping reads zero without a
//! page being touched, which mimalloc's zeroed allocations of that size do not promise
//! (measured: the first large allocation of a program cost 228 MiB of RSS through them).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ptr::null_mut;

use mimalloc::MiMalloc;
use rustix::mm::{mmap_anonymous, munmap, MapFlags, ProtFlags};

/// Sizes from this one up are mappings of their own.
pub const BIG: usize = 256 << 10;
const PAGE: usize = 4096;

/// mimalloc, with big blocks mapped (see the module docs).
pub struct Inner;

/// Whether `layout` is served by a mapping (same answer at allocation and free).
fn big(layout: &Layout) -> bool {
    layout.size() >= BIG && layout.align() <= PAGE
}

/// A new private anonymous mapping of `len` bytes, no swap reserved (`NULL` if refused);
/// also the mappings of the C blocks zeronce declines (`ffi/huge.rs`).
pub(crate) fn map(len: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping at an address the kernel picks: it aliases
    // nothing.
    let mapped = unsafe {
        mmap_anonymous(
            null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::NORESERVE,
        )
    };
    mapped.map_or(null_mut(), |p| p.cast())
}

// SAFETY: a big layout's block is a mapping of at least its size, page aligned (so aligned
// to the layout's alignment, at most a page), reading zero, unmapped only by `dealloc` of
// the same layout; every other layout is mimalloc's, with mimalloc's guarantees.
unsafe impl GlobalAlloc for Inner {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if big(&layout) {
            map(layout.size())
        } else {
            // SAFETY: the caller's guarantees on `layout`, forwarded.
            unsafe { MiMalloc.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if big(&layout) {
            map(layout.size())
        } else {
            // SAFETY: as `alloc`.
            unsafe { MiMalloc.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if big(&layout) {
            // SAFETY: a mapping of this length made by `map` for this layout, no longer
            // used (the caller's promise).
            let _ = unsafe { munmap(ptr.cast(), layout.size()) };
        } else {
            // SAFETY: a mimalloc block of this layout (the caller's promise).
            unsafe { MiMalloc.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller promises `new_size`, rounded to the alignment, fits `isize`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !big(&layout) && !big(&new_layout) {
            // SAFETY: a mimalloc block staying mimalloc's (the caller's promise).
            return unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        }
        // SAFETY: a valid layout of non-zero size.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` is live with `layout`, and no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_blocks_are_zero_and_move_between_the_two_kinds_with_their_contents() {
        let inner = Inner;
        let small = Layout::from_size_align(1000, 8).unwrap();
        // SAFETY: valid layouts; each block is used within its size and freed once with
        // the layout it has then.
        unsafe {
            let p = inner.alloc(small);
            p.write_bytes(7, 1000);
            let p = inner.realloc(p, small, 4 * BIG);
            let big_layout = Layout::from_size_align(4 * BIG, 8).unwrap();
            assert!((0..1000).all(|i| *p.add(i) == 7));
            let p = inner.realloc(p, big_layout, 100);
            assert!((0..100).all(|i| *p.add(i) == 7));
            inner.dealloc(p, Layout::from_size_align(100, 8).unwrap());
            let z = inner.alloc_zeroed(big_layout);
            assert!((0..4 * BIG).step_by(4096).all(|i| *z.add(i) == 0));
            assert_eq!(z as usize % PAGE, 0);
            inner.dealloc(z, big_layout);
        }
    }
}
