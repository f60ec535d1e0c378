//! Test doubles shared by the integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use zeronce_mm::{hint_last_order, Block, MemoryManager, MmConfig, Order, PageRange, Pfn, Zeroer};

/// Fake memory: one "has non-zero bytes" bit per page, plus a log of zeroed pages in order.
#[derive(Default)]
pub struct FakeMem {
    /// `dirty[pfn]`: the page holds non-zero bytes.
    pub dirty: Vec<bool>,
    /// Every page zeroed, in the order it was written.
    pub zero_log: Vec<Pfn>,
    /// Number of `is_zero` calls.
    pub checks: usize,
}

/// A [`Zeroer`] over [`FakeMem`].
#[derive(Clone)]
pub struct FakeZeroer(pub Arc<Mutex<FakeMem>>);

impl FakeZeroer {
    /// Memory of `pages` pages, all reading `dirty`.
    pub fn new(pages: u64, dirty: bool) -> FakeZeroer {
        FakeZeroer(Arc::new(Mutex::new(FakeMem {
            dirty: vec![dirty; pages as usize],
            ..FakeMem::default()
        })))
    }

    /// The caller writes non-zero bytes to every page of `range`.
    pub fn scribble(&self, range: PageRange) {
        let mut m = self.0.lock().unwrap();
        for p in range.start.0..range.end().0 {
            m.dirty[p as usize] = true;
        }
    }

    /// Whether every page of `range` reads zero.
    pub fn reads_zero(&self, range: PageRange) -> bool {
        let m = self.0.lock().unwrap();
        (range.start.0..range.end().0).all(|p| !m.dirty[p as usize])
    }

    /// Takes the log of zeroed pages.
    pub fn take_log(&self) -> Vec<Pfn> {
        std::mem::take(&mut self.0.lock().unwrap().zero_log)
    }
}

impl Zeroer for FakeZeroer {
    fn zero(&self, range: PageRange, hint_last: Option<Pfn>) -> u64 {
        let mut m = self.0.lock().unwrap();
        for part in hint_last_order(range, hint_last) {
            for p in part.start.0..part.end().0 {
                m.dirty[p as usize] = false;
                m.zero_log.push(Pfn(p));
            }
        }
        range.bytes()
    }

    fn is_zero(&self, range: PageRange) -> bool {
        let mut m = self.0.lock().unwrap();
        m.checks += 1;
        (range.start.0..range.end().0).all(|p| !m.dirty[p as usize])
    }
}

/// A manager over one zone `[0, pages)` with `max_order`, verify on, backed by fake memory
/// that starts dirty.
pub fn manager(pages: u64, max_order: u8, verify: bool) -> (MemoryManager, FakeZeroer) {
    let z = FakeZeroer::new(pages, true);
    let mut cfg = MmConfig::new(vec![PageRange::new(Pfn(0), pages)]);
    cfg.max_order = Order::new(max_order).unwrap();
    cfg.reporting_order = cfg.reporting_order.min(cfg.max_order);
    cfg.verify = verify;
    let mm = MemoryManager::new(cfg, Arc::new(z.clone())).unwrap();
    (mm, z)
}

/// Shorthand for an order.
pub fn o(order: u8) -> Order {
    Order::new(order).unwrap()
}

/// Shorthand for a block.
pub fn blk(pfn: u64, order: u8) -> Block {
    Block::new(Pfn(pfn), o(order))
}
