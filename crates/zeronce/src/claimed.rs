//! [`ClaimedBytes`]: the bytes of an allocated block (buddy block or pool page), claimed through
//! a [`RamRange`] claim from allocation until the block is given back.

use std::sync::Arc;

use zeronce_mem::{ClaimError, DiscardError, DiscardOp, RamRange, SharedRam, ZeroGuarantee};
use zeronce_mm::{Order, Pfn};

/// The claimed bytes of a block; empty once released.
#[derive(Debug, Default)]
pub(crate) struct ClaimedBytes(Option<RamRange>);

impl ClaimedBytes {
    /// Claims the bytes of the block at `pfn` of `order`.
    pub(crate) fn claim(ram: &Arc<SharedRam>, pfn: Pfn, order: Order) -> Result<Self, ClaimError> {
        ram.claim(pfn.byte_offset() as usize, order.bytes() as usize)
            .map(|r| ClaimedBytes(Some(r)))
    }

    /// Whether the bytes are still claimed (not released).
    pub(crate) fn is_claimed(&self) -> bool {
        self.0.is_some()
    }

    /// The bytes (empty once released).
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |r| r.as_slice())
    }

    /// The bytes, mutably (empty once released).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.0.as_mut().map_or(&mut [], |r| r.as_mut_slice())
    }

    /// Writes one byte every `stride` bytes (0 = 4 KiB) with its own value.
    pub(crate) fn touch(&mut self, stride: usize) {
        if let Some(r) = self.0.as_mut() {
            r.touch(stride);
        }
    }

    /// Zeroes the claimed bytes (streaming stores from 1 MiB up).
    pub(crate) fn zero(&mut self) {
        if let Some(r) = self.0.as_mut() {
            r.zero(None);
        }
    }

    /// Discards `len` bytes from byte `start` of the claimed bytes with `op`.
    pub(crate) fn discard_part(
        &mut self,
        start: usize,
        len: usize,
        op: DiscardOp,
    ) -> Result<ZeroGuarantee, DiscardError> {
        match self.0.as_mut() {
            Some(r) => r.discard_part(start, len, op),
            None => Err(DiscardError::Empty { addr: start }),
        }
    }

    /// Whether the claimed bytes all read zero (`false` once released).
    pub(crate) fn is_zero(&self) -> bool {
        self.0.as_ref().is_some_and(|r| r.is_zero())
    }

    /// Ends the claim, so the allocator (or a verify read) may touch the block again;
    /// `false` if it was already released.
    pub(crate) fn release(&mut self) -> bool {
        self.0.take().is_some()
    }
}
