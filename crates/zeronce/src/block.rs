//! The handles [`crate::ProcessMemory`] and [`crate::VmMemory`] hand out: [`PageBlock`],
//! what it holds ([`Claimed`]: its owner reference, allocation and claimed bytes) and the
//! owner references themselves ([`OwnerRef`], one per slot in [`Owners`]). How a block is
//! allocated and freed through the per-thread layer, and the rules that keep it right,
//! are [`crate::fastpath`]'s.

use std::any::Any;
use std::sync::Arc;

use zeronce_mem::{DiscardError, DiscardOp};
use zeronce_mm::{AllocRequest, Allocation, Block, FreeHint, Order, PageRange, PAGE_SIZE};

use crate::claimed::ClaimedBytes;
use crate::error::{BlockError, FreeError};
use crate::fastpath::{Keep, PageTables, Slots, ThreadCaches, Via, HUGE_ORDER};
use crate::threads::PerThread;
use crate::words::AllocWords;
use crate::zeroing::zeromap::Site;

/// Which pages of a new block its holder may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Writes {
    /// All of them (what a public handle promises: its bytes are the whole block).
    Block,
    /// Only the used prefix, until it tells the map more ([`PageBlock::writes_up_to`]):
    /// a caller that hands out no more than that (the global allocator, whose callers may
    /// write their size). The pages past it keep what the map knew of them, so a tail
    /// that read zero before still does at the free and is not zeroed again (or faulted
    /// in to be). Blocks of an order the kept lists hold are always `Block`: a kept block
    /// goes to its next holder with no map call.
    Prefix,
}

/// The fast path of an owner whose blocks are [`PageBlock`]s.
pub(crate) type Caches = ThreadCaches<Claimed>;

/// The kept lists of every owner's [`Claimed`] blocks.
static KEPT: Slots<Claimed> = Slots::new();

/// What a [`PageBlock`] holds; a kept block is one of these in a kept list, so taking one
/// back moves it as it is.
///
/// In this order, the owner last: the owner reference is the niche of the `Option`s around
/// it (a kept list's pop, [`PageBlock`]), so the compiler moves it on its own and the other
/// six words as three 16-byte pieces. With the owner first those pieces started at word 1,
/// and the next move of the whole (16-byte pieces from word 0) read each one across two
/// stores: a store-forwarding stall per piece, eight per alloc+free pair.
#[repr(C)]
pub(crate) struct Claimed {
    /// The allocation, in words (see [`crate::words`]).
    alloc: AllocWords,
    /// Empty once freed.
    bytes: ClaimedBytes,
    owner: Arc<OwnerRef>,
}

impl Keep for Claimed {
    #[inline]
    fn slots() -> &'static Slots<Self> {
        &KEPT
    }
    #[inline]
    fn caches(&self) -> &Caches {
        &self.owner.caches
    }
    #[inline]
    fn order(&self) -> Order {
        self.alloc.block().order
    }
    #[inline]
    fn reuse(&mut self) {
        // Written only when it differs: a block kept before already says so, and the line
        // stays clean.
        let reused = self.alloc.reused();
        if self.alloc != reused {
            self.alloc = reused;
        }
    }
    fn into_claim(self) -> (Block, ClaimedBytes) {
        (self.alloc.block(), self.bytes)
    }
    fn take_claim(&mut self) -> (Block, ClaimedBytes) {
        (self.alloc.block(), std::mem::take(&mut self.bytes))
    }
    fn refill(&mut self, alloc: Allocation, bytes: ClaimedBytes) {
        self.alloc = AllocWords::new(&alloc);
        self.bytes = bytes;
    }
}

/// What a [`PageBlock`] holds of its owner: it keeps the owner alive and has the owner's
/// fast path at hand (no dynamic call on the fast path).
#[repr(align(128))]
pub(crate) struct OwnerRef {
    /// Kept alive while a block (or kept block) of it exists.
    _owner: Arc<dyn Any + Send + Sync>,
    caches: Arc<Caches>,
    /// The owner's `init_on_alloc` / `init_on_free`.
    init_on_alloc: bool,
    init_on_free: bool,
}

/// References to one owner, one per [`PerThread`] slot, each in an allocation and on a
/// cache line of its own: a block takes a reference on the allocating thread's and drops
/// it at free (unless it moves in and out of a kept list with the block), so threads
/// allocating and freeing at the same time do not all count on one shared reference
/// count. The handles of the owner share one; when the last handle goes, the owner closes
/// ([`ThreadCaches::close`]).
pub(crate) struct Owners(PerThread<Arc<OwnerRef>>);

impl Owners {
    /// References to `owner`, whose fast path is `caches`.
    pub(crate) fn new(owner: Arc<dyn Any + Send + Sync>, caches: &Arc<Caches>) -> Arc<Owners> {
        let life = caches.life();
        let (init_on_alloc, init_on_free) =
            life.map_or((false, false), |l| (l.init_on_alloc, l.init_on_free));
        Arc::new(Owners(PerThread::new(|| {
            Arc::new(OwnerRef {
                _owner: Arc::clone(&owner),
                caches: Arc::clone(caches),
                init_on_alloc,
                init_on_free,
            })
        })))
    }

    /// Allocates a block of `order` and claims its bytes; a zero-request zeroes only the
    /// first `used_pages` pages (a caller using only those), and `writes` says which pages
    /// the holder may write.
    #[inline]
    pub(crate) fn alloc(
        &self,
        order: Order,
        mut req: AllocRequest,
        used_pages: u64,
        writes: Writes,
    ) -> Result<PageBlock, BlockError> {
        let mine = self.0.mine();
        req.zeroed |= mine.init_on_alloc;
        if !req.zeroed {
            // The fast path, inlined into the caller so the block is built where it goes:
            // allocated and claimed all along, and its chunks stayed `Used`, so nothing to
            // wait for or claim.
            if let Some(claimed) = mine.caches.take(order) {
                return Ok(PageBlock {
                    claimed: Some(claimed),
                });
            }
        }
        alloc_slow(mine, order, req, used_pages, writes)
    }
}

impl Drop for Owners {
    fn drop(&mut self) {
        // The last handle is gone: kept blocks must not keep the owner alive.
        self.0.mine().caches.close();
    }
}

/// [`Owners::alloc`] past the kept blocks.
#[inline(never)]
fn alloc_slow(
    mine: &Arc<OwnerRef>,
    order: Order,
    req: AllocRequest,
    used_pages: u64,
    writes: Writes,
) -> Result<PageBlock, BlockError> {
    let caches = &mine.caches;
    if order == HUGE_ORDER {
        if req.zeroed {
            // The thread's kept huge blocks go back first, so the manager's search order
            // sees them: resident (a memset) before reported memory (a refault of every
            // page).
            caches.give_back_mine(order);
        } else if let Some(claimed) = caches.alloc_refilling(order, |alloc, bytes| Claimed {
            alloc: AllocWords::new(&alloc),
            bytes,
            owner: Arc::clone(mine),
        }) {
            // None kept: a few taken together, the others kept for the next ones.
            return Ok(PageBlock {
                claimed: Some(claimed),
            });
        }
    }
    let alloc = caches.alloc(order, req, used_pages)?;
    if let Some(l) = caches.life() {
        // Before the caller sees a byte: waits out a zeroer still writing a chunk of it.
        match writes {
            Writes::Prefix if !Caches::keeps(order) => {
                l.map.handed_out_prefix(alloc.block, used_pages)
            }
            _ => l.map.handed_out(alloc.block),
        }
    }
    let bytes = match ClaimedBytes::claim(caches.ram(), alloc.block.pfn, alloc.block.order) {
        Ok(b) => b,
        Err(e) => {
            // Give the block back before reporting the bug.
            let _ = caches.free(alloc.block, FreeHint::Dirty);
            return Err(e.into());
        }
    };
    Ok(PageBlock::new(Arc::clone(mine), alloc, bytes))
}

/// An allocated block of a [`crate::ProcessMemory`] or [`crate::VmMemory`]: owns its
/// bytes; freed on drop (or with [`PageBlock::free`], which reports errors).
pub struct PageBlock {
    /// `None` only while it is being freed (every method taking `&self` runs before).
    claimed: Option<Claimed>,
}

impl PageBlock {
    fn new(owner: Arc<OwnerRef>, alloc: Allocation, bytes: ClaimedBytes) -> PageBlock {
        PageBlock {
            claimed: Some(Claimed {
                alloc: AllocWords::new(&alloc),
                bytes,
                owner,
            }),
        }
    }

    #[inline]
    fn claimed(&self) -> &Claimed {
        match &self.claimed {
            Some(c) => c,
            None => unreachable!("a block is used only before it is freed"),
        }
    }

    #[inline]
    fn claimed_mut(&mut self) -> &mut Claimed {
        match &mut self.claimed {
            Some(c) => c,
            None => unreachable!("a block is used only before it is freed"),
        }
    }

    /// The block.
    pub fn block(&self) -> Block {
        self.claimed().alloc.block()
    }

    /// How it was allocated (zeroing done or skipped, prior free state).
    pub fn allocation(&self) -> Allocation {
        self.claimed().alloc.get()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let c = self.claimed();
        c.bytes.as_slice(c.owner.caches.ram())
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let c = self.claimed_mut();
        c.bytes.as_mut_slice(c.owner.caches.ram())
    }

    /// Writes one byte every `stride` bytes (0 = 4 KiB) without changing contents: faults
    /// the block in for writing.
    pub fn touch(&mut self, stride: usize) {
        let c = self.claimed_mut();
        c.bytes.touch(c.owner.caches.ram(), stride);
    }

    /// Frees the block (contents unknown).
    #[inline]
    pub fn free(self) -> Result<(), FreeError> {
        self.release_then_drop(FreeHint::Dirty)
    }

    /// Frees a block the caller knows reads zero (checked in verify mode; on a failed
    /// check the block stays allocated and is freed dirty on drop).
    pub fn free_zeroed(self) -> Result<(), FreeError> {
        self.release_then_drop(FreeHint::KnownZero)
    }

    /// Releases the block with `hint`; a handle that released it holds nothing, so it is
    /// forgotten (its drop would only find that out, through three calls a free). A
    /// failed release leaves the block with the handle, whose drop frees it dirty.
    #[inline(always)]
    fn release_then_drop(mut self, hint: FreeHint) -> Result<(), FreeError> {
        let result = self.release(hint, u64::MAX);
        if self.claimed.is_none() {
            std::mem::forget(self);
        }
        result
    }

    /// The holder of a block handed out with [`Writes::Prefix`] writes its first `pages`
    /// pages from now on (a grow within the block).
    pub(crate) fn writes_up_to(&self, pages: u64) {
        let c = self.claimed();
        if let Some(l) = c.owner.caches.life() {
            let block = c.alloc.block();
            l.map
                .written(PageRange::new(block.pfn, pages.min(block.order.pages())));
        }
    }

    /// Discards the pages from `from_page` to the end of the block (their backing goes,
    /// they read zero afterwards when the backing guarantees it: returned).
    pub(crate) fn discard_tail(&mut self, from_page: u64) -> Result<bool, DiscardError> {
        let c = self.claimed_mut();
        let pages = c.alloc.block().order.pages();
        if from_page >= pages {
            return Ok(true);
        }
        let op = DiscardOp::best_for(c.owner.caches.ram().backing());
        let start = (from_page * PAGE_SIZE) as usize;
        let len = ((pages - from_page) * PAGE_SIZE) as usize;
        let ram = c.owner.caches.ram();
        Ok(c.bytes.discard_part(ram, start, len, op)?.is_zeroed())
    }

    /// Grows the block in place to `order` when its upper buddies are free; whether it
    /// did (the grown part's contents are unspecified). `false` on any failure too.
    pub(crate) fn grow_in_place(&mut self, order: Order) -> bool {
        let c = self.claimed_mut();
        let caches = &c.owner.caches;
        let Ok(Some(grown)) = caches.manager().grow_in_place(c.alloc.block(), order) else {
            return false;
        };
        if let Some(l) = caches.life() {
            l.map.handed_out(grown);
        }
        c.alloc = c.alloc.with_block(grown);
        // The claim follows the block: the old bytes' claim ends, the grown block's begins.
        c.bytes.release(caches.ram());
        match ClaimedBytes::claim(caches.ram(), grown.pfn, grown.order) {
            Ok(bytes) => {
                c.bytes = bytes;
                true
            }
            Err(e) => {
                tracing::error!(%e, %grown, "claiming a grown block failed");
                false
            }
        }
    }

    /// Frees the block (dirty), vouching that every page from `zero_from` on reads zero
    /// (never written, or discarded): those chunks are not zeroed again.
    pub(crate) fn free_with_zero_tail(mut self, zero_from: u64) -> Result<(), FreeError> {
        self.release(FreeHint::Dirty, zero_from)
    }

    /// Frees with `hint`, the pages from `zero_from` on known to read zero; on an error
    /// the block stays this handle's. The fast path (a block kept for this thread) is
    /// inlined into the caller.
    #[inline(always)]
    fn release(&mut self, hint: FreeHint, zero_from: u64) -> Result<(), FreeError> {
        let keepable = hint == FreeHint::Dirty
            && self
                .claimed
                .as_ref()
                .is_some_and(|c| !c.owner.init_on_free && c.bytes.is_claimed());
        if keepable && Caches::keep(&mut self.claimed) {
            return Ok(());
        }
        let Some(claimed) = self.claimed.take() else {
            return Ok(());
        };
        self.release_slow(claimed, hint, zero_from)
    }

    /// [`PageBlock::release`] past the kept blocks: to the manager.
    #[inline(never)]
    fn release_slow(
        &mut self,
        mut claimed: Claimed,
        mut hint: FreeHint,
        zero_from: u64,
    ) -> Result<(), FreeError> {
        if !claimed.bytes.is_claimed() {
            // A failed free left it without its bytes: nothing more to do.
            self.claimed = Some(claimed);
            return Ok(());
        }
        let block = claimed.alloc.block();
        let caches = &claimed.owner.caches;
        if let Some(l) = caches.life() {
            if l.init_on_free && hint == FreeHint::Dirty {
                claimed.bytes.zero(caches.ram());
                l.map.count_zeroed(Site::AtFree, block.order.bytes());
                hint = FreeHint::KnownZero;
            }
        }
        let pages = PageTables::of(&claimed.alloc.get());
        let bytes = &mut claimed.bytes;
        let result = caches.give_back(block, bytes, hint, zero_from, pages, Via::Cache);
        if result.is_err() {
            self.claimed = Some(claimed);
        }
        result
    }
}

impl Drop for PageBlock {
    fn drop(&mut self) {
        if let Err(e) = self.release(FreeHint::Dirty, u64::MAX) {
            tracing::error!(%e, block = %self.block(), "freeing a block on drop failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_reference_is_the_last_word_of_a_block() {
        // See `Claimed`: the niche the `Option`s test must not split the other words.
        let words = std::mem::size_of::<Claimed>() / std::mem::size_of::<u64>();
        assert_eq!(words, 7);
        assert_eq!(
            std::mem::offset_of!(Claimed, owner),
            std::mem::size_of::<Claimed>() - std::mem::size_of::<Arc<OwnerRef>>()
        );
        assert_eq!(
            std::mem::size_of::<PageBlock>(),
            std::mem::size_of::<Claimed>()
        );
    }
}
