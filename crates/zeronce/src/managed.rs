//! What process mode and VM mode share: a [`MemoryManager`] over a [`SharedRam`] behind
//! its fast path, and the reporting worker wired to its free path (whatever the reporting
//! device is). The handles both hand out are [`crate::block`]'s.

use std::sync::Arc;

use zeronce_mem::SharedRam;
use zeronce_mm::reporting::{
    PassReport, Reporter, ReportingConfig, ReportingConfigError, ReportingDevice,
};
use zeronce_mm::{ConfigError, FreeState, MemoryManager, MmConfig, Order, PageRange, Pfn};

use crate::block::Caches;
use crate::builder::ManagerSettings;
use crate::error::BuildError;
use crate::zeroing::zeromap::ZeroMap;
use crate::zeroing::{Lifecycle, RamZeroer};

/// A manager over some RAM, with reporting to a device of type `D` (or none).
pub(crate) struct ManagedMemory<D: ReportingDevice + 'static> {
    // Field order is drop order: the zeroer and reporter threads stop before the manager.
    /// The zero-once lifecycle (process mode only).
    pub(crate) life: Option<Arc<Lifecycle>>,
    pub(crate) reporter: Option<Reporter<Caches, D>>,
    /// The fast path in front of `mm` (also the reporting engine's view of it).
    pub(crate) caches: Arc<Caches>,
    pub(crate) mm: Arc<MemoryManager>,
    pub(crate) ram: Arc<SharedRam>,
}

impl ManagerSettings {
    /// The manager of `pages` pages from page frame 0 of `ram` (the rest of the RAM is
    /// not the allocator's), zeroing with [`RamZeroer`] (consulting `map` if given);
    /// `reporting_order` when reporting is on.
    pub(crate) fn build_manager(
        &self,
        ram: &Arc<SharedRam>,
        pages: u64,
        reporting_order: Option<Order>,
        map: Option<Arc<ZeroMap>>,
    ) -> Result<Arc<MemoryManager>, ConfigError> {
        let mut config = MmConfig::new(vec![PageRange::new(Pfn(0), pages)]);
        config.max_order = self.max_order;
        config.verify = self.verify;
        config.reported_not_zero = self.reported_not_zero;
        config.initial_state = if self.fresh_is_zero {
            FreeState::REPORTED_ZERO
        } else {
            FreeState::DIRTY
        };
        if let Some(order) = reporting_order {
            config.reporting_order = order;
        }
        let ram = Arc::clone(ram);
        let zeroer = match map {
            Some(map) => RamZeroer::with_map(ram, map),
            None => RamZeroer::new(ram),
        };
        Ok(Arc::new(MemoryManager::new(config, Arc::new(zeroer))?))
    }
}

/// Refuses a reporting `order` whose blocks are smaller than the backing's `page_size`
/// (hugetlb discards whole huge pages only).
pub(crate) fn check_reporting_order(order: Order, page_size: usize) -> Result<(), BuildError> {
    if (order.bytes() as usize) < page_size {
        return Err(BuildError::OrderBelowPageSize { order, page_size });
    }
    Ok(())
}

/// Starts the reporting worker for the manager behind `caches` and `device`, and hooks it
/// to the free path (the zone's and the caches' kept blocks).
pub(crate) fn start_reporter<D: ReportingDevice + 'static>(
    caches: &Arc<Caches>,
    device: D,
    config: ReportingConfig,
) -> Result<Reporter<Caches, D>, ReportingConfigError> {
    let reporter = Reporter::start_with(
        Arc::clone(caches),
        device,
        config,
        crate::threads::mark_internal_thread,
    )?;
    let mm = caches.manager();
    let notifier = reporter.notifier();
    let order = config.order;
    caches.set_report_notifier(reporter.notifier(), order);
    // Linux page_reporting_notify_free: the manager calls it only for merged unreported
    // blocks of reporting order or above; it is one atomic load unless the engine is IDLE.
    if mm
        .set_report_notifier(Box::new(move |_zone| notifier.freed(order)))
        .is_err()
    {
        unreachable!("a new manager has no notifier");
    }
    Ok(reporter)
}

impl<D: ReportingDevice + 'static> ManagedMemory<D> {
    /// Reports up to `max_pages` free pages now (ignoring delay and budget), after the
    /// per-thread caches went back to the manager (so their blocks merge and are reported
    /// too); an empty pass when reporting is off.
    pub(crate) fn flush(&self, max_pages: u64) -> PassReport {
        self.caches.drain();
        self.reporter
            .as_ref()
            .map_or_else(PassReport::default, |r| r.flush(max_pages))
    }
}
