//! The [`World`]'s construction, model bookkeeping and checks against the manager.

use proptest::prelude::*;
use std::sync::Arc;
use zeronce_mm::*;

use crate::common::FakeZeroer;
use crate::ops::Setup;
use crate::{fail, Page, World};

impl World {
    pub(crate) fn new(s: &Setup) -> World {
        let mut zones = Vec::new();
        let mut next = 0;
        for &(gap, len) in &s.zones {
            zones.push(PageRange::new(Pfn(next + gap), len));
            next += gap + len;
        }
        let mut pages = vec![Page::Hole; next as usize];
        for z in &zones {
            for p in z.start.0..z.end().0 {
                pages[p as usize] = Page::Free(s.initial);
            }
        }
        // Memory claimed zero at start must be zero; otherwise it holds garbage.
        let mem = FakeZeroer::new(next, !s.initial.known_zero);
        let mut cfg = MmConfig::new(zones.clone());
        cfg.max_order = Order::new(s.max_order).unwrap();
        cfg.reporting_order = cfg.max_order;
        cfg.verify = true;
        cfg.initial_state = s.initial;
        cfg.reported_not_zero = s.reported_not_zero;
        cfg.pcp_batch_pages = 4;
        cfg.pcp_high_pages = 8;
        let mm = Arc::new(MemoryManager::new(cfg, Arc::new(mem.clone())).unwrap());
        World {
            cache: PcpCache::new(mm.clone()),
            mm,
            mem,
            pages,
            zones,
            live: vec![],
            freed: vec![],
            isolated: vec![],
        }
    }

    pub(crate) fn set(&mut self, block: Block, page: Page) {
        for p in block.range().start.0..block.range().end().0 {
            self.pages[p as usize] = page;
        }
    }

    /// Model pages of `block`.
    pub(crate) fn model(&self, block: Block) -> &[Page] {
        &self.pages[block.pfn.0 as usize..block.range().end().0 as usize]
    }

    /// After a block went back to the free lists: the block it merged into must consist of
    /// free pages and have the conjunction of their states; the model adopts that state.
    pub(crate) fn absorb_merge(&mut self, block: Block) -> Result<(), TestCaseError> {
        let (merged, state) = self
            .mm
            .free_state_of(block.pfn)
            .ok_or_else(|| fail("freed block not free"))?;
        prop_assert!(merged.range().contains_range(&block.range()));
        let mut expect = FreeState::REPORTED_ZERO;
        for page in self.model(merged) {
            let Page::Free(s) = page else {
                return Err(fail("merged with a non-free page"));
            };
            expect = expect.merge(*s);
        }
        prop_assert_eq!(state, expect, "merge rule violated for {}", merged);
        self.set(merged, Page::Free(state));
        Ok(())
    }

    /// Manager view == model, page by page; known zero is true; counters agree.
    pub(crate) fn check(&self) -> Result<(), TestCaseError> {
        self.mm
            .check_invariants()
            .map_err(|e| fail(&e.to_string()))?;
        let (mut free, mut isolated, mut allocated, mut cached) = (0, 0, 0, 0);
        for (p, page) in self.pages.iter().enumerate() {
            let view = self.mm.free_state_of(Pfn(p as u64));
            match page {
                Page::Free(s) => {
                    free += 1;
                    let (block, state) = view.ok_or_else(|| fail("model-free page not free"))?;
                    prop_assert_eq!(state, *s, "state of pfn {}", p);
                    if state.known_zero {
                        prop_assert!(
                            self.mem.reads_zero(block.range()),
                            "{} known zero but dirty",
                            block
                        );
                    }
                }
                Page::Hole => prop_assert!(self.mm.zone_of(Pfn(p as u64)).is_none()),
                Page::Cached(s) => {
                    prop_assert!(view.is_none(), "cached pfn {} is on a free list", p);
                    prop_assert!(!s.known_zero, "a cache holds known-zero pfn {}", p);
                    cached += 1;
                }
                Page::Allocated | Page::Isolated(_) => {
                    prop_assert!(view.is_none(), "pfn {} should not be free", p);
                    if matches!(page, Page::Allocated) {
                        allocated += 1;
                    } else {
                        isolated += 1;
                    }
                }
            }
        }
        let s = self.mm.stats();
        // Cache pages are published at batch points: only their sum with allocated is exact.
        prop_assert_eq!(
            (
                s.free_pages_total(),
                s.isolated_pages,
                s.allocated_pages + s.cached_pages
            ),
            (free, isolated, allocated + cached)
        );
        Ok(())
    }

    /// Blocks of `order` or above on the free lists of each zone, known zero / dirty.
    pub(crate) fn available(&self, order: Order) -> Vec<(u64, u64)> {
        self.available_by_state(order)
            .iter()
            .map(|c| (c.zero + c.reported_zero, c.dirty + c.reported_dirty))
            .collect()
    }

    /// Blocks of `order` or above on the free lists of each zone, per state.
    pub(crate) fn available_by_state(&self, order: Order) -> Vec<zeronce_mm::FreeCounts> {
        (0..self.zones.len())
            .map(|z| {
                let info = self.mm.zone_info(ZoneId(z)).unwrap();
                info.nr_free[order.index().min(NR_ORDERS)..].iter().fold(
                    zeronce_mm::FreeCounts::default(),
                    |mut sum, c| {
                        sum.add_scaled(c, 1);
                        sum
                    },
                )
            })
            .collect()
    }

    /// Frees through the cache or the manager.
    pub(crate) fn free_via(
        &mut self,
        via_cache: bool,
        b: Block,
        hint: FreeHint,
    ) -> Result<(), FreeError> {
        if via_cache {
            self.cache.free(b, hint)
        } else {
            self.mm.free(b, hint)
        }
    }

    /// Brings the model in line with the cache's contents after a step: blocks the cache
    /// took from the lists must have had the model's state (and never known zero); blocks
    /// it gave back are merged by the ∧ rule.
    pub(crate) fn reconcile(&mut self) -> Result<(), TestCaseError> {
        let now = self.cache.cached_blocks();
        let mut held = vec![false; self.pages.len()];
        for &(_, b, state) in &now {
            prop_assert!(!state.known_zero, "cache holds known-zero {}", b);
            for page in self.model(b) {
                let ok = *page == Page::Cached(state) || *page == Page::Free(state);
                prop_assert!(ok, "cached {} in state {:?} was {:?}", b, state, page);
            }
            self.set(b, Page::Cached(state));
            held[b.pfn.0 as usize..b.range().end().0 as usize].fill(true);
        }
        let drained: Vec<usize> = (0..self.pages.len())
            .filter(|&p| matches!(self.pages[p], Page::Cached(_)) && !held[p])
            .collect();
        for &p in &drained {
            if let Page::Cached(s) = self.pages[p] {
                self.pages[p] = Page::Free(s);
            }
        }
        for p in drained {
            self.absorb_merge(Block::new(Pfn(p as u64), Order::ZERO))?;
        }
        Ok(())
    }

    pub(crate) fn unchanged(&self, before: &Stats) -> Result<(), TestCaseError> {
        let now = self.mm.stats();
        prop_assert_eq!(
            Stats {
                verify_failures: before.verify_failures,
                ..now
            },
            before.clone(),
            "a refused operation changed the manager"
        );
        Ok(())
    }

    pub(crate) fn unchanged_except_failures(&self, before: &Stats) -> Result<(), TestCaseError> {
        let now = self.mm.stats();
        prop_assert_eq!(now.alloc_failures, before.alloc_failures + 1);
        prop_assert_eq!(
            Stats {
                alloc_failures: before.alloc_failures,
                ..now
            },
            before.clone()
        );
        Ok(())
    }

    pub(crate) fn unchanged_except_verify(&self, before: &Stats) -> Result<(), TestCaseError> {
        let now = self.mm.stats();
        prop_assert_eq!(now.verify_failures, before.verify_failures + 1);
        self.unchanged(before)
    }
}
