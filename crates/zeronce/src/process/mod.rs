//! Process mode: a [`MemoryManager`] over a [`GuestRam`] of this process, with free page
//! reporting to the Linux kernel as the host (docs/ARCHITECTURE.md §1). Freed memory leaves the process
//! (RSS follows the working set) and comes back known zero, so it is never zeroed twice.
//!
//! ```no_run
//! use zeronce::{ProcessMemory, ReportingSetup, Order};
//! use zeronce::zeronce_mem::BackingKind;
//! let pm = ProcessMemory::builder()
//!     .size(1 << 30)
//!     .backing(BackingKind::Anonymous { thp: true })
//!     .reporting(ReportingSetup::default())
//!     .build()?;
//! let mut block = pm.alloc_zeroed(Order::new(9)?)?; // 2 MiB that read zero
//! block.as_mut_slice()[0] = 1;
//! drop(block); // freed; reported after the delay, or now with:
//! pm.flush(u64::MAX);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod device;

pub use crate::policy::PolicyError;
pub use crate::threads::is_internal_thread;
pub use crate::zeroing::{RamZeroer, ZeroerConfig, ZeroingStats};
pub use device::{DeviceStats, ProcessDevice};
pub use zeronce_balloon::DiscardPolicy;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use zeronce_mem::{BackingKind, GuestRam, SharedRam};
use zeronce_mm::reporting::{PassReport, ReportingConfig, ReportingStats};
use zeronce_mm::{AllocRequest, MemoryManager, Order, Stats, PAGE_SIZE};

use crate::block::{Caches, Owners, PageBlock, Writes};
use crate::builder::Builder;
use crate::error::{BlockError, BuildError};
use crate::managed::{self, ManagedMemory};
use crate::zeroing::background::{BackgroundZeroer, Target};
use crate::zeroing::zeromap::ZeroMap;
use crate::zeroing::Lifecycle;

/// Free page reporting settings of process mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportingSetup {
    /// Engine settings (Linux defaults).
    pub config: ReportingConfig,
    /// What the "host" (the kernel) does with reported blocks. A policy whose op does not
    /// work on the RAM's backing is refused when the memory is built
    /// ([`BuildError::Policy`]): `Lazy` needs private anonymous memory.
    pub policy: DiscardPolicy,
    /// Use the host's zero guarantee (the "skip redundant zeroing" series); `false` = a
    /// host without zero hints, every reported block comes back "not known zero" (the
    /// baseline the "skip redundant zeroing" series measures against).
    pub zero_hints: bool,
    /// The zero-once lifecycle: a freed block of reporting order is zeroed off the
    /// allocation path by the background zeroer with streaming stores (known zero and
    /// resident: a zero-request takes it with no memset and no fault), and reported once
    /// it has stayed free for the engine's delay. The zeroer's threads, priority and rate
    /// are the builder's [`ZeroerConfig`] (the default one unless set).
    pub zero_then_report: bool,
}

impl Default for ReportingSetup {
    /// Linux's engine defaults, discarding at once, with zero hints.
    fn default() -> Self {
        ReportingSetup {
            config: ReportingConfig::default(),
            policy: DiscardPolicy::Immediate,
            zero_hints: true,
            zero_then_report: false,
        }
    }
}

impl ReportingSetup {
    /// The zero-once lifecycle (see [`ReportingSetup::zero_then_report`]): a free block
    /// stays resident and zeroed for about `hold` (the engine's delay), then is discarded
    /// at once.
    pub fn zero_then_report(hold: Duration) -> Self {
        ReportingSetup {
            config: ReportingConfig {
                delay: hold,
                ..ReportingConfig::default()
            },
            zero_then_report: true,
            ..ReportingSetup::default()
        }
    }
}

/// Builder of [`ProcessMemory`]; see [`ProcessMemory::builder`].
pub type ProcessBuilder = Builder<ProcessMode>;

/// What only a process-mode [`Builder`] has.
#[derive(Clone, Debug, Default)]
pub struct ProcessMode {
    reporting: Option<ReportingSetup>,
    zeroer: Option<ZeroerConfig>,
    init_on_free: bool,
    init_on_alloc: bool,
    /// No page-table scan of freed blocks ([`ProcessBuilder::scan_freed`]).
    no_scan: bool,
}

/// Process mode's setters and `build`; the shared ones are [`Builder`]'s.
impl Builder<ProcessMode> {
    /// Background zeroer threads (default: none, or [`ZeroerConfig::default`] with
    /// [`ReportingSetup::zero_then_report`]); `threads: 0` leaves zeroing to
    /// [`ProcessMemory::prezero`] on the caller's threads.
    pub fn background_zeroer(mut self, config: ZeroerConfig) -> Self {
        self.mode.zeroer = Some(config);
        self
    }

    /// Zero every block when it is freed, like Linux's `init_on_free=1` (default off); it
    /// goes back known zero, so the next zero-request does not zero it again.
    pub fn init_on_free(mut self, on: bool) -> Self {
        self.mode.init_on_free = on;
        self
    }

    /// Make every allocation a zero-request, like Linux's `init_on_alloc=1` (default off):
    /// zeroed unless known zero.
    pub fn init_on_alloc(mut self, on: bool) -> Self {
        self.mode.init_on_alloc = on;
        self
    }

    /// Whether a freed block of 2 MiB or more is looked up in the page tables before its
    /// chunks are marked dirty (default on; private anonymous memory and Linux 6.7+
    /// only, else off by itself): the pages its holder never wrote (never touched, or only
    /// read: the kernel's zero page) still read zero, so they are not zeroed again and
    /// the next zero-request skips them. A program that `calloc`s a buffer and only reads
    /// it gets it back known zero. Costs a page-table entry read per 2 MiB written from its
    /// start (every entry of the others), and only for blocks that had pages with no
    /// page of their own when handed out (not those zeroed on allocation).
    pub fn scan_freed(mut self, on: bool) -> Self {
        self.mode.no_scan = !on;
        self
    }

    /// Turns free page reporting on with `setup` (default: off).
    pub fn reporting(mut self, setup: ReportingSetup) -> Self {
        self.mode.reporting = Some(setup);
        self
    }

    /// Turns free page reporting off: freed memory stays resident.
    pub fn no_reporting(mut self) -> Self {
        self.mode.reporting = None;
        self
    }

    /// Maps the RAM, builds the manager and starts reporting and the background zeroer.
    pub fn build(self) -> Result<ProcessMemory, BuildError> {
        // Anonymous RAM starts aligned for the largest block it can hold, so every block
        // is aligned to its size in the address space (an aligned allocation then needs
        // only a block as large as its alignment).
        let largest = self.manager.max_order.bytes() as usize;
        let fits = 1usize << self.size.max(1).ilog2();
        let ram = GuestRam::new_aligned(self.size, self.backing, largest.min(fits))?;
        let ram = SharedRam::new(ram);
        let pages = self.size as u64 / PAGE_SIZE;
        let reporting = self.mode.reporting;
        let mut zeroer = self.mode.zeroer;
        if let Some(setup) = &reporting {
            managed::check_reporting_order(setup.config.order, ram.backing().page_size())?;
            if setup.zero_then_report {
                zeroer.get_or_insert_with(ZeroerConfig::default);
            }
        }
        let chunk_order = reporting.map_or(zeronce_mm::DEFAULT_REPORTING_ORDER, |s| s.config.order);
        let map = Arc::new(ZeroMap::new(
            pages,
            chunk_order.min(self.manager.max_order),
            self.manager.fresh_is_zero,
        ));
        let mut manager = self.manager;
        if let Some(setup) = &reporting {
            manager.reported_not_zero = crate::policy::reported_not_zero(setup.policy);
        }
        let mm = manager.build_manager(
            &ram,
            pages,
            reporting.map(|s| s.config.order),
            Some(Arc::clone(&map)),
        )?;
        let target = Target {
            mm: Arc::clone(&mm),
            ram: Arc::clone(&ram),
            map: Arc::clone(&map),
        };
        let zeroer = match zeroer.filter(|z| z.threads > 0) {
            Some(config) => {
                Some(BackgroundZeroer::start(target, config).map_err(BuildError::Zeroer)?)
            }
            None => None,
        };
        let life = Arc::new(Lifecycle {
            zeroer,
            map: Arc::clone(&map),
            init_on_free: self.mode.init_on_free,
            init_on_alloc: self.mode.init_on_alloc,
            scan_freed: AtomicBool::new(
                !self.mode.no_scan && matches!(ram.kind(), BackingKind::Anonymous { .. }),
            ),
        });
        let caches = Arc::new(Caches::new(&mm, &ram, Some(Arc::clone(&life))));
        let reporter = match reporting {
            None => None,
            Some(setup) => {
                let mut device =
                    ProcessDevice::new(Arc::clone(&ram), setup.policy, setup.zero_hints)?;
                device.set_zero_map(map);
                Some(managed::start_reporter(&caches, device, setup.config)?)
            }
        };
        let inner = Arc::new(ManagedMemory {
            caches: Arc::clone(&caches),
            life: Some(life),
            reporter,
            mm,
            ram,
        });
        Ok(ProcessMemory {
            owners: Owners::new(Arc::clone(&inner) as _, &caches),
            inner,
        })
    }
}

type Inner = ManagedMemory<ProcessDevice>;

/// Memory of this process managed by zeronce. Cheap to clone (shared); `Send + Sync`.
#[derive(Clone)]
pub struct ProcessMemory {
    inner: Arc<Inner>,
    /// What blocks hold of `inner`.
    owners: Arc<Owners>,
}

/// Counters of a [`ProcessMemory`].
#[derive(Clone, Debug)]
pub struct ProcessStats {
    /// The manager's counters and free pages per (order, state).
    pub mm: Stats,
    /// The reporting engine's counters (`None`: reporting off).
    pub reporting: Option<ReportingStats>,
    /// The device's counters (`None`: reporting off).
    pub device: Option<DeviceStats>,
    /// Bytes zeroed where (background, allocation path, at free) and freed.
    pub zeroing: ZeroingStats,
}

impl ProcessMemory {
    /// A builder: 1 GiB, anonymous + THP, reporting off, max order 10.
    pub fn builder() -> ProcessBuilder {
        Builder::with(
            1 << 30,
            BackingKind::Anonymous { thp: true },
            ProcessMode::default(),
        )
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
    #[inline]
    pub fn alloc_with(&self, order: Order, req: AllocRequest) -> Result<PageBlock, BlockError> {
        self.owners.alloc(order, req, order.pages(), Writes::Block)
    }

    /// [`ProcessMemory::alloc_with`] for a caller that uses only the first `used_pages`
    /// pages (a size that is not a power of two): a zero-request zeroes only those, so the
    /// rest is neither written nor faulted in.
    pub fn alloc_prefix(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<PageBlock, BlockError> {
        self.owners.alloc(order, req, used_pages, Writes::Block)
    }

    /// [`ProcessMemory::alloc_prefix`] for the global allocator, whose callers write no
    /// more than the first `used_pages` pages until it says so
    /// ([`PageBlock::writes_up_to`]): see [`Writes::Prefix`].
    pub(crate) fn alloc_written_prefix(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<PageBlock, BlockError> {
        self.owners.alloc(order, req, used_pages, Writes::Prefix)
    }

    /// Reports up to `max_pages` free pages now (ignoring delay and budget) and settles
    /// expired holds; an empty pass when reporting is off. Blocks in the per-thread caches
    /// go back to the allocator first, so they can merge and be reported too.
    pub fn flush(&self, max_pages: u64) -> PassReport {
        self.inner.flush(max_pages)
    }

    /// Runs a settle pass now (hold policy); an empty pass when reporting is off.
    pub fn settle(&self) -> PassReport {
        self.inner
            .reporter
            .as_ref()
            .map_or_else(PassReport::default, |r| r.settle())
    }

    /// Counters.
    pub fn stats(&self) -> ProcessStats {
        // Exact counts: blocks in the per-thread caches go back to the allocator first.
        let mm = self.inner.caches.stats();
        let r = self.inner.reporter.as_ref();
        let zeroing = self.life().map.stats();
        ProcessStats {
            mm,
            reporting: r.map(|r| r.stats()),
            device: r.map(|r| r.with_device(|d| d.stats())),
            zeroing: ZeroingStats {
                // Wrapping: blocks taken ahead into a kept list and given back unused count
                // freed in the map and are taken back from the kept bytes.
                freed: zeroing
                    .freed
                    .wrapping_add(self.inner.caches.kept_freed_bytes()),
                ..zeroing
            },
        }
    }

    fn life(&self) -> &Lifecycle {
        // Process mode always builds one.
        self.inner
            .life
            .as_ref()
            .unwrap_or_else(|| unreachable!("process memory without a lifecycle"))
    }

    /// Zeroes free dirty chunks of reporting order on the calling thread (streaming
    /// stores), up to `max_bytes`, until none is left or `cancel` is cancelled (checked
    /// between 2 MiB chunks); the bytes zeroed. Safe beside allocations and the background
    /// threads: a chunk is written only while free, and an allocation waits for it.
    /// Blocks in the per-thread caches go back to the allocator first, so freed blocks
    /// kept there are zeroed too.
    pub fn prezero(&self, max_bytes: u64, cancel: &crate::prezero::CancelToken) -> u64 {
        self.inner.caches.drain();
        let target = Target {
            mm: Arc::clone(&self.inner.mm),
            ram: Arc::clone(&self.inner.ram),
            map: Arc::clone(&self.life().map),
        };
        target.pass(max_bytes, &|| cancel.is_cancelled(), None)
    }

    /// Pauses (`false`: the chunk being zeroed is finished first) or resumes the
    /// background zeroer threads; no effect without them.
    pub fn set_background_zeroing(&self, on: bool) {
        if let Some(z) = &self.life().zeroer {
            z.set_paused(!on);
        }
    }

    /// The manager (for invariant checks and low-level use).
    pub fn manager(&self) -> &MemoryManager {
        &self.inner.mm
    }

    /// The RAM.
    pub fn ram(&self) -> &Arc<SharedRam> {
        &self.inner.ram
    }

    /// Bytes of the RAM held in memory: resident pages (anonymous, `mincore`; a mapped
    /// shared zero page counts, e.g. after verify mode read a discarded block) or the
    /// backing file's allocated blocks (memfd, hugetlb).
    pub fn resident_bytes(&self) -> u64 {
        let ram = &self.inner.ram;
        match ram.file_allocated_bytes() {
            Some(r) => r.unwrap_or(0),
            None => ram.resident_bytes(0, ram.len()).map_or(0, |b| b as u64),
        }
    }
}
