//! [`ClaimedBytes`]: the bytes of an allocated block (buddy block or pool page), claimed
//! through a bare [`RamClaim`] from allocation until the block is given back. The claim
//! holds no reference to the RAM: the block's owner does (one reference per owner, not one
//! counted up and down per block), and every method takes the RAM it was claimed from.

use zeronce_mem::{ClaimError, DiscardError, DiscardOp, RamClaim, SharedRam, ZeroGuarantee};
use zeronce_mm::{Block, Order, Pfn};

/// The claimed bytes of a block; empty once released.
#[derive(Debug, Default)]
pub(crate) struct ClaimedBytes(Option<RamClaim>);

impl ClaimedBytes {
    /// Claims the bytes of the block at `pfn` of `order`.
    pub(crate) fn claim(ram: &SharedRam, pfn: Pfn, order: Order) -> Result<Self, ClaimError> {
        ram.claim_bare(pfn.byte_offset() as usize, order.bytes() as usize)
            .map(|c| ClaimedBytes(Some(c)))
    }

    /// Claims the bytes of each of `blocks` and calls `ok` with the block's index and its
    /// bytes, or `failed` with the index and the error, in index order: neighbouring 2
    /// MiB blocks of one 16 MiB-aligned stretch with one atomic step
    /// ([`SharedRam::claim_bare_each`]).
    pub(crate) fn claim_each(
        ram: &SharedRam,
        blocks: &[Block],
        mut ok: impl FnMut(usize, Self),
        mut failed: impl FnMut(usize, ClaimError),
    ) {
        // A kept list's whole refill in one piece: pieces of 8 cut a stretch whose blocks
        // do not start at a piece's start in two, two atomic steps instead of one.
        const BATCH: usize = 32;
        for (n, part) in blocks.chunks(BATCH).enumerate() {
            let mut ranges = [(0, 0); BATCH];
            for (r, b) in ranges.iter_mut().zip(part) {
                *r = (b.pfn.byte_offset() as usize, b.order.bytes() as usize);
            }
            ram.claim_bare_each(
                &ranges[..part.len()],
                |k, c| ok(n * BATCH + k, ClaimedBytes(Some(c))),
                |k, e| failed(n * BATCH + k, e),
            );
        }
    }

    /// Ends the claims of `bytes` together, as [`ClaimedBytes::release`] of each would
    /// ([`SharedRam::release_each`]); the ones already released are skipped.
    pub(crate) fn release_each(ram: &SharedRam, bytes: &mut [ClaimedBytes]) {
        ram.release_each(bytes.iter_mut().filter_map(|b| b.0.take()));
    }

    /// Whether the bytes are still claimed (not released).
    pub(crate) fn is_claimed(&self) -> bool {
        self.0.is_some()
    }

    /// The bytes (empty once released); `ram` is the RAM they were claimed from.
    pub(crate) fn as_slice<'a>(&'a self, ram: &'a SharedRam) -> &'a [u8] {
        self.0.as_ref().map_or(&[], |c| ram.bytes(c))
    }

    /// The bytes, mutably (empty once released).
    pub(crate) fn as_mut_slice<'a>(&'a mut self, ram: &'a SharedRam) -> &'a mut [u8] {
        self.0.as_mut().map_or(&mut [], |c| ram.bytes_mut(c))
    }

    /// Writes one byte every `stride` bytes (0 = 4 KiB) with its own value.
    pub(crate) fn touch(&mut self, ram: &SharedRam, stride: usize) {
        if let Some(c) = self.0.as_mut() {
            ram.touch_claim(c, stride);
        }
    }

    /// Zeroes the claimed bytes (streaming stores from 1 MiB up).
    pub(crate) fn zero(&mut self, ram: &SharedRam) {
        if let Some(c) = self.0.as_mut() {
            ram.zero_claim(c, None);
        }
    }

    /// Discards `len` bytes from byte `start` of the claimed bytes with `op`.
    pub(crate) fn discard_part(
        &mut self,
        ram: &SharedRam,
        start: usize,
        len: usize,
        op: DiscardOp,
    ) -> Result<ZeroGuarantee, DiscardError> {
        match self.0.as_mut() {
            Some(c) => ram.discard_claim_part(c, start, len, op),
            None => Err(DiscardError::Empty { addr: start }),
        }
    }

    /// Whether the claimed bytes all read zero (`false` once released).
    pub(crate) fn is_zero(&self, ram: &SharedRam) -> bool {
        self.0.as_ref().is_some_and(|c| ram.claim_is_zero(c))
    }

    /// Ends the claim, so the allocator (or a verify read) may touch the block again;
    /// `false` if it was already released.
    pub(crate) fn release(&mut self, ram: &SharedRam) -> bool {
        match self.0.take() {
            Some(c) => {
                ram.release(c);
                true
            }
            None => false,
        }
    }
}

impl Drop for ClaimedBytes {
    /// Inlined, so that dropping released bytes (the common case: every way back
    /// releases them first) is one comparison where it happens, not a call.
    #[inline]
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            dropped_unreleased(c);
        }
    }
}

/// Every way back releases the claim first; one dropped with it would keep the block's
/// pages claimed for good (no alias: the block can no longer be claimed).
#[cold]
#[inline(never)]
fn dropped_unreleased(c: &RamClaim) {
    tracing::error!(
        offset = c.offset(),
        len = c.len(),
        "a block's claim was dropped unreleased"
    );
    debug_assert!(false, "a block's claim was dropped unreleased");
}
