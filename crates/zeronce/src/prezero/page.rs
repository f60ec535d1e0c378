//! [`PoolPage`]: an allocated huge page that owns its bytes; freed (dirty) on drop.

use std::sync::Arc;

use zeronce_mm::hugepool::{HugePage, PoolAllocation, PoolZeroing};
use zeronce_mm::{FreeHint, Zeroer};

use super::PoolInner;
use crate::claimed::ClaimedBytes;
use crate::error::PrezeroError;

/// A page allocated from a [`super::HugePagePool`].
#[derive(Debug)]
pub struct PoolPage {
    inner: Arc<PoolInner>,
    allocation: PoolAllocation,
    /// Empty once freed.
    bytes: ClaimedBytes,
}

impl PoolPage {
    /// Zeroes the page if the pool says so, then claims its bytes. On failure the page
    /// goes back to the pool.
    pub(super) fn new(
        inner: Arc<PoolInner>,
        allocation: PoolAllocation,
    ) -> Result<PoolPage, PrezeroError> {
        let page = allocation.page;
        if allocation.zeroing == PoolZeroing::Required {
            // Ours alone now (in use); the write happens outside the pool lock.
            inner.zeroer.zero(page.range(), None);
        }
        match ClaimedBytes::claim(&inner.ram, page.pfn, page.order) {
            Ok(bytes) => Ok(PoolPage {
                inner,
                allocation,
                bytes,
            }),
            Err(e) => {
                let mut pool = inner.state.lock();
                let _ = pool.free(page, FreeHint::Dirty);
                inner.state.after_growth(&pool);
                Err(e.into())
            }
        }
    }

    /// The page.
    pub fn page(&self) -> HugePage {
        self.allocation.page
    }

    /// Whether it was served pre-zeroed, zeroed inline, or without zero-request.
    pub fn zeroing(&self) -> PoolZeroing {
        self.allocation.zeroing
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.as_slice(&self.inner.ram)
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.bytes.as_mut_slice(&self.inner.ram)
    }

    /// Writes one byte every `stride` bytes (0 = 4 KiB) with its own value: touches the
    /// page for writing without changing it.
    pub fn touch(&mut self, stride: usize) {
        self.bytes.touch(&self.inner.ram, stride);
    }

    /// Gives the page back, dirty (it becomes zeroable work).
    pub fn free(mut self) -> Result<(), PrezeroError> {
        self.release(FreeHint::Dirty)
    }

    /// Gives back a page the caller zeroed: checked by reading it, it goes back known zero
    /// (no zeroable work) if it reads zero, dirty otherwise. Returns whether it was zero.
    pub fn free_zeroed(mut self) -> Result<bool, PrezeroError> {
        let zero = self.bytes.is_zero(&self.inner.ram);
        let hint = if zero {
            FreeHint::KnownZero
        } else {
            FreeHint::Dirty
        };
        self.release(hint).map(|()| zero)
    }

    fn release(&mut self, hint: FreeHint) -> Result<(), PrezeroError> {
        if !self.bytes.release(&self.inner.ram) {
            return Ok(());
        }
        let state = &self.inner.state;
        let mut pool = state.lock();
        pool.free(self.allocation.page, hint)?;
        state.after_growth(&pool);
        drop(pool);
        state.ready.notify_all();
        Ok(())
    }
}

impl Drop for PoolPage {
    fn drop(&mut self) {
        if let Err(e) = self.release(FreeHint::Dirty) {
            tracing::error!(%e, page = ?self.allocation.page, "freeing a pool page on drop failed");
        }
    }
}
