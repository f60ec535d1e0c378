//! [`ReportingHooks`] for a [`MemoryManager`]: the engine's view of the buddy allocator,
//! for the manager itself and for anything in front of it ([`ManagerHooks`]).

use super::device::{ReportingHooks, Wanted};
use crate::error::PutBackError;
use crate::manager::{MemoryManager, PutBack};
use crate::types::{Block, Order, ZoneId};

/// A manager as the reporting engine sees it, with one step of its own before each pass:
/// e.g. caches in front of the manager giving their blocks back, so the pass can report
/// them. Every `ManagerHooks` is [`ReportingHooks`].
pub trait ManagerHooks {
    /// The manager reported from.
    fn manager(&self) -> &MemoryManager;
    /// Runs before each scheduled or flush pass (see [`ReportingHooks::before_pass`]).
    fn before_pass(&self) {}
}

impl ManagerHooks for MemoryManager {
    fn manager(&self) -> &MemoryManager {
        self
    }
}

impl<H: ManagerHooks> ReportingHooks for H {
    fn zone_count(&self) -> usize {
        self.manager().zone_count()
    }

    fn max_order(&self) -> Order {
        self.manager().config().max_order
    }

    fn zone_free_pages(&self, zone: ZoneId) -> u64 {
        self.manager().zone_info(zone).map_or(0, |i| i.free_pages)
    }

    fn zone_low_watermark(&self, zone: ZoneId) -> u64 {
        self.manager()
            .zone_info(zone)
            .map_or(u64::MAX, |i| i.low_watermark)
    }

    fn nr_free(&self, zone: ZoneId, order: Order) -> u64 {
        self.manager().nr_free(zone, order).total()
    }

    fn isolate(
        &self,
        zone: ZoneId,
        order: Order,
        wanted: Wanted,
        max: usize,
        out: &mut Vec<Block>,
    ) {
        let mm = self.manager();
        let got = match wanted {
            Wanted::Unreported => mm.isolate_unreported(zone, order, order, max),
            Wanted::ReportedNotZero => mm.isolate_reported_not_zero(zone, order, order, max),
        };
        out.extend(got.into_iter().map(|i| i.block));
    }

    fn put_back(&self, block: Block, how: PutBack) -> Result<(), PutBackError> {
        self.manager().put_back(block, how)
    }

    fn reportable_allocs(&self) -> u64 {
        let mm = self.manager();
        let from = mm.config().reporting_order.index();
        mm.stats().allocs.iter().skip(from).sum()
    }

    fn before_pass(&self) {
        ManagerHooks::before_pass(self);
    }
}
