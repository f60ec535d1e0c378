//! The real [`Zeroer`] of process mode: zeroes and checks pages of a [`SharedRam`] with
//! zeronce-mem's kernels (verify mode reads the memory).

use std::sync::Arc;

use zeronce_mem::SharedRam;
use zeronce_mm::{PageRange, Pfn, Zeroer, PAGE_SIZE};

/// Zeroes blocks of a [`SharedRam`]; page frame `n` is byte offset `n * 4096`.
#[derive(Debug, Clone)]
pub struct RamZeroer {
    ram: Arc<SharedRam>,
}

impl RamZeroer {
    /// A zeroer over `ram`.
    pub fn new(ram: Arc<SharedRam>) -> Self {
        RamZeroer { ram }
    }

    fn bytes(range: PageRange) -> (usize, usize) {
        ((range.start.0 * PAGE_SIZE) as usize, range.bytes() as usize)
    }
}

impl Zeroer for RamZeroer {
    fn zero(&self, range: PageRange, hint_last: Option<Pfn>) {
        let (offset, len) = Self::bytes(range);
        // The manager zeroes a block it is about to hand out: nobody else can hold it.
        let mut r = self
            .ram
            .claim(offset, len)
            .unwrap_or_else(|e| panic!("zeroing a block someone still holds: {e}"));
        let hint = hint_last.map(|h| ((h.0 - range.start.0) * PAGE_SIZE) as usize);
        r.zero(hint);
    }

    fn is_zero(&self, range: PageRange) -> bool {
        let (offset, len) = Self::bytes(range);
        // A block someone holds cannot be vouched for: not zero.
        self.ram.claim(offset, len).is_ok_and(|r| r.is_zero())
    }
}
