//! Growing an allocated block in place (`realloc` of a large block): the block takes its
//! free upper buddies, order by order, when every one of them is free.

use super::{lock, MemoryManager};
use crate::error::FreeError;
use crate::types::{Block, Order};

impl MemoryManager {
    /// Grows the allocated `block` to `order` in place: succeeds (returns the grown block)
    /// when `block` is the lower buddy at every order up to `order` and each upper buddy
    /// is a whole free block (any state: the grown part's contents are unspecified).
    /// Blocks small enough for per-thread caches, and every other case, change nothing
    /// and return `Ok(None)`; a block that is not allocated is a typed error.
    pub fn grow_in_place(&self, block: Block, order: Order) -> Result<Option<Block>, FreeError> {
        let slot = self
            .slot_of(block.pfn)
            .ok_or(FreeError::NotOwned(block.pfn))?;
        let mut zone = lock(slot);
        zone.check_allocated(block)?;
        let grown = Block::new(block.pfn, order);
        if order <= block.order
            || block.order <= crate::PCP_MAX_ORDER
            || order > self.config.max_order
            || !grown.is_aligned()
            || !zone.range.contains_range(&grown.range())
        {
            return Ok(None);
        }
        Ok(zone.grow(block, order).then_some(grown))
    }
}
