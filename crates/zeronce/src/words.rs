//! [`AllocWords`]: an [`Allocation`] as three whole words, the form a
//! [`crate::PageBlock`] (and a kept block) stores it in.
//!
//! [`Allocation`] has byte-sized fields (the order, the zeroing, the free state's flags).
//! In a block handle those become the niche of `Option`/`Result` around it, and the
//! compiler then copies the handle in pieces around that byte: a copy read back at once
//! (a block popped from a kept list and returned) straddles two earlier stores and stalls
//! store forwarding, the largest cost of the fast path. Whole words move as whole words.

use zeronce_mm::{Allocation, Block, FreeState, Order, Pfn, Zeroing, ZoneId};

/// Bits of [`AllocWords::meta`]: the order in the low byte, then the zeroing, then the
/// prior free state's flags.
const ORDER_BITS: u64 = 0xff;
const ZEROING_SHIFT: u32 = 8;
const KNOWN_ZERO_BIT: u64 = 1 << 10;
const REPORTED_BIT: u64 = 1 << 11;

/// An [`Allocation`] in words (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AllocWords {
    pfn: u64,
    zone: u64,
    meta: u64,
}

fn zeroing_code(z: Zeroing) -> u64 {
    match z {
        Zeroing::Skipped => 0,
        Zeroing::Done => 1,
        Zeroing::NotRequested => 2,
    }
}

impl AllocWords {
    /// `a` in words.
    pub(crate) fn new(a: &Allocation) -> Self {
        let mut meta = u64::from(a.block.order.get()) | zeroing_code(a.zeroing) << ZEROING_SHIFT;
        if a.prior.known_zero {
            meta |= KNOWN_ZERO_BIT;
        }
        if a.prior.reported {
            meta |= REPORTED_BIT;
        }
        AllocWords {
            pfn: a.block.pfn.0,
            zone: a.zone.0 as u64,
            meta,
        }
    }

    /// The block.
    #[inline]
    pub(crate) fn block(self) -> Block {
        // The low byte came from an `Order`: always valid.
        let order = Order::new((self.meta & ORDER_BITS) as u8).unwrap_or(Order::ZERO);
        Block::new(Pfn(self.pfn), order)
    }

    /// The allocation.
    pub(crate) fn get(self) -> Allocation {
        let zeroing = match (self.meta >> ZEROING_SHIFT) & 3 {
            0 => Zeroing::Skipped,
            1 => Zeroing::Done,
            _ => Zeroing::NotRequested,
        };
        Allocation {
            block: self.block(),
            zone: ZoneId(self.zone as usize),
            zeroing,
            prior: FreeState {
                known_zero: self.meta & KNOWN_ZERO_BIT != 0,
                reported: self.meta & REPORTED_BIT != 0,
            },
        }
    }

    /// The same allocation with `block` (grown in place).
    pub(crate) fn with_block(self, block: Block) -> Self {
        AllocWords {
            pfn: block.pfn.0,
            meta: (self.meta & !ORDER_BITS) | u64::from(block.order.get()),
            ..self
        }
    }

    /// The block handed out again from a kept list: dirty, not zeroed for its new owner.
    #[inline]
    pub(crate) fn reused(self) -> Self {
        AllocWords {
            meta: (self.meta & ORDER_BITS) | zeroing_code(Zeroing::NotRequested) << ZEROING_SHIFT,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn an_allocation_survives_its_words(
            pfn in any::<u64>(), order in 0u8..=zeronce_mm::MAX_ORDER_LIMIT, zone in 0usize..64,
            zeroing in 0u8..3, known_zero: bool, reported: bool,
        ) {
            let a = Allocation {
                block: Block::new(Pfn(pfn), Order::new(order).unwrap()),
                zone: ZoneId(zone),
                zeroing: [Zeroing::Skipped, Zeroing::Done, Zeroing::NotRequested][zeroing as usize],
                prior: FreeState { known_zero, reported },
            };
            let w = AllocWords::new(&a);
            prop_assert_eq!(w.get(), a);
            prop_assert_eq!(w.block(), a.block);
            let r = w.reused().get();
            prop_assert_eq!(r.block, a.block);
            prop_assert_eq!(r.zone, a.zone);
            prop_assert_eq!(r.zeroing, Zeroing::NotRequested);
            prop_assert_eq!(r.prior, FreeState::DIRTY);
            let grown = Block::new(Pfn(pfn & !1), Order::new(order.saturating_sub(1)).unwrap());
            prop_assert_eq!(w.with_block(grown).get(), Allocation { block: grown, ..a });
        }
    }
}
