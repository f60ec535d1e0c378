//! inflateq / deflateq: le32 PFN arrays (4 KiB units), and with bit 7 a trailing
//! device-writable bitmap (bit N = Nth PFN now guaranteed zero).
//!
//! Host pages larger than 4 KiB (hugetlb) are discarded only when every 4 KiB PFN of
//! them has been inflated. With `MUST_TELL_HOST` partial host pages are remembered in
//! [`PartialPages`] until the rest arrives (or forgotten when a PFN of them is deflated);
//! without it a guest may reuse a deflated page before the device has seen the deflate,
//! so the device only counts the PFNs of one request (the caller passes a fresh
//! [`PartialPages`]).

use std::collections::{BTreeMap, HashMap};

use vm_memory::{GuestAddress, GuestMemoryBackend};
use zeronce_mem::Backing;

use super::{read_all, region_range, split_readable_writable, Desc};
use crate::discard::{Discarder, PlannedDiscard};
use crate::error::BalloonError;
use crate::features::QueueKind;
use crate::spec::limits::MAX_PFNS_PER_REQUEST;
use crate::spec::{PFN_PAGE_SIZE, PFN_SHIFT};

/// A guest page frame number in 4 KiB units (the balloon's PFN unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pfn4k(pub u32);

impl Pfn4k {
    /// The guest physical address of the frame.
    pub fn gpa(self) -> GuestAddress {
        GuestAddress(u64::from(self.0) << PFN_SHIFT)
    }
}

/// A parsed inflate or deflate request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PfnRequest {
    /// The PFNs, in request order (bitmap bit N = `pfns[N]`).
    pub pfns: Vec<Pfn4k>,
    /// The device-writable bitmap (address, length), when bit 7 is negotiated.
    pub bitmap: Option<(GuestAddress, u32)>,
}

/// Parses an inflate (`want_bitmap` = bit 7 negotiated) or deflate request.
pub(crate) fn parse<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    queue: QueueKind,
    descs: &[Desc],
    want_bitmap: bool,
) -> Result<PfnRequest, BalloonError> {
    let (readable, writable) = split_readable_writable(queue, descs)?;
    if readable.is_empty() {
        return Err(BalloonError::WrongDirection {
            queue,
            index: 0,
            want_writable: false,
        });
    }
    let len: u64 = readable.iter().map(|d| u64::from(d.len)).sum();
    let max = (MAX_PFNS_PER_REQUEST * 4) as u64;
    if len == 0 {
        return Err(BalloonError::EmptyBuffer { queue });
    }
    if len > max {
        return Err(BalloonError::BufferTooLarge { queue, len, max });
    }
    if !len.is_multiple_of(4) {
        return Err(BalloonError::PfnArrayLength { queue, len });
    }
    let bytes = read_all(mem, queue, readable)?;
    let pfns: Vec<Pfn4k> = bytes
        .chunks_exact(4)
        .map(|c| Pfn4k(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
        .collect();
    let need = pfns.len().div_ceil(8) as u64;
    let bitmap = match (want_bitmap, writable) {
        (false, []) => None,
        (false, _) => {
            return Err(BalloonError::WrongDirection {
                queue,
                index: readable.len(),
                want_writable: false,
            })
        }
        (true, [d]) if u64::from(d.len) >= need => {
            region_range(mem, queue, d.addr, need)?;
            Some((d.addr, d.len))
        }
        (true, [d]) => {
            return Err(BalloonError::BitmapTooShort {
                have: u64::from(d.len),
                need,
            })
        }
        (true, []) => return Err(BalloonError::BitmapTooShort { have: 0, need }),
        (true, _) => {
            return Err(BalloonError::BadChain {
                queue,
                seen: descs.len(),
            })
        }
    };
    for p in &pfns {
        region_range(mem, queue, p.gpa(), PFN_PAGE_SIZE)?;
    }
    Ok(PfnRequest { pfns, bitmap })
}

/// Host pages larger than 4 KiB that are only partly in the balloon.
///
/// Every operation is `O(log n)` in the number of partial pages (which a guest can make
/// as large as its RAM divided by the host page size): a guest inflating a 1 GiB page
/// sub-page by sub-page, or deflating 64 Ki PFNs while thousands of pages are partial,
/// must not cost the device time proportional to the product. Records never overlap: a
/// record of another page size over the same range (the VMM changed the memory map) is
/// forgotten, so a deflate always clears the one record that can hold its PFN.
#[derive(Clone, Debug, Default)]
pub(crate) struct PartialPages {
    /// Host page base → its record.
    pages: BTreeMap<u64, PartialPage>,
}

#[derive(Clone, Debug)]
struct PartialPage {
    /// Host page size in bytes.
    size: u64,
    /// One bit per 4 KiB sub-page inflated.
    words: Vec<u64>,
    /// Bits set in `words`.
    count: u64,
}

impl PartialPages {
    /// Marks 4 KiB page `gpa` of the host page at `base` (of `page_size` bytes) as
    /// inflated; returns true when the host page is now complete (and forgets it).
    pub fn add(&mut self, base: u64, page_size: u64, gpa: u64) -> bool {
        // Rounded up: a page size that is not a multiple of 4 KiB (a VMM's mistake; the
        // discard refuses it) must not index past the record.
        let subpages = page_size.div_ceil(PFN_PAGE_SIZE);
        let end = base.saturating_add(page_size);
        let fits = self.pages.get(&base).is_some_and(|p| p.size == page_size);
        if !fits {
            // Forget every record overlapping [base, end): the one starting before `base`
            // that reaches into it, and all starting inside it.
            if let Some((&b, p)) = self.pages.range(..base).next_back() {
                if b.saturating_add(p.size) > base {
                    self.pages.remove(&b);
                }
            }
            let inside: Vec<u64> = self.pages.range(base..end).map(|(b, _)| *b).collect();
            for b in inside {
                self.pages.remove(&b);
            }
            self.pages.insert(
                base,
                PartialPage {
                    size: page_size,
                    words: vec![0; usize::try_from(subpages.div_ceil(64)).unwrap_or(0)],
                    count: 0,
                },
            );
        }
        let page = self.pages.get_mut(&base).expect("inserted above");
        let i = ((gpa - base) / PFN_PAGE_SIZE) as usize;
        let mask = 1u64 << (i % 64);
        if page.words[i / 64] & mask == 0 {
            page.words[i / 64] |= mask;
            page.count += 1;
        }
        let full = page.count == subpages;
        if full {
            self.pages.remove(&base);
        }
        full
    }

    /// Forgets 4 KiB page `gpa` (deflated) from the partial host page holding it.
    pub fn remove(&mut self, gpa: u64) {
        let Some((&base, page)) = self.pages.range_mut(..=gpa).next_back() else {
            return;
        };
        if gpa - base >= page.size {
            return;
        }
        let i = ((gpa - base) / PFN_PAGE_SIZE) as usize;
        let mask = 1u64 << (i % 64);
        if page.words[i / 64] & mask != 0 {
            page.words[i / 64] &= !mask;
            page.count -= 1;
            if page.count == 0 {
                self.pages.remove(&base);
            }
        }
    }

    /// Number of partial host pages remembered.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether none is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Forgets everything (device reset).
    pub fn clear(&mut self) {
        self.pages.clear();
    }
}

/// Plans the discards for validated inflate PFNs: 4 KiB backings as merged runs,
/// larger host pages only when complete. Regions whose backing cannot be determined are
/// skipped (counted by the caller through the returned count).
pub(crate) fn plan<M, D>(
    mem: &M,
    discarder: &mut D,
    partial: &mut PartialPages,
    pfns: &[Pfn4k],
) -> (Vec<PlannedDiscard>, u64)
where
    M: GuestMemoryBackend + ?Sized,
    D: Discarder<M> + ?Sized,
{
    let sorted = sort_by_backing(mem, discarder, partial, pfns);
    let mut out = merge_small_runs(sorted.small);
    out.extend(complete_huge_pages(sorted.huge, sorted.complete));
    (out, sorted.backing_errors)
}

/// One inflated page on a backing of 4 KiB pages: (gpa, bit, backing, region start). Runs
/// merge only inside one region, since two back-to-back regions are two mappings (and
/// possibly two files).
type SmallPage = (u64, u32, Backing, u64);

/// Inflated PFNs sorted by their backing's page size.
#[derive(Default)]
struct ByBacking {
    small: Vec<SmallPage>,
    /// Huge host page base → (page size, backing, bits of its PFNs in this request).
    huge: HashMap<u64, (u64, Backing, Vec<u32>)>,
    /// Huge host pages this request completed.
    complete: Vec<u64>,
    backing_errors: u64,
}

/// Looks up each PFN's backing; records huge-page sub-pages in `partial`.
fn sort_by_backing<M, D>(
    mem: &M,
    discarder: &mut D,
    partial: &mut PartialPages,
    pfns: &[Pfn4k],
) -> ByBacking
where
    M: GuestMemoryBackend + ?Sized,
    D: Discarder<M> + ?Sized,
{
    let mut sorted = ByBacking::default();
    for (bit, pfn) in (0u32..).zip(pfns) {
        let gpa = pfn.gpa();
        let Ok(r) = region_range(mem, QueueKind::Inflate, gpa, PFN_PAGE_SIZE) else {
            continue; // validated by `parse`; unreachable in practice
        };
        let backing = match discarder.backing(mem, r.region_start) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(gpa = gpa.0, error = %e, "cannot determine backing");
                sorted.backing_errors += 1;
                continue;
            }
        };
        let ps = backing.page_size() as u64;
        if ps <= PFN_PAGE_SIZE {
            sorted.small.push((gpa.0, bit, backing, r.region_start.0));
            continue;
        }
        let base = r.region_start.0 + (gpa.0 - r.region_start.0) / ps * ps;
        if base + ps > r.region_start.0 + r.region_len {
            continue; // tail of a region smaller than a host page: never discardable
        }
        sorted
            .huge
            .entry(base)
            .or_insert_with(|| (ps, backing, Vec::new()))
            .2
            .push(bit);
        if partial.add(base, ps, gpa.0) {
            sorted.complete.push(base);
        }
    }
    sorted
}

/// 4 KiB-backed pages as discards of merged runs (adjacent or repeated, same region and
/// backing).
fn merge_small_runs(mut small: Vec<SmallPage>) -> Vec<PlannedDiscard> {
    small.sort_unstable_by_key(|(gpa, bit, _, _)| (*gpa, *bit));
    let mut out: Vec<PlannedDiscard> = Vec::new();
    let mut run_region = None;
    for (gpa, bit, backing, region) in small {
        let same_region = run_region == Some(region);
        run_region = Some(region);
        match out.last_mut() {
            Some(p)
                if same_region
                    && p.backing == backing
                    && gpa >= p.gpa.0
                    && gpa <= p.gpa.0 + p.len =>
            {
                p.len = p.len.max(gpa + PFN_PAGE_SIZE - p.gpa.0);
                p.bits.push(bit);
            }
            _ => out.push(PlannedDiscard {
                gpa: GuestAddress(gpa),
                len: PFN_PAGE_SIZE,
                backing,
                bits: vec![bit],
            }),
        }
    }
    out
}

/// One discard per completed huge host page, with the bits of its PFNs in this request.
fn complete_huge_pages(
    mut huge: HashMap<u64, (u64, Backing, Vec<u32>)>,
    mut complete: Vec<u64>,
) -> Vec<PlannedDiscard> {
    complete.sort_unstable();
    complete.dedup();
    complete
        .into_iter()
        .map(|base| {
            let (ps, backing, bits) = huge.remove(&base).expect("completed page was seen");
            PlannedDiscard {
                gpa: GuestAddress(base),
                len: ps,
                backing,
                bits,
            }
        })
        .collect()
}

/// The 4 KiB pages of `pfns` as runs `(start, length)`: sorted, duplicates merged,
/// contiguous pages joined inside one region (a run never spans two mappings). PFNs
/// outside guest memory are skipped (a parsed request has none).
pub(crate) fn page_runs<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    pfns: &[Pfn4k],
) -> Vec<(GuestAddress, u64)> {
    let mut sorted: Vec<Pfn4k> = pfns.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(GuestAddress, u64, u64)> = Vec::new(); // (start, len, region)
    for p in sorted {
        let Ok(r) = region_range(mem, QueueKind::Deflate, p.gpa(), PFN_PAGE_SIZE) else {
            continue;
        };
        match runs.last_mut() {
            Some((start, len, region))
                if *region == r.region_start.0 && start.0 + *len == p.gpa().0 =>
            {
                *len += PFN_PAGE_SIZE;
            }
            _ => runs.push((p.gpa(), PFN_PAGE_SIZE, r.region_start.0)),
        }
    }
    runs.into_iter().map(|(s, l, _)| (s, l)).collect()
}

/// Writes the inflate bitmap: clears `len` bytes at `addr`, then sets `bits`.
pub(crate) fn bitmap_bytes(n_pfns: usize, zero_bits: &[u32]) -> Vec<u8> {
    let mut bytes = vec![0u8; n_pfns.div_ceil(8)];
    for b in zero_bits {
        bytes[*b as usize / 8] |= 1 << (b % 8);
    }
    bytes
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "small test constants on a 64-bit host"
)]
mod tests {
    use super::*;
    use crate::mock::RecordingDiscarder;
    use vm_memory::GuestMemoryMmap;

    const MB2: u64 = 2 << 20;

    #[test]
    fn small_pages_merge_into_runs_keeping_every_bit() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let mut d = RecordingDiscarder::default();
        let mut partial = PartialPages::default();
        let pfns = [Pfn4k(5), Pfn4k(3), Pfn4k(4), Pfn4k(4), Pfn4k(9)];
        let (plan, errs) = plan(&mem, &mut d, &mut partial, &pfns);
        assert_eq!(errs, 0);
        assert_eq!(plan.len(), 2);
        assert_eq!((plan[0].gpa, plan[0].len), (GuestAddress(0x3000), 0x3000));
        let mut bits = plan[0].bits.clone();
        bits.sort();
        assert_eq!(bits, vec![0, 1, 2, 3]);
        assert_eq!(
            (plan[1].gpa, plan[1].bits.clone()),
            (GuestAddress(0x9000), vec![4])
        );
    }

    #[test]
    fn huge_pages_discard_only_when_complete_across_requests() {
        let mem =
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 * MB2 as usize)]).unwrap();
        let mut d = RecordingDiscarder::default();
        d.backings.insert(
            0,
            Backing::Hugetlb {
                page_size: MB2 as usize,
            },
        );
        let mut partial = PartialPages::default();
        let first: Vec<Pfn4k> = (0..256).map(Pfn4k).collect();
        let (p, _) = plan(&mem, &mut d, &mut partial, &first);
        assert!(p.is_empty(), "half a huge page is not discarded");
        assert_eq!(partial.len(), 1);
        // A deflated PFN must be re-inflated before the page completes.
        partial.remove(0x1000);
        let second: Vec<Pfn4k> = (256..512).map(Pfn4k).collect();
        assert!(plan(&mem, &mut d, &mut partial, &second).0.is_empty());
        let (p, _) = plan(&mem, &mut d, &mut partial, &[Pfn4k(1)]);
        assert_eq!(p.len(), 1);
        assert_eq!(
            (p[0].gpa, p[0].len, p[0].bits.clone()),
            (GuestAddress(0), MB2, vec![0])
        );
        assert!(partial.is_empty());
    }

    #[test]
    fn bitmap_sets_only_given_bits() {
        assert_eq!(bitmap_bytes(9, &[0, 8]), vec![1, 1]);
        assert_eq!(bitmap_bytes(0, &[]), Vec::<u8>::new());
        assert_eq!(bitmap_bytes(8, &[7]), vec![0x80]);
    }

    #[test]
    fn inflating_a_gigabyte_host_page_in_order_takes_linear_time() {
        // A guest inflating a 1 GiB hugetlb page PFN by PFN in ascending order (as Linux
        // tends to): 262,144 adds. Scanning every sub-page on each add would make this
        // ~3.4e10 steps (minutes of device time per notification).
        const GB: u64 = 1 << 30;
        let mut partial = PartialPages::default();
        // (A quadratic implementation runs for minutes here: nextest's slow-timeout in
        // .config/nextest.toml terminates it, so such a change fails CI.)
        let n = GB / PFN_PAGE_SIZE;
        for i in 0..n {
            let full = partial.add(0, GB, i * PFN_PAGE_SIZE);
            assert_eq!(full, i == n - 1, "complete only with the last sub-page");
        }
        assert!(partial.is_empty());
        // Duplicates do not count twice.
        assert!(!partial.add(0, GB, 0));
        assert!(!partial.add(0, GB, 0));
        assert_eq!(partial.len(), 1);
    }

    #[test]
    fn deflating_with_many_partial_pages_takes_no_time_per_page() {
        // 16384 partial 2 MiB pages (32 GiB of guest RAM, sub-page 0 of each inflated),
        // then a maximal deflate of 64 Ki PFNs that are not in the balloon: scanning every
        // partial page per PFN was 1e9 steps per request, hundreds per notification.
        const PAGES: u64 = 16384;
        let mut partial = PartialPages::default();
        for p in 0..PAGES {
            assert!(!partial.add(p * MB2, MB2, p * MB2));
        }
        for i in 0..MAX_PFNS_PER_REQUEST as u64 {
            partial.remove((i % PAGES) * MB2 + PFN_PAGE_SIZE);
        }
        assert_eq!(
            partial.len(),
            PAGES as usize,
            "nothing of theirs was deflated"
        );
        // Deflating sub-page 0 of the first 100 pages empties (forgets) them.
        for p in 0..100 {
            partial.remove(p * MB2);
        }
        assert_eq!(partial.len(), PAGES as usize - 100);
    }

    #[test]
    fn partial_pages_of_a_changed_backing_never_complete_with_stale_bits() {
        // Sub-page 1 of a 1 GiB page recorded, then the VMM's map changes and the same
        // range is 2 MiB pages. A deflate of that PFN, then inflating the rest of the
        // 1 GiB page, must not complete it with the stale (deflated) bit.
        const GB: u64 = 1 << 30;
        let mut partial = PartialPages::default();
        assert!(!partial.add(0, GB, PFN_PAGE_SIZE));
        assert!(!partial.add(0, MB2, 0)); // same base, other page size
        assert!(!partial.add(MB2, MB2, MB2)); // overlaps the old 1 GiB record
        partial.remove(PFN_PAGE_SIZE);
        let mut completed = false;
        for i in (0..GB / PFN_PAGE_SIZE).filter(|&i| i != 1) {
            completed |= partial.add(0, GB, i * PFN_PAGE_SIZE);
        }
        assert!(
            !completed,
            "sub-page 1 was deflated: the page is not complete"
        );
        // With non-multiple-of-64 sub-page counts (64 KiB pages: 16 sub-pages) the page
        // completes exactly when its 16 sub-pages are in.
        let mut p = PartialPages::default();
        let kb64 = 64 << 10;
        for i in 0..15 {
            assert!(!p.add(GB, kb64, GB + i * PFN_PAGE_SIZE));
        }
        p.remove(GB + kb64); // the next page's first sub-page: not ours
        assert!(p.add(GB, kb64, GB + 15 * PFN_PAGE_SIZE));
        // An odd page size (64 sub-pages and a half) indexes inside its record.
        let odd = 64 * PFN_PAGE_SIZE + 2048;
        assert!(!PartialPages::default().add(0, odd, 64 * PFN_PAGE_SIZE));
    }
}
