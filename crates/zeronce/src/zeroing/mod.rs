//! Who zeroes process memory and what is known zero per chunk: the [`RamZeroer`] the
//! manager calls, the chunk states of [`zeromap`] (with a bit per page written since its
//! last zeroing), the [`background`] zeroer threads of the zero-once lifecycle, and the
//! [`Lifecycle`] every free and allocation of process mode goes through.

pub(crate) mod background;
mod chunks;
mod written;
mod zeroer;
pub(crate) mod zeromap;

pub use background::ZeroerConfig;
pub use zeroer::RamZeroer;
pub use zeromap::ZeroingStats;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use zeronce_mem::SharedRam;
use zeronce_mm::{Block, FreeHint};

use crate::fastpath::PageTables;

/// What a free and an allocation do besides the manager's work (process mode): chunk
/// states, the background zeroer, the hardening options.
pub(crate) struct Lifecycle {
    /// Background zeroer threads (`None`: none running).
    pub(crate) zeroer: Option<background::BackgroundZeroer>,
    /// Chunk states shared with the zeroers and the device.
    pub(crate) map: std::sync::Arc<zeromap::ZeroMap>,
    /// Zero every block at free (Linux `init_on_free=1`); it is freed known zero.
    pub(crate) init_on_free: bool,
    /// Every allocation is a zero-request (Linux `init_on_alloc=1`): zeroed unless known
    /// zero.
    pub(crate) init_on_alloc: bool,
    /// Freed blocks of a chunk or more are looked up in the page tables
    /// ([`zeromap::ZeroMap::freed_scanned`]); off for memory that is not private
    /// anonymous, when the builder says so, and after a scan failed (an older kernel).
    pub(crate) scan_freed: AtomicBool,
}

impl Lifecycle {
    /// A block is being freed by its owner, its pages from `zero_from` on reading zero
    /// ([`zeromap::ZeroMap::freed`]); a block of a chunk or more is looked up in the page
    /// tables of `ram` first, when scans are on and `pages` says a look may find pages
    /// with none behind them, so the pages its holder never wrote are not zeroed again.
    /// One failed scan turns them off, with one line.
    pub(crate) fn freed(&self, ram: &SharedRam, block: Block, zero_from: u64, pages: PageTables) {
        let scan = pages == PageTables::Look
            && zero_from > 0
            && block.order >= self.map.chunk_order()
            && self.scan_freed.load(Relaxed);
        if !scan {
            return self.map.freed(block, zero_from);
        }
        if let Err(e) = self.map.freed_scanned(block, zero_from, ram) {
            if self.scan_freed.swap(false, Relaxed) {
                tracing::warn!(
                    %e,
                    "page-table scans at free are off: every page of a freed block counts as written"
                );
            }
        }
    }

    /// A block was freed with `hint`: wakes the zeroer if it left dirty chunks. Inlined
    /// into [`crate::fastpath::ThreadCaches::give_back`]: without a zeroer it is one test.
    #[inline]
    pub(crate) fn after_free(&self, block: Block, hint: FreeHint) {
        if let Some(z) = &self.zeroer {
            if hint == FreeHint::Dirty && block.order >= self.map.chunk_order() {
                z.freed(block.order.bytes());
            }
        }
    }
}
