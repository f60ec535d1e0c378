//! [`ReportingHooks`] for [`MemoryManager`]: the engine's view of the buddy allocator.

use super::device::{ReportingHooks, Wanted};
use crate::error::PutBackError;
use crate::manager::{MemoryManager, PutBack};
use crate::types::{Block, Order, ZoneId};

impl ReportingHooks for MemoryManager {
    fn zone_count(&self) -> usize {
        MemoryManager::zone_count(self)
    }

    fn max_order(&self) -> Order {
        self.config().max_order
    }

    fn zone_free_pages(&self, zone: ZoneId) -> u64 {
        self.zone_info(zone).map_or(0, |i| i.free_pages)
    }

    fn zone_low_watermark(&self, zone: ZoneId) -> u64 {
        self.zone_info(zone).map_or(u64::MAX, |i| i.low_watermark)
    }

    fn nr_free(&self, zone: ZoneId, order: Order) -> u64 {
        MemoryManager::nr_free(self, zone, order).total()
    }

    fn isolate(
        &self,
        zone: ZoneId,
        order: Order,
        wanted: Wanted,
        max: usize,
        out: &mut Vec<Block>,
    ) {
        let got = match wanted {
            Wanted::Unreported => self.isolate_unreported(zone, order, order, max),
            Wanted::ReportedNotZero => self.isolate_reported_not_zero(zone, order, order, max),
        };
        out.extend(got.into_iter().map(|i| i.block));
    }

    fn put_back(&self, block: Block, how: PutBack) -> Result<(), PutBackError> {
        MemoryManager::put_back(self, block, how)
    }

    fn reportable_allocs(&self) -> u64 {
        let from = self.config().reporting_order.index();
        self.stats().allocs.iter().skip(from).sum()
    }
}
