//! The real [`Zeroer`] of process mode: zeroes and checks pages of a [`SharedRam`] with
//! zeronce-mem's kernels (verify mode reads the memory). With a [`ZeroMap`] it zeroes only
//! the pages not known zero there, and counts what it zeroed.

use std::sync::Arc;

use zeronce_mem::{SharedRam, ZeroKernel};
use zeronce_mm::{PageRange, Pfn, Zeroer, PAGE_SIZE};

use super::zeromap::{Site, ZeroMap};

/// Zeroes blocks of a [`SharedRam`]; page frame `n` is byte offset `n * 4096`.
#[derive(Debug, Clone)]
pub struct RamZeroer {
    ram: Arc<SharedRam>,
    map: Option<Arc<ZeroMap>>,
}

impl RamZeroer {
    /// A zeroer over `ram`.
    pub fn new(ram: Arc<SharedRam>) -> Self {
        RamZeroer { ram, map: None }
    }

    /// A zeroer over `ram` that consults and updates `map` (process mode).
    pub(crate) fn with_map(ram: Arc<SharedRam>, map: Arc<ZeroMap>) -> Self {
        RamZeroer {
            ram,
            map: Some(map),
        }
    }

    fn bytes(range: PageRange) -> (usize, usize) {
        ((range.start.0 * PAGE_SIZE) as usize, range.bytes() as usize)
    }

    /// Zeroes `range` (which nobody else holds), part of a block of `block_bytes` about to
    /// be handed out, the page `hint_last` last.
    fn zero_range(&self, range: PageRange, block_bytes: u64, hint_last: Option<Pfn>) {
        let (offset, len) = Self::bytes(range);
        // The manager zeroes a block it is about to hand out: nobody else can hold it.
        let mut r = self
            .ram
            .claim(offset, len)
            .unwrap_or_else(|e| panic!("zeroing a block someone still holds: {e}"));
        let hint = hint_last
            .filter(|h| range.contains(*h))
            .map(|h| ((h.0 - range.start.0) * PAGE_SIZE) as usize);
        let kernel = ZeroKernel::for_immediate_use(block_bytes as usize, len);
        r.zero_with(kernel, hint);
    }
}

/// The pages `a` and `b` share (empty if none).
fn intersect(a: PageRange, b: PageRange) -> PageRange {
    let start = a.start.max(b.start);
    let end = a.end().min(b.end());
    PageRange::new(start, end.0.saturating_sub(start.0))
}

impl Zeroer for RamZeroer {
    fn zero(&self, range: PageRange, hint_last: Option<Pfn>) -> u64 {
        let Some(map) = &self.map else {
            self.zero_range(range, range.bytes(), hint_last);
            return range.bytes();
        };
        let mut written = 0;
        // Chunk by chunk, the hint's chunk last; chunks known zero are skipped.
        let hinted = hint_last
            .filter(|h| range.contains(*h))
            .map(|h| (h.0 >> map.chunk_order().get()) as usize);
        let chunks = map.chunks_of(range);
        let order = chunks
            .clone()
            .filter(|&i| Some(i) != hinted)
            .chain(hinted.filter(|i| chunks.contains(i)));
        for i in order {
            let part = intersect(range, map.chunk_range(i));
            if part.pages == 0 {
                continue;
            }
            if map.take_for_zeroing(i) {
                map.count_skipped(part.bytes());
                continue;
            }
            // Only the pages written since they were last zeroed.
            let mut zeroed = 0;
            map.for_each_written_run(part, |run| {
                self.zero_range(run, range.bytes(), hint_last);
                zeroed += run.bytes();
            });
            map.zeroed(part);
            map.count_zeroed(Site::AllocPath, zeroed);
            if zeroed < part.bytes() {
                map.count_skipped(part.bytes() - zeroed);
            }
            written += zeroed;
        }
        written
    }

    fn is_zero(&self, range: PageRange) -> bool {
        let (offset, len) = Self::bytes(range);
        // A block someone holds cannot be vouched for: not zero.
        self.ram.claim(offset, len).is_ok_and(|r| r.is_zero())
    }
}
