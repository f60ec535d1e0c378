//! Blocks from the threshold up that zeronce declines (larger than its largest block, or
//! when its arena cannot serve them: full, never created, a `fork` child's): each is a
//! mapping of its own, as glibc maps its large chunks, listed here so that a `free`,
//! `realloc` or `malloc_usable_size` of one is checked as zeronce's own blocks are. A
//! pointer inside one, or the start of one freed already, aborts with one line. mimalloc,
//! which served them before, frees a pointer inside its huge block as the whole block,
//! silently: the next allocation could then be handed memory the program still uses.
//!
//! The list is a fixed table: changed under a spin lock (allocations of this size are
//! rare; a `fork` handler holds the lock across the `fork`, so a child never finds it
//! taken by a thread it does not have), read without it. Beside it, the span `[lo, hi)` of
//! the listed blocks and of the starts of the last few freed: kept tight (recomputed at
//! every change), so that a small block's pointer, which lies outside every listed
//! mapping, is nearly never looked up; one that lies between two listed blocks costs a
//! scan of the table's used slots, and only a pointer equal to a recently freed start
//! costs a system call (is it still unmapped).

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering::*};

use rustix::mm::munmap;

use super::spin::SpinLock;
use crate::stderr::bad_pointer;

/// Most such blocks live at once (1024 blocks over 1 GiB: 1 TiB of address space); past
/// that, mimalloc serves them, unchecked.
const SLOTS: usize = 1024;
/// Starts of freed blocks remembered, to tell a second free of one.
const FREED: usize = 16;
const PAGE: usize = 4096;

/// The listed mappings (see the module docs).
pub(crate) struct HugeBlocks {
    lock: SpinLock,
    /// Start of each slot's block (0: empty; written last, with release) and its
    /// mapping's length.
    starts: [AtomicUsize; SLOTS],
    lens: [AtomicUsize; SLOTS],
    /// Slots from this one on have never been used.
    used: AtomicUsize,
    /// Starts of the last blocks freed (0: none), a ring; `next_freed` is where the next
    /// one goes.
    freed: [AtomicUsize; FREED],
    next_freed: AtomicUsize,
    /// The listed blocks and the freed starts lie in `[lo, hi)` (`lo > hi`: none).
    lo: AtomicUsize,
    hi: AtomicUsize,
}

/// The process's list.
pub(crate) static HUGE: HugeBlocks = HugeBlocks::new();

impl HugeBlocks {
    const fn new() -> Self {
        HugeBlocks {
            lock: SpinLock::new(),
            starts: [const { AtomicUsize::new(0) }; SLOTS],
            lens: [const { AtomicUsize::new(0) }; SLOTS],
            used: AtomicUsize::new(0),
            freed: [const { AtomicUsize::new(0) }; FREED],
            next_freed: AtomicUsize::new(0),
            lo: AtomicUsize::new(usize::MAX),
            hi: AtomicUsize::new(0),
        }
    }

    /// Whether `addr` may be (or have been) in a listed block: `false` for certain not.
    ///
    /// Relaxed loads suffice, as for the routes' span: a pointer reaches a thread only
    /// after the allocation that listed it (and widened the span) happened before.
    #[inline(always)]
    pub(crate) fn may_contain(&self, addr: usize) -> bool {
        addr >= self.lo.load(Relaxed) && addr < self.hi.load(Relaxed)
    }

    /// Takes the lock (also `fork_prepare`'s, released by [`HugeBlocks::unlock`]).
    pub(crate) fn lock(&self) {
        self.lock.lock();
    }

    /// Releases the lock.
    pub(crate) fn unlock(&self) {
        self.lock.unlock();
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
            self.starts[i].store(start, Release);
            self.used.fetch_max(i + 1, Relaxed);
            // A new start cannot be a freed one any more.
            for f in &self.freed {
                let _ = f.compare_exchange(start, 0, Relaxed, Relaxed);
            }
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

    /// The usable bytes of the listed block that starts at `addr`, or `None` when `addr`
    /// is not this list's (someone else's: mimalloc's). A pointer inside a listed block,
    /// or a recently freed start that no mapping holds again, aborts with one line naming
    /// `call`. Outside the span, two loads.
    #[inline(always)]
    pub(crate) fn listed(&self, call: &str, addr: usize) -> Option<usize> {
        if self.may_contain(addr) {
            self.find(call, addr)
        } else {
            None
        }
    }

    /// [`HugeBlocks::listed`] of an `addr` inside the span.
    #[inline(never)]
    fn find(&self, call: &str, addr: usize) -> Option<usize> {
        let used = self.used.load(Acquire);
        for i in 0..used {
            let start = self.starts[i].load(Acquire);
            if start != 0 && addr.wrapping_sub(start) < self.lens[i].load(Relaxed) {
                if start == addr {
                    return Some(self.lens[i].load(Relaxed));
                }
                bad_pointer(call, addr);
            }
        }
        let freed_here = self.freed.iter().any(|f| f.load(Relaxed) == addr);
        if freed_here && !is_mapped(addr) {
            bad_pointer(call, addr);
        }
        None
    }

    /// The slot listing the block that starts at `addr` (under the lock).
    fn slot_of(&self, addr: usize) -> Option<usize> {
        (0..self.used.load(Relaxed)).find(|&i| self.starts[i].load(Relaxed) == addr)
    }

    /// Resizes the listed block at `addr` (a start [`HugeBlocks::listed`] found) to at
    /// least `size` bytes with `mremap`, moving it if it must: its pages move as they are,
    /// none copied or touched (a `realloc` of an untouched block stays untouched). The new
    /// start, or `None` (nothing changed) if the kernel refuses.
    pub(crate) fn resize(&self, addr: usize, size: usize) -> Option<usize> {
        let len = size.max(1).checked_next_multiple_of(PAGE)?;
        self.lock();
        let moved = self.slot_of(addr).and_then(|i| {
            let old = self.lens[i].load(Relaxed);
            // SAFETY: `addr..addr + old` is a mapping made by `map`, its block live and the
            // caller's (being reallocated: no other thread may use it); `mremap` moves or
            // resizes exactly that mapping.
            let p = unsafe { libc::mremap(addr as *mut c_void, old, len, libc::MREMAP_MAYMOVE) };
            if p == libc::MAP_FAILED {
                return None;
            }
            let start = p as usize;
            // Listed again before the new pointer leaves this thread.
            self.lens[i].store(len, Relaxed);
            self.starts[i].store(start, Release);
            if start != addr {
                self.remember_freed(addr);
            }
            self.tighten();
            Some(start)
        });
        self.unlock();
        moved
    }

    /// Unlists and unmaps the block at `addr` (a start [`HugeBlocks::listed`] found).
    pub(crate) fn free(&self, addr: usize) {
        self.lock();
        let len = self.slot_of(addr).map(|i| {
            self.starts[i].store(0, Release);
            self.remember_freed(addr);
            self.tighten();
            self.lens[i].load(Relaxed)
        });
        self.unlock();
        match len {
            Some(len) => unmap(addr, len),
            // Freed by another thread since it was found: the second of two frees.
            None => bad_pointer("free", addr),
        }
    }

    /// Puts `addr`, a start no longer listed, in the ring of freed starts (under the lock).
    fn remember_freed(&self, addr: usize) {
        let k = self.next_freed.fetch_add(1, Relaxed) % FREED;
        self.freed[k].store(addr, Relaxed);
    }

    /// Recomputes the span from the listed blocks and the freed starts (under the lock).
    /// Every pair of ends a reader may see, old or new, covers every block still listed.
    fn tighten(&self) {
        let listed = (0..self.used.load(Relaxed)).filter_map(|i| {
            let start = self.starts[i].load(Relaxed);
            (start != 0).then(|| (start, start + self.lens[i].load(Relaxed)))
        });
        let freed = self.freed.iter().filter_map(|f| {
            let start = f.load(Relaxed);
            (start != 0).then_some((start, start + 1))
        });
        let (lo, hi) = listed
            .chain(freed)
            .fold((usize::MAX, 0), |(lo, hi), (s, e)| (lo.min(s), hi.max(e)));
        self.lo.store(lo, Relaxed);
        self.hi.store(hi, Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_blocks_are_found_by_their_start_and_the_span_shrinks_back_to_freed_starts() {
        let list = HugeBlocks::new();
        assert!(
            !list.may_contain(0x7000_0000_0000),
            "nothing listed: empty span"
        );
        let a = list.alloc(5 << 20, PAGE).expect("map a");
        let b = list.alloc(3 << 20, 4 << 20).expect("map b");
        assert_eq!(b % (4 << 20), 0, "aligned as asked");
        for (start, len) in [(a, 5 << 20), (b, 3 << 20)] {
            assert!(list.may_contain(start) && list.may_contain(start + len - 1));
            assert_eq!(list.listed("free", start), Some(len));
            // SAFETY: a live mapping of `len` bytes made by `alloc`, nothing else uses it.
            unsafe { std::ptr::write_bytes(start as *mut u8, 1, len) };
        }
        // An address outside both blocks but inside the span is not the list's.
        let (lo, hi) = (a.min(b), (a + (5 << 20)).max(b + (3 << 20)));
        let outside = (lo..hi)
            .step_by(PAGE)
            .find(|&p| p.wrapping_sub(a) >= 5 << 20 && p.wrapping_sub(b) >= 3 << 20);
        if let Some(p) = outside {
            assert_eq!(list.listed("free", p), None);
        }
        // Resized where it is or moved by the kernel, contents and listing follow it.
        let grown = list.resize(a, 64 << 20).expect("mremap");
        assert_eq!(list.listed("realloc", grown), Some(64 << 20));
        // SAFETY: the live, listed block of 64 MiB `resize` returned.
        let kept = unsafe { *(grown as *const u8).add((5 << 20) - 1) };
        assert_eq!(kept, 1, "contents kept");
        let (a0, a) = (a, grown);
        list.free(a);
        assert!(
            list.may_contain(a),
            "its start stays, to tell a second free"
        );
        assert_eq!(list.listed("free", b), Some(3 << 20));
        list.free(b);
        // Only freed starts are left: the span is at most what lies between them.
        let (first, last) = (a.min(b).min(a0), a.max(b).max(a0));
        assert!(!list.may_contain(last + PAGE) && !list.may_contain(first - PAGE));
        assert!(list.may_contain(first) && list.may_contain(last));
    }
}
