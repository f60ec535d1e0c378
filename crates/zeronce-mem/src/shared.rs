//! [`SharedRam`]: a [`GuestRam`] shared between threads, accessed through exclusively
//! *claimed* byte ranges ([`RamRange`]).
//!
//! `GuestRam` changes contents only through `&mut self`, which serialises every writer of
//! the whole mapping. An allocator hands disjoint blocks to many threads at once; this type
//! lets each of them own its block's bytes. Soundness: a claim is granted only if it
//! overlaps no live claim, the inner `GuestRam` is never exposed, and every reference to
//! contents, zeroing or discard goes through a claim. So no two live references (or
//! kernel side effects) ever touch the same byte.
//!
//! Claims are kept as bits per page and per 64-page group ([`ClaimMap`]): claiming and
//! releasing a block costs an atomic operation or two on a word other threads are
//! unlikely to use, instead of a lock every allocation of every thread takes.

use std::sync::Arc;

use crate::claims::ClaimMap;
use crate::discard::{discard_raw, Backing, DiscardError, DiscardOp, ZeroGuarantee};
use crate::ram::{bytes_are_zero, touch_for_write, BackingKind, GuestRam};
use crate::resident::ResidentError;
use crate::zeroing::{zero_range_hinted, ZeroKernel};

/// Why a range could not be claimed.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimError {
    /// The range is empty or extends past the end of the RAM.
    #[error("range {offset:#x}+{len:#x} is empty or outside guest RAM of {size:#x} bytes")]
    OutOfRange {
        /// Start offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Size of the RAM.
        size: usize,
    },
    /// The range overlaps a live claim (or, for as long as that attempt lasts, an
    /// overlapping claim being attempted at the same time).
    #[error("range {offset:#x}+{len:#x} overlaps a live claim of the page at {busy_offset:#x}")]
    Busy {
        /// Start offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Start of the first claimed 4 KiB page it overlaps.
        busy_offset: usize,
    },
}

/// Guest RAM shared between threads; see the module docs.
#[derive(Debug)]
pub struct SharedRam {
    ram: GuestRam,
    /// Pages held by live claims.
    claims: ClaimMap,
}

/// Attempts of a claim that meets a conflict: a conflict with another claim *attempt*
/// that is being rolled back is gone by a later try; a live claim stays.
const CLAIM_ATTEMPTS: usize = 16;

impl SharedRam {
    /// Shares `ram`.
    pub fn new(ram: GuestRam) -> Arc<SharedRam> {
        Arc::new(SharedRam {
            claims: ClaimMap::new(ram.len().div_ceil(crate::PAGE_SIZE)),
            ram,
        })
    }

    /// Pages `[first, end)` a byte range touches.
    fn pages_of(offset: usize, len: usize) -> (usize, usize) {
        (
            offset / crate::PAGE_SIZE,
            (offset + len).div_ceil(crate::PAGE_SIZE),
        )
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.ram.len()
    }

    /// Address of the first byte (to tell whether a pointer lies inside the RAM).
    pub fn base_addr(&self) -> usize {
        self.ram.as_ptr() as usize
    }

    /// Whether the RAM is empty (never, for a mapped `GuestRam`).
    pub fn is_empty(&self) -> bool {
        self.ram.is_empty()
    }

    /// What the RAM is backed by.
    pub fn kind(&self) -> BackingKind {
        self.ram.kind()
    }

    /// Discard semantics of the backing.
    pub fn backing(&self) -> Backing {
        self.ram.backing()
    }

    /// Bytes of the range resident in memory (`mincore`; reads no contents).
    pub fn resident_bytes(&self, offset: usize, len: usize) -> Result<usize, ResidentError> {
        self.ram.resident_bytes(offset, len)
    }

    /// Bytes the backing file has allocated (`None` for anonymous memory).
    pub fn file_allocated_bytes(&self) -> Option<Result<u64, ResidentError>> {
        self.ram.file_allocated_bytes()
    }

    /// Claims `[offset, offset + len)` exclusively until the returned range is dropped.
    pub fn claim(self: &Arc<Self>, offset: usize, len: usize) -> Result<RamRange, ClaimError> {
        let size = self.ram.len();
        let end = match offset.checked_add(len) {
            Some(end) if len > 0 && end <= size => end,
            _ => return Err(ClaimError::OutOfRange { offset, len, size }),
        };
        let (first, last) = Self::pages_of(offset, end - offset);
        let mut busy = first;
        for attempt in 0..CLAIM_ATTEMPTS {
            match self.claims.try_claim(first, last) {
                Ok(()) => {
                    return Ok(RamRange {
                        ram: Arc::clone(self),
                        offset,
                        len,
                    })
                }
                Err(page) => busy = page,
            }
            if attempt + 1 < CLAIM_ATTEMPTS {
                std::hint::spin_loop();
            }
        }
        Err(ClaimError::Busy {
            offset,
            len,
            busy_offset: busy * crate::PAGE_SIZE,
        })
    }
}

/// An exclusively claimed byte range of a [`SharedRam`]; released on drop.
#[derive(Debug)]
pub struct RamRange {
    ram: Arc<SharedRam>,
    offset: usize,
    len: usize,
}

impl RamRange {
    /// Start offset in the RAM.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty (never: claims are non-empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn ptr(&self) -> *mut u8 {
        // `offset + len <= ram.len()` was checked at claim time.
        self.ram.ram.as_ptr().wrapping_add(self.offset)
    }

    /// The bytes (reading faults untouched pages in; they read zero).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: inside the live mapping (checked at claim; the Arc keeps it mapped),
        // always initialised, and no other claim overlaps, so the only references to these
        // bytes are borrows of `self`; mutation needs `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes this borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    /// Whether every byte reads zero.
    pub fn is_zero(&self) -> bool {
        bytes_are_zero(self.as_slice())
    }

    /// Zeroes the range with [`ZeroKernel::auto`]; the page holding `hint` (a byte offset
    /// *into this range*) is zeroed last so it is cache-hot.
    pub fn zero(&mut self, hint: Option<usize>) -> ZeroKernel {
        let kernel = ZeroKernel::auto(self.len);
        self.zero_with(kernel, hint);
        kernel
    }

    /// As [`SharedRange::zero`] with `kernel` (an unavailable one falls back to
    /// `write_bytes`).
    pub fn zero_with(&mut self, kernel: ZeroKernel, hint: Option<usize>) {
        // SAFETY: the range is inside the live, writable mapping and exclusively ours
        // (`&mut self`), so no reference to it is alive during the call.
        unsafe { zero_range_hinted(self.ptr(), self.len, kernel, hint) };
    }

    /// Faults the pages in for writing, one byte every `stride` bytes (0 = 4 KiB), without
    /// changing contents; see `touch_for_write`.
    pub fn touch(&mut self, stride: usize) {
        touch_for_write(self.as_mut_slice(), stride);
    }

    /// Address of the first byte (what a global allocator hands out; see
    /// [`crate::global::Grant`]).
    pub fn addr(&self) -> usize {
        self.ptr() as usize
    }

    /// Discards `len` bytes from byte `start` of the range (page-aligned, inside it) with
    /// `op`, like [`RamRange::discard`] on that part; a part outside the range is refused
    /// as [`DiscardError::OutOfRange`].
    pub fn discard_part(
        &mut self,
        start: usize,
        len: usize,
        op: DiscardOp,
    ) -> Result<ZeroGuarantee, DiscardError> {
        let inside = start.checked_add(len).is_some_and(|end| end <= self.len);
        if !inside {
            return Err(DiscardError::OutOfRange {
                start,
                len,
                limit: self.len,
            });
        }
        let backing = self.ram.backing();
        let file = self
            .ram
            .ram
            .fd()
            .map(|fd| (fd, (self.offset + start) as u64));
        // SAFETY: as `discard`, on a part of this exclusively claimed range (checked above).
        unsafe { discard_raw(self.ptr().wrapping_add(start), len, op, backing, file) }?;
        Ok(op.zero_guarantee(backing))
    }

    /// Discards the range with `op` (page-aligned; whole huge pages for hugetlb) and says
    /// whether it now reads zero. On error the memory is untouched, except for
    /// [`DiscardError::Os`].
    pub fn discard(&mut self, op: DiscardOp) -> Result<ZeroGuarantee, DiscardError> {
        let backing = self.ram.backing();
        let file = self.ram.ram.fd().map(|fd| (fd, self.offset as u64));
        // SAFETY: inside our live mapping of kind `backing` at file offset `offset` of its
        // fd; exclusively claimed and `&mut self`, so no Rust reference to the contents is
        // alive while the kernel changes them.
        unsafe { discard_raw(self.ptr(), self.len, op, backing, file) }?;
        Ok(op.zero_guarantee(backing))
    }
}

impl Drop for RamRange {
    fn drop(&mut self) {
        let (first, end) = SharedRam::pages_of(self.offset, self.len);
        self.ram.claims.release(first, end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    fn ram() -> Arc<SharedRam> {
        SharedRam::new(GuestRam::new(4 << 20, BackingKind::Anonymous { thp: false }).unwrap())
    }

    #[test]
    fn overlapping_claims_are_refused_until_released() {
        let r = ram();
        let a = r.claim(4096, 8192).unwrap();
        assert!(matches!(
            r.claim(0, 4097),
            Err(ClaimError::Busy {
                busy_offset: 4096,
                ..
            })
        ));
        assert!(matches!(r.claim(8192, 4096), Err(ClaimError::Busy { .. })));
        let b = r.claim(12288, 4096).unwrap();
        let c = r.claim(0, 4096).unwrap();
        assert!(matches!(r.claim(0, 0), Err(ClaimError::OutOfRange { .. })));
        assert!(matches!(
            r.claim(4 << 20, 1),
            Err(ClaimError::OutOfRange { .. })
        ));
        drop(a);
        let a2 = r.claim(0x1000, 0x2000).unwrap();
        drop((a2, b, c));
    }

    #[test]
    fn claims_across_words_roll_back_on_conflict() {
        let r = ram();
        let page = crate::PAGE_SIZE;
        // Pages 100..101 held; a claim of pages 10..300 (five words) fails at page 100 and
        // leaves nothing of its own behind.
        let held = r.claim(100 * page, page).unwrap();
        assert!(matches!(
            r.claim(10 * page, 290 * page),
            Err(ClaimError::Busy { busy_offset, .. }) if busy_offset == 100 * page
        ));
        let below = r.claim(10 * page, 90 * page).unwrap();
        let above = r.claim(101 * page, 199 * page).unwrap();
        // A byte range owns every page it touches.
        assert!(r.claim(100 * page + 10, 1).is_err());
        drop((held, below, above));
        let whole = r.claim(0, r.len()).unwrap();
        assert!(r.claim(r.len() - 1, 1).is_err());
        drop(whole);
        assert!(r.claim(64 * page, 64 * page).is_ok());
    }

    #[test]
    fn racing_overlapping_claims_never_both_hold() {
        let r = ram();
        let page = crate::PAGE_SIZE;
        let inside = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..2usize {
                let (r, inside) = (&r, &inside);
                s.spawn(move || {
                    // Miri checks every interleaving it runs for data races: fewer rounds.
                    for i in 0..if cfg!(miri) { 200 } else { 20_000usize } {
                        // Overlapping ranges of different shapes, across word boundaries.
                        let (first, pages) = if (i + t) % 2 == 0 { (60, 10) } else { (63, 70) };
                        if let Ok(c) = r.claim(first * page, pages * page) {
                            assert_eq!(inside.fetch_add(1, Relaxed), 0);
                            inside.fetch_sub(1, Relaxed);
                            drop(c);
                        }
                    }
                });
            }
        });
        assert!(r.claim(0, r.len()).is_ok(), "every bit cleared");
    }

    #[test]
    fn writes_and_zeroing_through_claims() {
        let r = ram();
        let mut a = r.claim(4096, 16 * 4096).unwrap();
        a.as_mut_slice().fill(7);
        assert!(!a.is_zero());
        a.zero(Some(4096));
        assert!(a.is_zero());
        a.touch(0);
        assert!(a.is_zero());
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: madvise")]
    fn discard_through_claims() {
        let r = ram();
        let mut a = r.claim(0, 2 << 20).unwrap();
        a.as_mut_slice().fill(7);
        a.as_mut_slice()[100] = 1;
        let g = a.discard(DiscardOp::DontNeed).unwrap();
        assert!(g.is_zeroed());
        assert!(a.is_zero());
        a.touch(0);
        assert!(a.is_zero());
    }

    /// Minor page faults of the calling thread so far (`/proc/thread-self/stat`, field 10).
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(7).unwrap().parse().unwrap()
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: mincore, /proc")]
    fn touch_faults_each_untouched_page_once_and_keeps_contents() {
        let r = ram();
        let pages = 512usize;
        let mut a = r.claim(0, pages * 4096).unwrap();
        a.as_mut_slice()[3 * 4096] = 9;
        let before = minor_faults();
        a.touch(0);
        let faults = minor_faults() - before;
        // One write fault per page (a read first would map the zero page: two faults).
        assert!(
            faults <= pages as u64 + 8,
            "{faults} faults for {pages} pages"
        );
        assert!(r.resident_bytes(0, pages * 4096).unwrap() >= 511 * 4096);
        assert_eq!(a.as_slice()[3 * 4096], 9);
        assert_eq!(a.as_slice().iter().filter(|&&b| b != 0).count(), 1);

        // `GuestRam::touch` (VM mode's) shares the same write-only touch.
        let mut guest = GuestRam::new(pages * 4096, BackingKind::Anonymous { thp: false }).unwrap();
        let before = minor_faults();
        guest.touch(0, pages * 4096, 0).unwrap();
        let faults = minor_faults() - before;
        assert!(
            faults <= pages as u64 + 8,
            "GuestRam::touch: {faults} faults for {pages} pages"
        );
    }
}
