//! What process mode and VM mode share: a [`MemoryManager`] over a [`SharedRam`], the
//! reporting worker wired to its free path (whatever the reporting device is), and the
//! [`PageBlock`] handles both hand out.

use std::sync::Arc;

use zeronce_mem::{DiscardOp, SharedRam};
use zeronce_mm::reporting::{Reporter, ReportingConfig, ReportingConfigError, ReportingDevice};
use zeronce_mm::{
    AllocRequest, Allocation, Block, ConfigError, FreeHint, FreeState, MemoryManager, MmConfig,
    Order, PageRange, Pfn, ReportedNotZero, DEFAULT_MAX_ORDER, PAGE_SIZE,
};

use crate::caches::{ThreadCaches, HUGE_ORDER};
use crate::claimed::ClaimedBytes;
use crate::error::Error;
use crate::kept;
use crate::threads::PerThread;
use crate::words::AllocWords;
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
}

/// What a [`PageBlock`] holds of its owner: one of the owner's [`Owners`], with the
/// owner's caches at hand (no dynamic call on the fast path).
#[repr(align(128))]
pub(crate) struct OwnerRef {
    owner: Arc<dyn BlockOwner>,
    caches: Arc<ThreadCaches>,
    /// The owner's `init_on_alloc` / `init_on_free` (no dynamic call on the fast path).
    init_on_alloc: bool,
    init_on_free: bool,
}

impl OwnerRef {
    /// The owner's fast path (its identity, too: one per owner).
    #[inline]
    pub(crate) fn caches(&self) -> &ThreadCaches {
        &self.caches
    }

    /// Whether `other` refers to the same owner.
    #[inline]
    pub(crate) fn same_owner(&self, other: &OwnerRef) -> bool {
        Arc::ptr_eq(&self.caches, &other.caches)
    }
}

impl std::ops::Deref for OwnerRef {
    type Target = dyn BlockOwner;
    fn deref(&self) -> &Self::Target {
        &*self.owner
    }
}

/// References to one owner, one per [`PerThread`] slot, each in an allocation and on a
/// cache line of its own: a block takes a reference on the allocating thread's and drops
/// it at free (unless it moves in and out of a kept list with the block), so threads
/// allocating and freeing at the same time do not all count on one shared reference
/// count. The handles of the owner ([`crate::ProcessMemory`], [`crate::VmMemory`]) share
/// one; when the last handle goes, the owner closes (see [`crate::kept`]).
pub(crate) struct Owners(PerThread<Arc<OwnerRef>>);

impl Owners {
    /// References to `owner`, whose fast path is `caches`.
    pub(crate) fn new(owner: &Arc<dyn BlockOwner>, caches: &Arc<ThreadCaches>) -> Arc<Owners> {
        Arc::new(Owners(PerThread::new(|| {
            let life = owner.life();
            Arc::new(OwnerRef {
                owner: Arc::clone(owner),
                caches: Arc::clone(caches),
                init_on_alloc: life.is_some_and(|l| l.init_on_alloc),
                init_on_free: life.is_some_and(|l| l.init_on_free),
            })
        })))
    }

    /// The calling thread's reference.
    #[inline]
    fn mine(&self) -> &Arc<OwnerRef> {
        self.0.mine()
    }
}

impl Drop for Owners {
    fn drop(&mut self) {
        // The last handle is gone: kept blocks must not keep the owner alive.
        self.mine().caches().close();
    }
}

/// Allocates a block of `order` from `owners` and claims its bytes.
#[inline]
pub(crate) fn alloc_block(
    owners: &Owners,
    order: Order,
    req: AllocRequest,
) -> Result<PageBlock, Error> {
    alloc_prefix(owners, order, req, order.pages())
}

/// [`alloc_block`] for a caller using only the first `used_pages` pages: a zero-request
/// zeroes only those.
#[inline]
pub(crate) fn alloc_prefix(
    owners: &Owners,
    order: Order,
    mut req: AllocRequest,
    used_pages: u64,
) -> Result<PageBlock, Error> {
    let mine = owners.mine();
    req.zeroed |= mine.init_on_alloc;
    if !req.zeroed {
        // The fast path, inlined into the caller so the block is built where it goes:
        // allocated and claimed all along, and its chunks stayed `Used`, so nothing to
        // wait for or claim.
        if let Some(held) = kept::take(mine, order) {
            return Ok(PageBlock { held: Some(held) });
        }
    }
    alloc_slow(mine, order, req, used_pages)
}

/// [`alloc_prefix`] past the small kept blocks.
#[inline(never)]
fn alloc_slow(
    mine: &Arc<OwnerRef>,
    order: Order,
    req: AllocRequest,
    used_pages: u64,
) -> Result<PageBlock, Error> {
    let life = mine.life();
    if req.zeroed && order == HUGE_ORDER {
        // The thread's kept huge blocks go back first, so the manager's search order sees
        // them: resident (a memset) before reported memory (a refault of every page).
        while let Some(held) = kept::take_back(mine, order) {
            mine.caches().give_back(held);
        }
    }
    let owner = Arc::clone(mine);
    let alloc = owner.caches().alloc(order, req, used_pages)?;
    if let Some(l) = life {
        // Before the caller sees a byte: waits out a zeroer still writing a chunk of it.
        l.map.handed_out(alloc.block);
    }
    let bytes = match ClaimedBytes::claim(owner.ram(), alloc.block.pfn, alloc.block.order) {
        Ok(b) => b,
        Err(e) => {
            // Give the block back before reporting the bug.
            let _ = owner.caches().free(alloc.block, FreeHint::Dirty);
            return Err(e.into());
        }
    };
    Ok(PageBlock::new(owner, alloc, bytes))
}

/// What an allocated [`PageBlock`] holds; a kept block is one of these in a kept list (so
/// taking one back moves it as it is).
pub(crate) struct Held {
    pub(crate) owner: Arc<OwnerRef>,
    /// The allocation, in words (see [`crate::words`]).
    pub(crate) alloc: AllocWords,
    /// Empty once freed.
    pub(crate) bytes: ClaimedBytes,
}

/// An allocated block of a [`crate::ProcessMemory`] or [`crate::VmMemory`]: owns its
/// bytes; freed on drop (or with [`PageBlock::free`], which reports errors).
pub struct PageBlock {
    /// `None` only while it is being freed (every method taking `&self` runs before).
    held: Option<Held>,
}

impl PageBlock {
    fn new(owner: Arc<OwnerRef>, alloc: Allocation, bytes: ClaimedBytes) -> PageBlock {
        PageBlock {
            held: Some(Held {
                owner,
                alloc: AllocWords::new(&alloc),
                bytes,
            }),
        }
    }

    #[inline]
    fn held(&self) -> &Held {
        match &self.held {
            Some(h) => h,
            None => unreachable!("a block is used only before it is freed"),
        }
    }

    #[inline]
    fn held_mut(&mut self) -> &mut Held {
        match &mut self.held {
            Some(h) => h,
            None => unreachable!("a block is used only before it is freed"),
        }
    }

    /// The block.
    pub fn block(&self) -> Block {
        self.held().alloc.block()
    }

    /// How it was allocated (zeroing done or skipped, prior free state).
    pub fn allocation(&self) -> Allocation {
        self.held().alloc.get()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.held().bytes.as_slice()
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.held_mut().bytes.as_mut_slice()
    }

    /// Writes one byte every `stride` bytes (0 = 4 KiB) without changing contents: faults
    /// the block in for writing.
    pub fn touch(&mut self, stride: usize) {
        self.held_mut().bytes.touch(stride);
    }

    /// Frees the block (contents unknown).
    #[inline]
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
        let held = self.held_mut();
        let pages = held.alloc.block().order.pages();
        if from_page >= pages {
            return Ok(true);
        }
        let op = DiscardOp::best_for(held.owner.ram().backing());
        let start = (from_page * PAGE_SIZE) as usize;
        let len = ((pages - from_page) * PAGE_SIZE) as usize;
        Ok(held.bytes.discard_part(start, len, op)?.is_zeroed())
    }

    /// Grows the block in place to `order` when its upper buddies are free; whether it
    /// did (the grown part's contents are unspecified).
    pub(crate) fn grow_in_place(&mut self, order: Order) -> Result<bool, Error> {
        let held = self.held_mut();
        let Some(grown) = held.owner.mm().grow_in_place(held.alloc.block(), order)? else {
            return Ok(false);
        };
        if let Some(l) = held.owner.life() {
            l.map.handed_out(grown);
        }
        held.alloc = held.alloc.with_block(grown);
        // The claim follows the block: the old bytes' claim ends, the grown block's begins.
        held.bytes.release();
        held.bytes = ClaimedBytes::claim(held.owner.ram(), grown.pfn, grown.order)?;
        Ok(true)
    }

    /// Frees the block (dirty), vouching that every page from `zero_from` on reads zero
    /// (never written, or discarded): those chunks are not zeroed again.
    pub(crate) fn free_with_zero_tail(mut self, zero_from: u64) -> Result<(), Error> {
        self.release_with(FreeHint::Dirty, zero_from)
    }

    #[inline]
    fn release(&mut self, hint: FreeHint) -> Result<(), Error> {
        self.release_with(hint, u64::MAX)
    }

    /// Frees with `hint`, the pages from `zero_from` on known to read zero; on an error
    /// the block stays this handle's. The fast path (a small block kept for this thread)
    /// is inlined into the caller.
    #[inline]
    fn release_with(&mut self, hint: FreeHint, zero_from: u64) -> Result<(), Error> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        if hint == FreeHint::Dirty && !held.owner.init_on_free && held.bytes.is_claimed() {
            // Kept for the next allocation on this thread: still allocated and claimed,
            // its chunks untouched (a vouched-for zero tail is forgotten: it may be
            // written again before the block reaches the manager).
            match kept::keep(held) {
                Ok(()) => Ok(()),
                Err(held) => self.release_slow(held, hint, zero_from),
            }
        } else {
            self.release_slow(held, hint, zero_from)
        }
    }

    /// [`PageBlock::release_with`] past the small kept blocks.
    #[inline(never)]
    fn release_slow(
        &mut self,
        mut held: Held,
        mut hint: FreeHint,
        zero_from: u64,
    ) -> Result<(), Error> {
        if !held.bytes.is_claimed() {
            // A failed free left it without its bytes: nothing more to do.
            self.held = Some(held);
            return Ok(());
        }
        let block = held.alloc.block();
        if let Some(l) = held.owner.life() {
            if l.init_on_free && hint == FreeHint::Dirty {
                held.bytes.zero();
                l.map.count_zeroed(Site::AtFree, block.order.bytes());
                hint = FreeHint::KnownZero;
            }
        }
        let zero_from = zero_from.min(block.order.pages());
        let result = free_to_owner(&held.owner, &mut held.bytes, block, hint, zero_from);
        if result.is_err() {
            self.held = Some(held);
        }
        result
    }
}

/// Frees `block` of `owner` with `hint`, its claimed `bytes` released first; the pages
/// from `zero_from` on known to read zero. On a failed known-zero free the bytes are
/// claimed again (the block is still allocated).
fn free_to_owner(
    owner: &OwnerRef,
    bytes: &mut ClaimedBytes,
    block: Block,
    hint: FreeHint,
    zero_from: u64,
) -> Result<(), Error> {
    let life = owner.life();
    if let Some(l) = life {
        // While the block is still ours: a zeroer must not see it free before this.
        let zero_from = if hint == FreeHint::KnownZero {
            0
        } else {
            zero_from
        };
        l.map.freed(block, zero_from);
    }
    // Our claim must go before the manager (or the verify read) can touch the block.
    bytes.release();
    match owner.caches().free(block, hint) {
        Ok(()) => {
            if let Some(l) = life {
                l.map.count_freed(block.order.bytes());
                l.after_free(block, hint);
            }
            Ok(())
        }
        Err(e) => {
            if let Some(l) = life {
                // Still allocated: the map says so again (in use, every page written), or
                // a later zero-request would skip pages the holder wrote.
                l.map.handed_out(block);
            }
            if hint == FreeHint::KnownZero {
                // Still ours: take the bytes back so drop frees it dirty.
                if let Ok(b) = ClaimedBytes::claim(owner.ram(), block.pfn, block.order) {
                    *bytes = b;
                }
            }
            Err(e.into())
        }
    }
}

impl Drop for PageBlock {
    fn drop(&mut self) {
        if let Err(e) = self.release(FreeHint::Dirty) {
            tracing::error!(%e, block = %self.block(), "freeing a block on drop failed");
        }
    }
}
