//! What process mode and VM mode share: a [`MemoryManager`] over a [`SharedRam`], the
//! reporting worker wired to its free path (whatever the reporting device is), and the
//! [`PageBlock`] handles both hand out.

use std::sync::Arc;

use zeronce_mem::{DiscardOp, SharedRam};
use zeronce_mm::reporting::{Reporter, ReportingConfig, ReportingConfigError, ReportingDevice};
use zeronce_mm::{
    AllocError, AllocRequest, Allocation, Block, ConfigError, FreeError, FreeHint, FreeState,
    MemoryManager, MmConfig, Order, PageRange, Pfn, ReportedNotZero, DEFAULT_MAX_ORDER, PAGE_SIZE,
};

use crate::caches::{Kept, ThreadCaches};
use crate::claimed::ClaimedBytes;
use crate::error::Error;
use crate::threads::PerThread;
use crate::zeroing::background::BackgroundZeroer;
use crate::zeroing::zeromap::{Site, ZeroMap};
use crate::zeroing::RamZeroer;

/// A manager over some RAM, with reporting to a device of type `D` (or none).
pub(crate) struct ManagedMemory<D: ReportingDevice + 'static> {
    // Field order is drop order: the zeroer and reporter threads stop before the manager.
    /// The zero-once lifecycle (process mode only).
    pub(crate) life: Option<Arc<Lifecycle>>,
    pub(crate) reporter: Option<Reporter<ThreadCaches, D>>,
    /// The fast path in front of `mm` (also the reporting engine's view of it).
    pub(crate) caches: Arc<ThreadCaches>,
    pub(crate) mm: Arc<MemoryManager>,
    pub(crate) ram: Arc<SharedRam>,
}

/// What a free and an allocation do besides the manager's work (process mode): chunk
/// states, the background zeroer, the hardening options.
pub(crate) struct Lifecycle {
    /// Background zeroer threads (`None`: none running).
    pub(crate) zeroer: Option<BackgroundZeroer>,
    /// Chunk states shared with the zeroers and the device.
    pub(crate) map: Arc<ZeroMap>,
    /// Zero every block at free (Linux `init_on_free=1`); it is freed known zero.
    pub(crate) init_on_free: bool,
    /// Every allocation is a zero-request (Linux `init_on_alloc=1`): zeroed unless known
    /// zero.
    pub(crate) init_on_alloc: bool,
}

impl Lifecycle {
    /// A block was freed with `hint`: wakes the zeroer if it left dirty chunks.
    pub(crate) fn after_free(&self, block: Block, hint: FreeHint) {
        if let Some(z) = &self.zeroer {
            if hint == FreeHint::Dirty && block.order >= self.map.chunk_order() {
                z.freed();
            }
        }
    }
}

/// The manager settings both builders take (process mode's [`crate::process::Builder`]
/// and [`crate::VmBuilder`]): they hold one and their setters write to it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ManagerSettings {
    /// Largest block order.
    pub(crate) max_order: Order,
    /// Verify mode: skipped zeroing and zero claims are checked by reading memory.
    pub(crate) verify: bool,
    /// Never-touched memory counts as known zero and reported.
    pub(crate) fresh_is_zero: bool,
    /// What backs reported blocks the host did not promise zero (decided by the host
    /// policy, not by the caller).
    pub(crate) reported_not_zero: ReportedNotZero,
}

impl Default for ManagerSettings {
    /// Max order 10 (4 MiB), no verify mode, fresh memory known zero.
    fn default() -> Self {
        ManagerSettings {
            max_order: DEFAULT_MAX_ORDER,
            verify: false,
            fresh_is_zero: true,
            reported_not_zero: ReportedNotZero::Discarded,
        }
    }
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
pub(crate) fn check_reporting_order(order: Order, page_size: usize) -> Result<(), Error> {
    if (order.bytes() as usize) < page_size {
        return Err(Error::OrderBelowPageSize { order, page_size });
    }
    Ok(())
}

/// Starts the reporting worker for the manager behind `caches` and `device`, and hooks it
/// to the free path (the zone's and the caches' kept blocks).
pub(crate) fn start_reporter<D: ReportingDevice + 'static>(
    caches: &Arc<ThreadCaches>,
    device: D,
    config: ReportingConfig,
) -> Result<Reporter<ThreadCaches, D>, ReportingConfigError> {
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

/// What a [`PageBlock`] needs from its owner (and keeps alive).
pub(crate) trait BlockOwner: Send + Sync {
    fn mm(&self) -> &MemoryManager;
    fn ram(&self) -> &Arc<SharedRam>;
    fn life(&self) -> Option<&Lifecycle>;
    /// Allocates through the per-thread caches; a zero-request zeroes only the first
    /// `used_pages` pages.
    fn alloc(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<Allocation, AllocError>;
    /// Frees through the per-thread caches.
    fn free(&self, block: Block, hint: FreeHint) -> Result<(), FreeError>;
    /// A block freed dirty and kept for the calling thread (see [`ThreadCaches`]).
    fn take_kept(&self, order: Order) -> Option<Kept>;
    /// Keeps a block freed dirty for the calling thread; back when it is not kept.
    fn keep(&self, kept: Kept) -> Result<(), Kept>;
}

impl<D: ReportingDevice + 'static> BlockOwner for ManagedMemory<D> {
    fn mm(&self) -> &MemoryManager {
        &self.mm
    }
    fn ram(&self) -> &Arc<SharedRam> {
        &self.ram
    }
    fn life(&self) -> Option<&Lifecycle> {
        self.life.as_deref()
    }
    fn alloc(
        &self,
        order: Order,
        req: AllocRequest,
        used_pages: u64,
    ) -> Result<Allocation, AllocError> {
        self.caches.alloc(order, req, used_pages)
    }
    fn free(&self, block: Block, hint: FreeHint) -> Result<(), FreeError> {
        self.caches.free(block, hint)
    }
    fn take_kept(&self, order: Order) -> Option<Kept> {
        self.caches.take_kept(order)
    }
    fn keep(&self, kept: Kept) -> Result<(), Kept> {
        self.caches.keep(kept)
    }
}

/// What a [`PageBlock`] holds of its owner: one of the owner's [`Owners`].
#[repr(align(128))]
pub(crate) struct OwnerRef(Arc<dyn BlockOwner>);

impl std::ops::Deref for OwnerRef {
    type Target = dyn BlockOwner;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// References to one owner, one per [`PerThread`] slot, each in an allocation and on a
/// cache line of its own: a block takes a reference on the allocating thread's and drops
/// it at free, so threads allocating and freeing at the same time do not all count on one
/// shared reference count.
pub(crate) struct Owners(PerThread<Arc<OwnerRef>>);

impl Owners {
    /// References to `owner`.
    pub(crate) fn new(owner: &Arc<dyn BlockOwner>) -> Arc<Owners> {
        Arc::new(Owners(PerThread::new(|| {
            Arc::new(OwnerRef(Arc::clone(owner)))
        })))
    }

    /// A reference for a block the calling thread allocates.
    fn mine(&self) -> Arc<OwnerRef> {
        Arc::clone(self.0.mine())
    }
}

/// Allocates a block of `order` from `owners` and claims its bytes.
pub(crate) fn alloc_block(
    owners: &Owners,
    order: Order,
    req: AllocRequest,
) -> Result<PageBlock, Error> {
    alloc_prefix(owners, order, req, order.pages())
}

/// [`alloc_block`] for a caller using only the first `used_pages` pages: a zero-request
/// zeroes only those.
pub(crate) fn alloc_prefix(
    owners: &Owners,
    order: Order,
    mut req: AllocRequest,
    used_pages: u64,
) -> Result<PageBlock, Error> {
    let owner = owners.mine();
    let life = owner.life();
    if life.is_some_and(|l| l.init_on_alloc) {
        req.zeroed = true;
    }
    if !req.zeroed {
        if let Some(Kept { alloc, bytes }) = owner.take_kept(order) {
            // Allocated and claimed all along, and its chunk stayed `Used` (the block is
            // smaller than a chunk): nothing to wait for or claim.
            return Ok(PageBlock {
                owner,
                alloc,
                bytes,
            });
        }
    }
    let alloc = owner.alloc(order, req, used_pages)?;
    if let Some(l) = life {
        // Before the caller sees a byte: waits out a zeroer still writing a chunk of it.
        l.map.handed_out(alloc.block);
    }
    let bytes = match ClaimedBytes::claim(owner.ram(), alloc.block.pfn, alloc.block.order) {
        Ok(b) => b,
        Err(e) => {
            // Give the block back before reporting the bug.
            let _ = owner.free(alloc.block, FreeHint::Dirty);
            return Err(e.into());
        }
    };
    Ok(PageBlock {
        owner,
        alloc,
        bytes,
    })
}

/// An allocated block of a [`crate::ProcessMemory`] or [`crate::VmMemory`]: owns its
/// bytes; freed on drop (or with [`PageBlock::free`], which reports errors).
pub struct PageBlock {
    owner: Arc<OwnerRef>,
    alloc: Allocation,
    /// Empty once freed.
    bytes: ClaimedBytes,
}

impl PageBlock {
    /// The block.
    pub fn block(&self) -> Block {
        self.alloc.block
    }

    /// How it was allocated (zeroing done or skipped, prior free state).
    pub fn allocation(&self) -> &Allocation {
        &self.alloc
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.bytes.as_mut_slice()
    }

    /// Writes one byte every `stride` bytes (0 = 4 KiB) without changing contents: faults
    /// the block in for writing.
    pub fn touch(&mut self, stride: usize) {
        self.bytes.touch(stride);
    }

    /// Frees the block (contents unknown).
    pub fn free(mut self) -> Result<(), Error> {
        self.release(FreeHint::Dirty)
    }

    /// Frees a block the caller knows reads zero (checked in verify mode; on a failed
    /// check the block stays allocated and is freed dirty on drop).
    pub fn free_zeroed(mut self) -> Result<(), Error> {
        self.release(FreeHint::KnownZero)
    }

    /// Discards the pages from `from_page` to the end of the block (their backing goes,
    /// they read zero afterwards when the backing guarantees it: returned).
    pub(crate) fn discard_tail(&mut self, from_page: u64) -> Result<bool, Error> {
        let pages = self.alloc.block.order.pages();
        if from_page >= pages {
            return Ok(true);
        }
        let op = DiscardOp::best_for(self.owner.ram().backing());
        let start = (from_page * PAGE_SIZE) as usize;
        let len = ((pages - from_page) * PAGE_SIZE) as usize;
        Ok(self.bytes.discard_part(start, len, op)?.is_zeroed())
    }

    /// Grows the block in place to `order` when its upper buddies are free; whether it
    /// did (the grown part's contents are unspecified).
    pub(crate) fn grow_in_place(&mut self, order: Order) -> Result<bool, Error> {
        let old = self.alloc.block;
        let Some(grown) = self.owner.mm().grow_in_place(old, order)? else {
            return Ok(false);
        };
        if let Some(l) = self.owner.life() {
            l.map.handed_out(grown);
        }
        self.alloc.block = grown;
        // The claim follows the block: the old bytes' claim ends, the grown block's begins.
        self.bytes.release();
        self.bytes = ClaimedBytes::claim(self.owner.ram(), grown.pfn, grown.order)?;
        Ok(true)
    }

    /// Frees the block (dirty), vouching that every page from `zero_from` on reads zero
    /// (never written, or discarded): those chunks are not zeroed again.
    pub(crate) fn free_with_zero_tail(mut self, zero_from: u64) -> Result<(), Error> {
        self.release_with(FreeHint::Dirty, zero_from)
    }

    fn release(&mut self, hint: FreeHint) -> Result<(), Error> {
        self.release_with(hint, self.alloc.block.order.pages())
    }

    /// Frees with `hint`, the pages from `zero_from` on known to read zero.
    fn release_with(&mut self, mut hint: FreeHint, zero_from: u64) -> Result<(), Error> {
        if !self.bytes.is_claimed() {
            return Ok(());
        }
        let block = self.alloc.block;
        let life = self.owner.life();
        if let Some(l) = life {
            if l.init_on_free && hint == FreeHint::Dirty {
                self.bytes.zero();
                l.map.count_zeroed(Site::AtFree, block.order.bytes());
                hint = FreeHint::KnownZero;
            }
        }
        if hint == FreeHint::Dirty {
            // Kept for the next allocation on this thread: still allocated and claimed,
            // its chunks untouched (a vouched-for zero tail is forgotten: it may be
            // written again before the block reaches the manager).
            let kept = Kept {
                alloc: self.alloc,
                bytes: std::mem::take(&mut self.bytes),
            };
            match self.owner.keep(kept) {
                Ok(()) => return Ok(()),
                Err(kept) => self.bytes = kept.bytes,
            }
        }
        if let Some(l) = life {
            l.map.count_freed(block.order.bytes());
            // While the block is still ours: a zeroer must not see it free before this.
            let zero_from = if hint == FreeHint::KnownZero {
                0
            } else {
                zero_from
            };
            l.map.freed(block, zero_from);
        }
        // Our claim must go before the manager (or the verify read) can touch the block.
        self.bytes.release();
        match self.owner.free(block, hint) {
            Ok(()) => {
                if let Some(l) = self.owner.life() {
                    l.after_free(block, hint);
                }
                Ok(())
            }
            Err(e) => {
                if hint == FreeHint::KnownZero {
                    // Still ours: take the bytes back so drop frees it dirty.
                    let b = self.alloc.block;
                    if let Ok(bytes) = ClaimedBytes::claim(self.owner.ram(), b.pfn, b.order) {
                        self.bytes = bytes;
                    }
                }
                Err(e.into())
            }
        }
    }
}

impl Drop for PageBlock {
    fn drop(&mut self) {
        if let Err(e) = self.release(FreeHint::Dirty) {
            tracing::error!(%e, block = %self.alloc.block, "freeing a block on drop failed");
        }
    }
}
