//! Surplus pages: a pool carved from and given back to the buddy allocator.

use super::{HugePage, HugePool, HugePoolError, Origin, Slot};
use crate::manager::{AllocRequest, FreeHint, MemoryManager, Zeroing};

impl HugePool {
    /// Takes up to `count` pages of the pool's order from `mm` (surplus pages), with a
    /// zero-request if `zeroed` (the manager skips zeroing known-zero blocks). A page is
    /// known zero if it was zeroed or its buddy block was known zero (e.g. reported and
    /// zeroed by the host): such pages are no zeroable work. Stops at the first failure
    /// (returned if no page was carved). Returns the pages carved.
    pub fn carve(
        &mut self,
        mm: &MemoryManager,
        count: u64,
        zeroed: bool,
    ) -> Result<u64, HugePoolError> {
        let req = AllocRequest { zeroed, hint: None };
        let mut carved = 0;
        let mut grew = Vec::new();
        for _ in 0..count {
            let a = match mm.alloc(self.order, req) {
                Ok(a) => a,
                Err(e) if carved == 0 => return Err(e.into()),
                Err(_) => break,
            };
            let known_zero = a.zeroing != Zeroing::NotRequested || a.prior.known_zero;
            let page = HugePage {
                pfn: a.block.pfn,
                order: self.order,
                node: a.zone,
            };
            if let Err(e) = self.insert(page, Origin::Buddy, known_zero) {
                // Only possible if the manager handed out a page twice; keep it out.
                let _ = mm.free(a.block, FreeHint::Dirty);
                return Err(e);
            }
            carved += 1;
            if !known_zero && !grew.contains(&a.zone) {
                grew.push(a.zone);
            }
        }
        for node in grew {
            self.zeroable_grew(node);
        }
        Ok(carved)
    }

    /// Gives up to `max` free buddy-carved pages back to `mm` (dirty ones first; known-zero
    /// ones with [`FreeHint::KnownZero`], so the manager keeps the fact). Returns the
    /// pages released.
    pub fn release_to(&mut self, mm: &MemoryManager, max: u64) -> Result<u64, HugePoolError> {
        let mut released = 0;
        for node in 0..self.nodes.len() {
            for known_zero in [false, true] {
                while released < max {
                    let Some(index) =
                        self.pop_free_where(node, known_zero, |s| s.origin == Origin::Buddy)
                    else {
                        break;
                    };
                    let slot = self.remove_slot(index);
                    let hint = if known_zero {
                        FreeHint::KnownZero
                    } else {
                        FreeHint::Dirty
                    };
                    mm.free(slot.page.block(), hint)?;
                    released += 1;
                }
            }
        }
        Ok(released)
    }

    /// Pops a free page of `node` in the given state whose slot satisfies `keep`.
    fn pop_free_where(
        &mut self,
        node: usize,
        known_zero: bool,
        keep: impl Fn(&Slot) -> bool,
    ) -> Option<u32> {
        let slots = &self.slots;
        let ok = |i: &u32| slots[*i as usize].as_ref().is_some_and(&keep);
        let n = &mut self.nodes[node];
        if known_zero {
            let at = n.known_zero.iter().rposition(ok)?;
            Some(n.known_zero.swap_remove(at))
        } else {
            let at = n.dirty.iter().rposition(ok)?;
            n.dirty.remove(at)
        }
    }

    fn remove_slot(&mut self, index: u32) -> Slot {
        let slot = self.slots[index as usize]
            .take()
            .expect("listed slot exists");
        self.by_pfn.remove(&slot.page.pfn);
        self.vacant.push(index);
        slot
    }
}
