//! Requests the device has accepted but not yet returned to the guest: the held list
//! (hold policy) and the requests of the batch being served, with the memory they will
//! discard and the buffers the device will still write.
//!
//! Two rules live here:
//! - a descriptor is returned to the guest exactly once, so a head the device holds (or
//!   has already taken in this batch) is refused when published again, and not used;
//! - a zero promise is true when it is published, so no device write lands on memory an
//!   in-flight request discards: a request whose discards overlap a bitmap the device
//!   still has to write, or whose bitmap overlaps memory an in-flight request discards,
//!   is refused before anything of it happens (whatever order the requests complete in).
//!
//! Lookups are `O(log n)`; held work is bounded in bytes by
//! [`MAX_HELD_BYTES`](crate::spec::limits::MAX_HELD_BYTES).

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use vm_memory::GuestAddress;

use crate::discard::PlannedDiscard;
use crate::error::BalloonError;
use crate::features::QueueKind;
use crate::queues::inflate::Pfn4k;
use crate::spec::limits::MAX_HELD_BYTES;
use crate::spec::PFN_PAGE_SIZE;

/// What a request does at completion.
#[derive(Clone, Debug)]
pub(crate) enum Work {
    /// Planned at completion (4 bytes per PFN while held, not a plan's ~90; and the
    /// partial host pages advance when the discard really happens).
    Inflate {
        pfns: Vec<Pfn4k>,
        bitmap: Option<GuestAddress>,
    },
    Report {
        blocks: Vec<PlannedDiscard>,
        total_len: u32,
    },
}

impl Work {
    /// Host bytes this work keeps while held (see `MAX_HELD_BYTES`).
    fn cost(&self) -> usize {
        match self {
            Work::Inflate { pfns, .. } => 4 * pfns.len(),
            Work::Report { blocks, .. } => std::mem::size_of::<PlannedDiscard>() * blocks.len(),
        }
    }

    /// The guest ranges `[start, end)` this work discards (inflate: the 4 KiB page of
    /// each PFN, which is what its bitmap bit vouches for).
    fn discards(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (pfns, blocks): (&[Pfn4k], &[PlannedDiscard]) = match self {
            Work::Inflate { pfns, .. } => (pfns, &[]),
            Work::Report { blocks, .. } => (&[], blocks),
        };
        let page = |p: &Pfn4k| (p.gpa().0, p.gpa().0 + PFN_PAGE_SIZE);
        let block = |b: &PlannedDiscard| (b.gpa.0, b.gpa.0.saturating_add(b.len));
        pfns.iter().map(page).chain(blocks.iter().map(block))
    }

    /// The buffer the device writes at completion (the inflate bitmap: `ceil(n / 8)`).
    fn write(&self) -> Option<(u64, u64)> {
        match self {
            Work::Inflate {
                pfns,
                bitmap: Some(a),
            } => Some((a.0, a.0.saturating_add(pfns.len().div_ceil(8) as u64))),
            _ => None,
        }
    }
}

/// A held request.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub queue_index: u16,
    pub head: u16,
    pub work: Work,
}

/// A set of disjoint, merged half-open ranges: insert and overlap in `O(log n)`.
#[derive(Clone, Debug, Default)]
pub(crate) struct RangeSet {
    /// start → end, disjoint and not touching.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// Whether `[start, end)` overlaps a range of the set.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        start < end
            && self
                .map
                .range(..end)
                .next_back()
                .is_some_and(|(_, &e)| e > start)
    }

    /// Adds `[start, end)`, merging with the ranges it overlaps or touches.
    pub fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= end {
                // Already covered: the common case of a guest reporting the same blocks
                // in every chain, where a remove and re-insert would dominate the batch.
                return;
            }
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
    }

    fn clear(&mut self) {
        self.map.clear();
    }
}

/// The device's in-flight requests (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// Held requests by (deadline, arrival).
    held: BTreeMap<(Instant, u64), Held>,
    arrivals: u64,
    /// (queue index, head) of every held request.
    heads: HashSet<(u16, u16)>,
    /// Bytes of held work.
    cost: usize,
    /// Bitmaps of in-flight requests.
    writes: RangeSet,
    /// Memory in-flight requests discard.
    discards: RangeSet,
    /// The sets still hold ranges of requests completed since they were rebuilt.
    stale: bool,
}

impl InFlight {
    /// Whether `head` of queue `index` is held.
    pub fn is_held(&self, index: u16, head: u16) -> bool {
        self.heads.contains(&(index, head))
    }

    /// Refuses `work` when a range it discards overlaps `rings`, its own bitmap or an
    /// in-flight bitmap, or its bitmap overlaps what an in-flight request discards.
    pub fn check(
        &self,
        queue: QueueKind,
        rings: &[(u64, u64)],
        work: &Work,
    ) -> Result<(), BalloonError> {
        let write = work.write();
        let refuse = |(gpa, end): (u64, u64)| BalloonError::DiscardOverlap {
            queue,
            gpa,
            len: end - gpa,
        };
        for (s, e) in work.discards() {
            let on_rings = rings.iter().any(|&(rs, re)| s < re && rs < e);
            let on_own = write.is_some_and(|(ws, we)| s < we && ws < e);
            if on_rings || on_own || self.writes.overlaps(s, e) {
                return Err(refuse((s, e)));
            }
        }
        if let Some((s, e)) = write {
            if self.discards.overlaps(s, e) || self.writes.overlaps(s, e) {
                return Err(refuse((s, e)));
            }
        }
        Ok(())
    }

    /// Records `work` as in flight (after [`InFlight::check`]). Work completed in the
    /// same batch stays in flight until [`InFlight::end_batch`].
    pub fn admit(&mut self, work: &Work) {
        admit(&mut self.writes, &mut self.discards, work);
    }

    /// Marks admitted work as completed: its ranges go at the end of the batch.
    pub fn completed(&mut self) {
        self.stale = true;
    }

    /// Whether `work` fits the bound on held work.
    pub fn can_hold(&self, work: &Work) -> bool {
        self.cost + work.cost() <= MAX_HELD_BYTES
    }

    /// Holds an admitted request until `deadline`.
    pub fn hold(&mut self, deadline: Instant, held: Held) {
        self.cost += held.work.cost();
        self.heads.insert((held.queue_index, held.head));
        self.arrivals += 1;
        self.held.insert((deadline, self.arrivals), held);
    }

    /// Takes the held requests due at `now`, in deadline order (their ranges stay in
    /// flight until [`InFlight::end_batch`]).
    pub fn take_due(&mut self, now: Instant) -> Vec<Held> {
        let later = self.held.split_off(&(now, u64::MAX));
        let due: Vec<Held> = std::mem::replace(&mut self.held, later)
            .into_values()
            .collect();
        for h in &due {
            self.cost -= h.work.cost();
            self.heads.remove(&(h.queue_index, h.head));
            self.stale = true;
        }
        due
    }

    /// Ends a batch: forgets the ranges of requests no longer in flight.
    pub fn end_batch(&mut self) {
        if !self.stale {
            return;
        }
        self.stale = false;
        self.writes.clear();
        self.discards.clear();
        for h in self.held.values() {
            admit(&mut self.writes, &mut self.discards, &h.work);
        }
    }

    /// Bytes of held work.
    pub fn cost(&self) -> usize {
        self.cost
    }

    /// Number of held requests.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.held.keys().next().map(|(d, _)| *d)
    }

    /// Forgets everything (device reset: nothing held is discarded).
    pub fn clear(&mut self) {
        *self = InFlight::default();
    }
}

fn admit(writes: &mut RangeSet, discards: &mut RangeSet, work: &Work) {
    for (s, e) in work.discards() {
        discards.insert(s, e);
    }
    if let Some((s, e)) = work.write() {
        writes.insert(s, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_set_merges_and_finds_overlaps() {
        let mut s = RangeSet::default();
        s.insert(10, 20);
        s.insert(30, 40);
        assert!(!s.overlaps(20, 30) && !s.overlaps(0, 10) && !s.overlaps(40, 50));
        assert!(s.overlaps(19, 21) && s.overlaps(0, 100) && s.overlaps(35, 36));
        s.insert(20, 30);
        assert_eq!(s.map.len(), 1, "touching ranges merge");
        s.insert(5, 45);
        assert_eq!(s.map.iter().next(), Some((&5, &45)));
        s.insert(10, 45);
        s.insert(5, 6);
        assert_eq!(
            s.map.iter().collect::<Vec<_>>(),
            [(&5, &45)],
            "covered ranges"
        );
        assert!(!s.overlaps(7, 7), "empty range");
    }
}
