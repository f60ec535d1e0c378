//! Consistency check of the pool's lists, counts and page states.

use super::{HugePool, PageState};
use crate::types::ZoneId;

impl HugePool {
    /// Checks that lists, counts and page states agree (O(pages)); `Err` names the first
    /// disagreement. A bug in this module if it fails.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![false; self.slots.len()];
        for (n, node) in self.nodes.iter().enumerate() {
            let lists = node
                .known_zero
                .iter()
                .map(|i| (i, PageState::Free { known_zero: true }));
            let lists = lists.chain(
                node.dirty
                    .iter()
                    .map(|i| (i, PageState::Free { known_zero: false })),
            );
            for (&i, want) in lists {
                let slot = self.slots[i as usize];
                if std::mem::replace(&mut seen[i as usize], true) {
                    return Err(format!("{:?} listed twice", slot.page));
                }
                if slot.state != want || slot.page.node != ZoneId(n) {
                    return Err(format!(
                        "{:?} listed as {want:?} on node {n}, is {:?}",
                        slot.page, slot.state
                    ));
                }
            }
            let count = |st: PageState| {
                self.slots
                    .iter()
                    .filter(|s| s.page.node == ZoneId(n) && s.state == st)
                    .count() as u64
            };
            if count(PageState::InUse) != node.in_use || count(PageState::Zeroing) != node.zeroing {
                return Err(format!("node {n}: in-use / zeroing counts are off"));
            }
        }
        for (i, slot) in self.slots.iter().enumerate() {
            if matches!(slot.state, PageState::Free { .. }) && !seen[i] {
                return Err(format!("free {:?} is on no list", slot.page));
            }
            if self.by_pfn.get(&slot.page.pfn).map(|&j| j as usize) != Some(i) {
                return Err(format!("{:?} is not indexed", slot.page));
            }
        }
        if self.by_pfn.len() != self.slots.len() {
            return Err("index and slots disagree".into());
        }
        Ok(())
    }
}
