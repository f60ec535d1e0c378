//! Blocks from the threshold up that zeronce declines (larger than its largest block, or
//! when its arena cannot serve them: full, never created, a `fork` child's): each is a
//! mapping of its own, as glibc maps its large chunks, listed here so that a `free`,
//! `realloc` or `malloc_usable_size` of one is checked as zeronce's own blocks are. A
//! pointer inside one, or one freed already, aborts with one line. mimalloc, which served
//! them before, frees a pointer inside its huge block as the whole block, silently: the
//! next allocation could then be handed the memory the program still uses.
//!
//! The list is a fixed table under a spin lock (allocations of this size are rare; a
//! `fork` handler holds the lock across the `fork`, so a child never finds it taken by a
//! thread it does not have). Beside it, the span of every address a listed block ever
//! covered: a pointer outside it (every small block, nearly always) is not looked up.

use std::ffi::c_void;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

use rustix::mm::munmap;

use crate::stderr::bad_pointer;

/// Most such blocks live at once; past that, mimalloc serves them as before.
const SLOTS: usize = 256;
const PAGE: usize = 4096;

/// The listed mappings (see the module docs).
pub(crate) struct HugeBlocks {
    lock: AtomicBool,
    /// Start of each slot's block (0: empty) and its mapping's length.
    starts: [AtomicUsize; SLOTS],
    lens: [AtomicUsize; SLOTS],
    /// Every address a listed block covered lies in `[lo, hi)`; `lo > hi` before the
    /// first. Only grows, one end at a time (as the routes' span).
    lo: AtomicUsize,
    hi: AtomicUsize,
}

/// The process's list.
pub(crate) static HUGE: HugeBlocks = HugeBlocks::new();

/// What a pointer is to the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The start of a listed block of this many usable bytes.
    Block(usize),
    /// Not in any listed block, and not known to be bad: someone else's (mimalloc's).
    Elsewhere,
}

impl HugeBlocks {
    const fn new() -> Self {
        HugeBlocks {
            lock: AtomicBool::new(false),
            starts: [const { AtomicUsize::new(0) }; SLOTS],
            lens: [const { AtomicUsize::new(0) }; SLOTS],
            lo: AtomicUsize::new(usize::MAX),
            hi: AtomicUsize::new(0),
        }
    }

    /// Whether `addr` may be (or have been) in a listed block: `false` for certain not.
    #[inline(always)]
    pub(crate) fn may_contain(&self, addr: usize) -> bool {
        addr >= self.lo.load(Relaxed) && addr < self.hi.load(Relaxed)
    }

    /// Takes the lock (also `fork_prepare`'s, released by [`HugeBlocks::unlock`]).
    pub(crate) fn lock(&self) {
        while self
            .lock
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            spin_loop();
        }
    }

    /// Releases the lock.
    pub(crate) fn unlock(&self) {
        self.lock.store(false, Release);
    }

    /// A new mapping of at least `size` bytes aligned to `align` (a power of two), reading
    /// zero, listed; `None` if it cannot be mapped or listed.
    pub(crate) fn alloc(&self, size: usize, align: usize) -> Option<usize> {
        let len = size.max(1).checked_next_multiple_of(PAGE)?;
        // Room to slide up to the alignment; the ends are unmapped again.
        let extra = align.saturating_sub(PAGE);
        let mapped = map(len.checked_add(extra)?)?;
        let start = mapped.next_multiple_of(align.max(PAGE));
        unmap(mapped, start - mapped);
        unmap(start + len, mapped + extra - start);
        self.lock();
        let slot = (0..SLOTS).find(|&i| self.starts[i].load(Relaxed) == 0);
        if let Some(i) = slot {
            self.lens[i].store(len, Relaxed);
            self.starts[i].store(start, Relaxed);
            // The span covers the block before any pointer to it leaves this thread.
            self.hi.fetch_max(start + len, Relaxed);
            self.lo.fetch_min(start, Relaxed);
        }
        self.unlock();
        if slot.is_none() {
            unmap(start, len);
        }
        slot.map(|_| start)
    }

    /// What `addr` is: a listed block's start, or not this list's. A pointer inside a
    /// listed block, or into memory no mapping holds any more in the span of the listed
    /// ones (a block freed already), aborts with one line naming `call`.
    pub(crate) fn find(&self, call: &str, addr: usize) -> Found {
        self.lock();
        let hit = (0..SLOTS).find_map(|i| {
            let start = self.starts[i].load(Relaxed);
            let len = self.lens[i].load(Relaxed);
            (start != 0 && addr.wrapping_sub(start) < len).then_some((start, len))
        });
        self.unlock();
        match hit {
            Some((start, len)) if start == addr => Found::Block(len),
            Some(_) => bad_pointer(call, addr),
            None if !is_mapped(addr) => bad_pointer(call, addr),
            None => Found::Elsewhere,
        }
    }

    /// Unlists and unmaps the block at `addr` (a start [`HugeBlocks::find`] found).
    pub(crate) fn free(&self, addr: usize) {
        self.lock();
        let slot = (0..SLOTS).find(|&i| self.starts[i].load(Relaxed) == addr);
        let len = slot.map(|i| {
            self.starts[i].store(0, Relaxed);
            self.lens[i].load(Relaxed)
        });
        self.unlock();
        match len {
            Some(len) => unmap(addr, len),
            // Freed by another thread since it was found: the second of two frees.
            None => bad_pointer("free", addr),
        }
    }
}

/// A new mapping of `len` bytes ([`crate::inner::map`]), or `None`.
fn map(len: usize) -> Option<usize> {
    let p = crate::inner::map(len);
    (!p.is_null()).then_some(p as usize)
}

/// Unmaps `len` bytes at `addr` (nothing for 0).
fn unmap(addr: usize, len: usize) {
    if len > 0 {
        // SAFETY: whole pages of a mapping made by `map` that nothing uses any more (an
        // end slid off for alignment, or a block its owner freed).
        let _ = unsafe { munmap(addr as *mut c_void, len) };
    }
}

/// Whether the page holding `addr` is mapped (`msync` fails with `ENOMEM` otherwise).
fn is_mapped(addr: usize) -> bool {
    let page = addr & !(PAGE - 1);
    // SAFETY: `msync` with `MS_ASYNC` reads no memory and changes nothing; on an unmapped
    // page it only fails.
    unsafe { libc::msync(page as *mut c_void, PAGE, libc::MS_ASYNC) == 0 }
}
