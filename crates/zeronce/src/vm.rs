//! VM mode (docs/ARCHITECTURE.md §1): the guest allocator reports through a virtio-balloon *driver*
//! over split virtqueues that live in guest RAM; the *device* (`zeronce_balloon`'s
//! [`BalloonDevice`]) runs in a thread of this process and punches holes in the guest
//! RAM's memfd, then says with `used_len` which blocks now read zero.
//!
//! Two mappings of one memfd: the guest's ([`SharedRam`], where the allocator's blocks
//! live, plus a small vm-memory mapping of the ring area for the driver) and the
//! device's ([`GuestMemoryMmap`] over a dup of the fd). The ring area is carved from the
//! top of the RAM and never handed to the allocator.
//!
//! ```no_run
//! use zeronce::{Order, VmMemory};
//! let vm = VmMemory::builder().size(256 << 20).build()?;
//! drop(vm.alloc(Order::new(9)?)?); // freed dirty
//! vm.flush(u64::MAX); // reported now: the device discards, used_len says "zero"
//! let b = vm.alloc_zeroed(Order::new(9)?)?; // served without zeroing
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why a type of its own rather than a "host" switch on [`crate::ProcessMemory`]'s
//! builder: VM mode needs a file-backed RAM, a ring area outside the allocator, feature
//! offers and driver options that mean nothing to process mode. Both share the manager,
//! the reporting worker wiring, the fast path and [`PageBlock`].

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::{
    BalloonDevice, BalloonMetrics, BalloonOptions, DiscardPolicy, FeatureOffer, FeatureSet,
    MetricsSnapshot, MmapDiscarder, StatTag,
};
use zeronce_balloon_driver::{
    BalloonDriver, DriverError, DriverOptions, DriverStats, InProcessTransport, Transport,
    TransportError, UsedSignal,
};
use zeronce_mem::{BackingKind, GuestRam, SharedRam};
use zeronce_mm::reporting::{
    PassReport, Reporter, ReporterHealth, ReportingConfig, ReportingStats,
};
use zeronce_mm::{AllocError, AllocRequest, MemoryManager, Order, Stats, PAGE_SIZE};

use crate::block::{Caches, Owners, PageBlock, Writes};
use crate::builder::Builder;
use crate::error::{BlockError, BuildError};
use crate::managed::{self, ManagedMemory};

/// The driver of VM mode: over the guest's mapping of the ring area, to the device
/// wherever it runs ([`DeviceHost`]).
pub type VmDriver = BalloonDriver<GuestMemoryMmap, Box<dyn Transport>>;

/// Connects the driver to a device outside this process: gets a duplicate of the guest
/// RAM's file, its size in bytes (guest address 0 up) and the driver's interrupt line,
/// and returns the driver's transport to the device.
pub type ConnectDevice =
    dyn Fn(File, u64, Arc<UsedSignal>) -> Result<Box<dyn Transport>, TransportError> + Send + Sync;

/// Longest an allocation of [`VmMemory`] waits for blocks in flight to the host before it
/// fails with out of memory (see [`VmMemory::alloc_with`]).
pub const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);

/// Runs `alloc`; while it finds no free block and `in_flight` says blocks are being
/// reported, calls `wait_for_reports` and tries again, until `deadline`.
fn retry_while_in_flight<T>(
    mut alloc: impl FnMut() -> Result<T, BlockError>,
    in_flight: impl Fn() -> bool,
    mut wait_for_reports: impl FnMut(),
    deadline: Instant,
) -> Result<T, BlockError> {
    loop {
        match alloc() {
            Err(BlockError::Alloc(AllocError::OutOfMemory(_)))
                if in_flight() && Instant::now() < deadline =>
            {
                wait_for_reports();
            }
            r => return r,
        }
    }
}

/// Where VM mode's balloon device runs.
#[derive(Clone, Default)]
pub enum DeviceHost {
    /// A thread of this process (the in-process transport); the default.
    #[default]
    Thread,
    /// Elsewhere, e.g. a `zeronce serve` process over vhost-user (`zeronce-vhost`'s
    /// `VhostUserTransport`). That device's counters are its own: [`VmStats::device`]
    /// stays zero.
    External(Arc<ConnectDevice>),
}

impl std::fmt::Debug for DeviceHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceHost::Thread => "Thread",
            DeviceHost::External(_) => "External",
        })
    }
}

/// What only a VM-mode [`Builder`] has.
#[derive(Clone, Debug)]
pub struct VmMode {
    reporting: ReportingConfig,
    offer: FeatureOffer,
    policy: DiscardPolicy,
    driver: DriverOptions,
    device: DeviceHost,
}

/// Builder of [`VmMemory`]; see [`VmMemory::builder`].
pub type VmBuilder = Builder<VmMode>;

/// VM mode's setters and `build`; the shared ones are [`Builder`]'s.
impl Builder<VmMode> {
    /// Reporting engine settings (Linux defaults).
    pub fn reporting(mut self, config: ReportingConfig) -> Self {
        self.mode.reporting = config;
        self
    }

    /// Whether the device offers `DEVICE_INIT_REPORTED` (bit 6; default on). Off: a host
    /// without host-zeroed hints, every reported block comes back not known zero.
    pub fn zero_hints(mut self, on: bool) -> Self {
        self.mode.offer.device_init_reported = on;
        self
    }

    /// Whether the device offers the statistics queue (default on; it moves the
    /// reporting queue from index 2 to 3).
    pub fn stats_queue(mut self, on: bool) -> Self {
        self.mode.offer.stats_vq = on;
        self
    }

    /// Every feature the device offers.
    pub fn device_offer(mut self, offer: FeatureOffer) -> Self {
        self.mode.offer = offer;
        self
    }

    /// When and how the device discards (default: at once).
    pub fn discard_policy(mut self, policy: DiscardPolicy) -> Self {
        self.mode.policy = policy;
        self
    }

    /// Where the device runs (default: a thread of this process). With an external
    /// device, the feature offer and discard policy set here do not apply: the device
    /// has its own.
    pub fn device(mut self, host: DeviceHost) -> Self {
        self.mode.device = host;
        self
    }

    /// The guest driver's options (queue size, timeout, poison, what it accepts).
    pub fn driver(mut self, opts: DriverOptions) -> Self {
        self.mode.driver = opts;
        self
    }

    /// Maps the RAM twice, starts the device thread, probes the driver, builds the
    /// manager and starts reporting.
    pub fn build(self) -> Result<VmMemory, BuildError> {
        // (An external device's hold is its own: `policy` applies to the thread's device.)
        if let (DeviceHost::Thread, DiscardPolicy::Hold(delay)) =
            (&self.mode.device, self.mode.policy)
        {
            if delay >= self.mode.driver.timeout {
                return Err(BuildError::HoldNotBelowTimeout {
                    hold: delay,
                    timeout: self.mode.driver.timeout,
                });
            }
        }
        let ram = GuestRam::new(self.size, self.backing)?;
        let page_size = ram.backing().page_size();
        managed::check_reporting_order(self.mode.reporting.order, page_size)?;
        let dup = || -> Result<File, BuildError> {
            let fd = ram.fd().ok_or(BuildError::NotFileBacked(self.backing))?;
            Ok(File::from(fd.try_clone_to_owned()?))
        };
        let ring_len = VmDriver::ring_area_bytes(self.mode.driver.queue_size)
            .div_ceil(page_size as u64)
            * page_size as u64;
        let ring_gpa = (self.size as u64)
            .checked_sub(ring_len)
            .filter(|g| *g > 0)
            .ok_or(BuildError::TooSmall {
                size: self.size,
                ring: ring_len,
            })?;
        let ring_mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(ring_gpa),
            ring_len as usize,
            Some(FileOffset::new(dup()?, ring_gpa)),
        )])?;

        let irq = Arc::new(UsedSignal::new());
        let (transport, metrics): (Box<dyn Transport>, Arc<BalloonMetrics>) =
            match &self.mode.device {
                DeviceHost::Thread => {
                    let device_mem = GuestMemoryMmap::from_ranges_with_files([(
                        GuestAddress(0),
                        self.size,
                        Some(FileOffset::new(dup()?, 0)),
                    )])?;
                    let options = BalloonOptions {
                        offer: self.mode.offer,
                        policy: self.mode.policy,
                        ..BalloonOptions::default()
                    };
                    let device =
                        BalloonDevice::new(options, MmapDiscarder::new(), Arc::clone(&irq));
                    let metrics = device.metrics();
                    let transport = InProcessTransport::spawn(device, device_mem)?;
                    (Box::new(transport), metrics)
                }
                DeviceHost::External(connect) => {
                    let transport = connect(dup()?, self.size as u64, Arc::clone(&irq))
                        .map_err(DriverError::from)?;
                    (transport, Arc::default())
                }
            };
        let mut driver = VmDriver::probe(
            ring_mem,
            GuestAddress(ring_gpa),
            ring_len,
            transport,
            irq,
            self.mode.driver,
        )?;
        driver.post_stats(&[(StatTag::TotalMemory, ring_gpa)])?;
        let negotiated = driver.negotiated();
        let reporting_queue_index = driver.reporting_queue_index();

        let ram = SharedRam::new(ram);
        let mm = self.manager.build_manager(
            &ram,
            ring_gpa / PAGE_SIZE,
            Some(self.mode.reporting.order),
            None,
        )?;
        let caches = Arc::new(Caches::new(&mm, &ram, None));
        let reporter = managed::start_reporter(&caches, driver, self.mode.reporting)?;
        tracing::debug!(
            ?negotiated,
            reporting_queue_index,
            ring_gpa,
            "VM mode ready"
        );
        let inner = Arc::new(ManagedMemory {
            caches: Arc::clone(&caches),
            life: None,
            reporter: Some(reporter),
            mm,
            ram,
        });
        Ok(VmMemory {
            owners: Owners::new(Arc::clone(&inner) as _, &caches),
            inner,
            metrics,
            negotiated,
            reporting_queue_index,
            ring_area: (ring_gpa, ring_len),
        })
    }
}

/// Guest memory whose free blocks are reported through a virtio-balloon driver to a
/// device thread; see the module docs. Cheap to clone (shared); `Send + Sync`.
#[derive(Clone)]
pub struct VmMemory {
    inner: Arc<ManagedMemory<VmDriver>>,
    /// What blocks hold of `inner`.
    owners: Arc<Owners>,
    metrics: Arc<BalloonMetrics>,
    negotiated: FeatureSet,
    reporting_queue_index: u16,
    ring_area: (u64, u64),
}

/// Counters of a [`VmMemory`]: both sides of the virtqueue.
#[derive(Clone, Debug)]
pub struct VmStats {
    /// The manager's counters and free pages per (order, state).
    pub mm: Stats,
    /// The reporting engine's counters.
    pub reporting: ReportingStats,
    /// The guest driver's counters (reports, `used_len` verdicts, failures).
    pub driver: DriverStats,
    /// The device's counters (pages reported, bytes discarded, zero promises).
    pub device: MetricsSnapshot,
    /// Whether reporting still runs: the worker, the device panics it survived, the
    /// lies it caught, and why the driver stopped if it did.
    pub health: VmHealth,
}

/// Health of VM mode's reporting (see [`VmStats::health`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmHealth {
    /// The reporting worker.
    pub reporter: ReporterHealth,
    /// The failure that stopped the driver (it resets the device and reports nothing
    /// more; the blocks stay free, unreported): `None` while it runs. A panic of the
    /// device thread is one (fail-stop: "the device thread panicked: …"; the thread is
    /// not restarted, see `zeronce_balloon_driver`'s in-process transport).
    pub driver_broken: Option<String>,
}

impl VmMemory {
    /// A builder: 1 GiB memfd, device offering everything, Linux reporting defaults,
    /// driver queue size 64, max order 10.
    pub fn builder() -> VmBuilder {
        let mode = VmMode {
            reporting: ReportingConfig::default(),
            // Both sides are ours: the device offers the zero-hint proposal knowingly.
            offer: FeatureOffer::default().with_zero_hints(),
            policy: DiscardPolicy::Immediate,
            driver: DriverOptions::default(),
            device: DeviceHost::Thread,
        };
        Builder::with(1 << 30, BackingKind::Memfd, mode)
    }

    /// Allocates a block of `order` (`2^order` pages); contents unspecified.
    #[inline]
    pub fn alloc(&self, order: Order) -> Result<PageBlock, BlockError> {
        self.alloc_with(order, AllocRequest::DIRTY)
    }

    /// Allocates a block of `order` that reads zero (zeroed only if not known zero).
    pub fn alloc_zeroed(&self, order: Order) -> Result<PageBlock, BlockError> {
        self.alloc_with(order, AllocRequest::ZEROED)
    }

    /// Allocates with an explicit request (zeroing, hint page).
    ///
    /// When no free block is left but blocks are in flight to the host (isolated for a
    /// report), the allocation waits for those reports to complete (each is bounded by the
    /// driver's timeout), for at most [`IN_FLIGHT_WAIT`] in all, and tries again; then
    /// it fails with [`AllocError::OutOfMemory`].
    #[inline]
    pub fn alloc_with(&self, order: Order, req: AllocRequest) -> Result<PageBlock, BlockError> {
        let deadline = zeronce_types::clock::deadline_after(Instant::now(), IN_FLIGHT_WAIT);
        retry_while_in_flight(
            || self.owners.alloc(order, req, order.pages(), Writes::Block),
            || self.inner.mm.stats().isolated_pages > 0,
            // A pass holds the device while its blocks are isolated and puts them back
            // before it lets go: taking the device waits for the pass to end.
            || self.reporter().with_device(|_| ()),
            deadline,
        )
    }

    /// Reports up to `max_pages` free pages now through the virtqueue (ignoring delay
    /// and budget). Blocks in the per-thread caches go back to the allocator first.
    pub fn flush(&self, max_pages: u64) -> PassReport {
        self.inner.flush(max_pages)
    }

    fn reporter(&self) -> &Reporter<Caches, VmDriver> {
        self.inner
            .reporter
            .as_ref()
            .expect("VM mode always reports")
    }

    /// Counters of the manager, the engine, the driver and the device.
    pub fn stats(&self) -> VmStats {
        // Exact counts: blocks in the per-thread caches go back to the allocator first.
        let mm = self.inner.caches.stats();
        let r = self.reporter();
        VmStats {
            mm,
            reporting: r.stats(),
            driver: r.with_device(|d| d.stats()),
            device: self.metrics.snapshot(),
            health: VmHealth {
                reporter: r.health(),
                driver_broken: r.with_device(|d| d.broken_reason().map(str::to_string)),
            },
        }
    }

    /// The features the driver negotiated.
    pub fn negotiated(&self) -> FeatureSet {
        self.negotiated
    }

    /// Index of the reporting queue (2 without the statistics queue, 3 with it).
    pub fn reporting_queue_index(&self) -> u16 {
        self.reporting_queue_index
    }

    /// Whether the driver stopped after a failed report (device reset).
    pub fn driver_broken(&self) -> bool {
        self.reporter().with_device(|d| d.is_broken())
    }

    /// Guest physical start and length of the ring area (outside the allocator).
    pub fn ring_area(&self) -> (u64, u64) {
        self.ring_area
    }

    /// The manager (for invariant checks and low-level use).
    pub fn manager(&self) -> &MemoryManager {
        &self.inner.mm
    }

    /// The guest's RAM.
    pub fn ram(&self) -> &Arc<SharedRam> {
        &self.inner.ram
    }

    /// Bytes the memfd has allocated (what the host really holds for this guest).
    pub fn memfd_allocated_bytes(&self) -> u64 {
        self.inner
            .ram
            .file_allocated_bytes()
            .and_then(Result::ok)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn oom() -> Result<u32, BlockError> {
        Err(BlockError::Alloc(AllocError::OutOfMemory(
            Order::new(9).unwrap(),
        )))
    }

    #[test]
    fn an_allocation_waits_for_blocks_in_flight_then_succeeds() {
        let (tries, waits) = (Cell::new(0), Cell::new(0));
        let far = Instant::now() + Duration::from_secs(3600);
        let r = retry_while_in_flight(
            || {
                tries.set(tries.get() + 1);
                if waits.get() == 0 {
                    oom()
                } else {
                    Ok(7)
                }
            },
            || true,
            || waits.set(waits.get() + 1),
            far,
        );
        assert_eq!(r.unwrap(), 7);
        assert_eq!((tries.get(), waits.get()), (2, 1));
    }

    #[test]
    fn nothing_in_flight_or_no_time_left_is_out_of_memory_at_once() {
        let waits = Cell::new(0);
        let far = Instant::now() + Duration::from_secs(3600);
        let r = retry_while_in_flight(oom, || false, || waits.set(waits.get() + 1), far);
        assert!(matches!(
            r,
            Err(BlockError::Alloc(AllocError::OutOfMemory(_)))
        ));
        let past = Instant::now();
        let r = retry_while_in_flight(oom, || true, || waits.set(waits.get() + 1), past);
        assert!(matches!(
            r,
            Err(BlockError::Alloc(AllocError::OutOfMemory(_)))
        ));
        assert_eq!(waits.get(), 0);
    }
}
