//! [`SharedRam`]: a [`GuestRam`] shared between threads, accessed through exclusively
//! *claimed* byte ranges: a [`RamRange`] (holds the RAM, released on drop) or a bare
//! [`RamClaim`] (holds nothing: its bytes are reached through the RAM it came from, and it
//! ends with [`SharedRam::release`]), for an owner that keeps the RAM alive anyway and
//! should not count a reference per block.
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

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::claims::ClaimMap;
use crate::discard::{discard_raw, Backing, DiscardError, DiscardOp, ZeroGuarantee};
use crate::ram::{bytes_are_zero, touch_for_write, BackingKind, GuestRam};
use crate::resident::ResidentError;
use crate::scan::ScanError;
use crate::zeroing::{zero_range_hinted, ZeroKernel};

mod each;

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
    /// This RAM's identity, never reused in the process: a [`RamClaim`] is honoured only
    /// by the RAM that granted it.
    id: NonZeroU64,
}

/// An exclusive claim on `[offset, offset + len)` of one [`SharedRam`] that holds no
/// reference to it: its bytes are reached through that RAM ([`SharedRam::bytes`] and the
/// other `*_claim` methods, which refuse a claim of another RAM), and it ends with
/// [`SharedRam::release`]. Dropped without its release, its pages stay claimed (never
/// handed out again): a leak, never an alias.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a claim dropped without SharedRam::release keeps its pages claimed"]
pub struct RamClaim {
    ram: NonZeroU64,
    offset: usize,
    len: usize,
}

impl RamClaim {
    /// Start offset in the RAM.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the claim is empty (never: claims are non-empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The next [`SharedRam`]'s identity.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Attempts of a claim that meets a conflict: a conflict with another claim *attempt*
/// that is being rolled back is gone by a later try; a live claim stays.
const CLAIM_ATTEMPTS: usize = 16;

impl SharedRam {
    /// Shares `ram`.
    pub fn new(ram: GuestRam) -> Arc<SharedRam> {
        let id = NonZeroU64::new(NEXT_ID.fetch_add(1, Relaxed)).expect("2^64 RAMs in a process");
        Arc::new(SharedRam {
            claims: ClaimMap::new(ram.len().div_ceil(crate::PAGE_SIZE)),
            ram,
            id,
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

    /// The runs of pages of `[offset, offset + len)` that may not read zero
    /// ([`GuestRam::for_each_maybe_written`]): from the page tables, so it touches no
    /// byte and needs no claim.
    pub fn for_each_maybe_written(
        &self,
        offset: usize,
        len: usize,
        granule: usize,
        f: impl FnMut(usize, usize),
    ) -> Result<(), ScanError> {
        self.ram.for_each_maybe_written(offset, len, granule, f)
    }

    /// Claims `[offset, offset + len)` exclusively until the returned range is dropped.
    pub fn claim(self: &Arc<Self>, offset: usize, len: usize) -> Result<RamRange, ClaimError> {
        let claim = self.claim_bare(offset, len)?;
        Ok(RamRange {
            ram: Arc::clone(self),
            claim,
        })
    }

    /// Claims `[offset, offset + len)` exclusively until [`SharedRam::release`] (see
    /// [`RamClaim`]).
    pub fn claim_bare(&self, offset: usize, len: usize) -> Result<RamClaim, ClaimError> {
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
                    return Ok(RamClaim {
                        ram: self.id,
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

    /// Ends `claim`: its pages may be claimed again.
    ///
    /// # Panics
    /// If `claim` is another RAM's (a caller's bug; the claim is not released).
    pub fn release(&self, claim: RamClaim) {
        self.release_pages(&claim);
    }

    /// Clears the claim bits of `claim` (checked to be this RAM's).
    fn release_pages(&self, claim: &RamClaim) {
        self.check(claim);
        let (first, end) = Self::pages_of(claim.offset, claim.len);
        self.claims.release(first, end);
    }

    /// Panics unless `claim` was granted by this RAM: the one check that makes reaching
    /// bytes through a bare claim sound.
    #[inline]
    fn check(&self, claim: &RamClaim) {
        assert!(
            claim.ram == self.id,
            "a claim of another SharedRam ({} here, {} claimed)",
            self.id,
            claim.ram
        );
    }

    /// The first byte of `claim` (checked to be this RAM's; `offset + len <= len()` was
    /// checked when it was granted).
    #[inline]
    fn claim_ptr(&self, claim: &RamClaim) -> *mut u8 {
        self.check(claim);
        self.ram.as_ptr().wrapping_add(claim.offset)
    }

    /// The bytes of `claim` (reading faults untouched pages in; they read zero).
    ///
    /// # Panics
    /// If `claim` is another RAM's.
    pub fn bytes<'a>(&'a self, claim: &'a RamClaim) -> &'a [u8] {
        let ptr = self.claim_ptr(claim);
        // SAFETY: inside this RAM's live mapping (checked at claim; `&self` keeps it
        // mapped), always initialised, and no other claim overlaps, so the only references
        // to these bytes are borrows of `claim`; mutation needs `&mut` of it.
        unsafe { std::slice::from_raw_parts(ptr, claim.len) }
    }

    /// The bytes of `claim`, mutably.
    ///
    /// # Panics
    /// If `claim` is another RAM's.
    pub fn bytes_mut<'a>(&'a self, claim: &'a mut RamClaim) -> &'a mut [u8] {
        let ptr = self.claim_ptr(claim);
        // SAFETY: as `bytes`, and `&mut claim` makes this borrow unique.
        unsafe { std::slice::from_raw_parts_mut(ptr, claim.len) }
    }

    /// Whether every byte of `claim` reads zero.
    pub fn claim_is_zero(&self, claim: &RamClaim) -> bool {
        bytes_are_zero(self.bytes(claim))
    }

    /// Zeroes `claim` with [`ZeroKernel::auto`]; the page holding `hint` (a byte offset
    /// into the claim) is zeroed last so it is cache-hot.
    pub fn zero_claim(&self, claim: &mut RamClaim, hint: Option<usize>) -> ZeroKernel {
        let kernel = ZeroKernel::auto(claim.len);
        self.zero_claim_with(claim, kernel, hint);
        kernel
    }

    /// As [`SharedRam::zero_claim`] with `kernel` (an unavailable one falls back to
    /// `write_bytes`).
    pub fn zero_claim_with(&self, claim: &mut RamClaim, kernel: ZeroKernel, hint: Option<usize>) {
        let ptr = self.claim_ptr(claim);
        // SAFETY: the claim is inside the live, writable mapping and exclusively ours
        // (`&mut claim`), so no reference to it is alive during the call.
        unsafe { zero_range_hinted(ptr, claim.len, kernel, hint) };
    }

    /// Faults the pages of `claim` in for writing, one byte every `stride` bytes (0 = 4
    /// KiB), without changing contents; see `touch_for_write`.
    pub fn touch_claim(&self, claim: &mut RamClaim, stride: usize) {
        touch_for_write(self.bytes_mut(claim), stride);
    }

    /// Discards `len` bytes from byte `start` of `claim` (page-aligned, inside it) with
    /// `op`, like [`SharedRam::discard_claim`] on that part; a part outside the claim is
    /// refused as [`DiscardError::OutOfRange`].
    pub fn discard_claim_part(
        &self,
        claim: &mut RamClaim,
        start: usize,
        len: usize,
        op: DiscardOp,
    ) -> Result<ZeroGuarantee, DiscardError> {
        let inside = start.checked_add(len).is_some_and(|end| end <= claim.len);
        if !inside {
            return Err(DiscardError::OutOfRange {
                start,
                len,
                limit: claim.len,
            });
        }
        let ptr = self.claim_ptr(claim).wrapping_add(start);
        let backing = self.ram.backing();
        let file = self.ram.fd().map(|fd| (fd, (claim.offset + start) as u64));
        // SAFETY: inside our live mapping of kind `backing` at that file offset of its fd;
        // a part of a claim that is exclusively ours (`&mut claim`, checked above), so no
        // Rust reference to the contents is alive while the kernel changes them.
        unsafe { discard_raw(ptr, len, op, backing, file) }?;
        Ok(op.zero_guarantee(backing))
    }

    /// Discards `claim` with `op` (page-aligned; whole huge pages for hugetlb) and says
    /// whether it now reads zero. On error the memory is untouched, except for
    /// [`DiscardError::Os`].
    pub fn discard_claim(
        &self,
        claim: &mut RamClaim,
        op: DiscardOp,
    ) -> Result<ZeroGuarantee, DiscardError> {
        let len = claim.len;
        self.discard_claim_part(claim, 0, len, op)
    }
}

/// An exclusively claimed byte range of a [`SharedRam`]; released on drop. (A
/// [`RamClaim`] with the RAM it came from.)
#[derive(Debug)]
pub struct RamRange {
    ram: Arc<SharedRam>,
    claim: RamClaim,
}

impl RamRange {
    /// Start offset in the RAM.
    pub fn offset(&self) -> usize {
        self.claim.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.claim.len
    }

    /// Whether the range is empty (never: claims are non-empty).
    pub fn is_empty(&self) -> bool {
        self.claim.is_empty()
    }

    /// The bytes (reading faults untouched pages in; they read zero).
    pub fn as_slice(&self) -> &[u8] {
        self.ram.bytes(&self.claim)
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.ram.bytes_mut(&mut self.claim)
    }

    /// Whether every byte reads zero.
    pub fn is_zero(&self) -> bool {
        self.ram.claim_is_zero(&self.claim)
    }

    /// Zeroes the range with [`ZeroKernel::auto`]; the page holding `hint` (a byte offset
    /// *into this range*) is zeroed last so it is cache-hot.
    pub fn zero(&mut self, hint: Option<usize>) -> ZeroKernel {
        self.ram.zero_claim(&mut self.claim, hint)
    }

    /// As [`RamRange::zero`] with `kernel` (an unavailable one falls back to
    /// `write_bytes`).
    pub fn zero_with(&mut self, kernel: ZeroKernel, hint: Option<usize>) {
        self.ram.zero_claim_with(&mut self.claim, kernel, hint);
    }

    /// Faults the pages in for writing, one byte every `stride` bytes (0 = 4 KiB), without
    /// changing contents; see `touch_for_write`.
    pub fn touch(&mut self, stride: usize) {
        self.ram.touch_claim(&mut self.claim, stride);
    }

    /// Address of the first byte (what a global allocator hands out; see
    /// [`crate::global::Grant`]).
    pub fn addr(&self) -> usize {
        self.ram.claim_ptr(&self.claim) as usize
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
        self.ram.discard_claim_part(&mut self.claim, start, len, op)
    }

    /// Discards the range with `op` (page-aligned; whole huge pages for hugetlb) and says
    /// whether it now reads zero. On error the memory is untouched, except for
    /// [`DiscardError::Os`].
    pub fn discard(&mut self, op: DiscardOp) -> Result<ZeroGuarantee, DiscardError> {
        self.ram.discard_claim(&mut self.claim, op)
    }
}

impl Drop for RamRange {
    fn drop(&mut self) {
        self.ram.release_pages(&self.claim);
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
    fn a_bare_claim_reaches_its_bytes_through_its_ram_and_ends_with_release() {
        let r = ram();
        let mut c = r.claim_bare(8192, 3 * 4096).unwrap();
        assert_eq!((c.offset(), c.len()), (8192, 3 * 4096));
        assert!(r.claim_bare(12288, 1).is_err());
        assert!(
            r.claim(0, 8193).is_err(),
            "a bare claim excludes ranges too"
        );
        r.bytes_mut(&mut c).fill(5);
        assert!(r.bytes(&c).iter().all(|&b| b == 5));
        assert!(!r.claim_is_zero(&c));
        r.zero_claim(&mut c, Some(4096));
        assert!(r.claim_is_zero(&c));
        r.bytes_mut(&mut c)[7] = 1;
        r.touch_claim(&mut c, 0);
        assert_eq!(r.bytes(&c)[7], 1);
        r.release(c);
        let again = r.claim_bare(12288, 1).unwrap();
        r.release(again);
        assert!(r.claim(0, r.len()).is_ok(), "every bit cleared");
    }

    #[test]
    fn a_bare_claim_dropped_unreleased_keeps_its_pages_and_no_other_ram_honours_it() {
        let (r, other) = (ram(), ram());
        let leaked = r.claim_bare(0, 4096).unwrap();
        drop(leaked);
        assert!(r.claim_bare(0, 4096).is_err(), "a leak, never an alias");
        let c = r.claim_bare(4096, 4096).unwrap();
        let reached =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| other.bytes(&c).len()));
        assert!(reached.is_err(), "another RAM's claim is refused");
        // The refused release left the claim alone: its own RAM still ends it.
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| other.release(c)));
        assert!(refused.is_err());
        assert!(r.claim_bare(4096, 4096).is_err());
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
