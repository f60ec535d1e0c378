//! The reporting device of process mode: the Linux kernel is the host. A reported block's
//! backing is discarded in this process with the operation that fits the [`SharedRam`]'s
//! backing, and the answer is "zero" only when that operation guarantees it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use zeronce_balloon::DiscardPolicy;
use zeronce_mem::{DiscardOp, SharedRam};
use zeronce_mm::reporting::{ReportError, ReportingDevice, ZeroGuarantee};
use zeronce_mm::{PageRange, PAGE_SIZE};
use zeronce_types::clock::deadline_after;

use crate::policy::{self, PolicyError};
use crate::zeroing::zeromap::ZeroMap;

/// Counters of a [`ProcessDevice`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Bytes discarded.
    pub discarded_bytes: u64,
    /// Bytes answered "zero".
    pub zeroed_bytes: u64,
    /// Bytes currently held (hold policy).
    pub held_bytes: u64,
    /// Failed discards (each failed a whole report call).
    pub errors: u64,
}

/// Discards reported blocks of one [`SharedRam`] (see the module docs).
#[derive(Debug)]
pub struct ProcessDevice {
    ram: Arc<SharedRam>,
    op: DiscardOp,
    policy: DiscardPolicy,
    /// Answer "zero" when the discard guarantees it (`false`: a host without zero hints,
    /// the "skip redundant zeroing" series' baseline).
    zero_hints: bool,
    /// Held blocks: first PFN → (pages, end of hold). Never overlapping.
    held: BTreeMap<u64, (u64, Instant)>,
    stats: DeviceStats,
    /// Chunk states of the background zeroer, whose zeroing a discard waits out.
    map: Option<Arc<ZeroMap>>,
}

impl ProcessDevice {
    /// A device for `ram` with `policy`; `zero_hints: false` never answers "zero".
    pub fn new(
        ram: Arc<SharedRam>,
        policy: DiscardPolicy,
        zero_hints: bool,
    ) -> Result<Self, PolicyError> {
        let backing = ram.backing();
        let op = policy::discard_op(policy, backing)?;
        Ok(ProcessDevice {
            ram,
            op,
            policy,
            zero_hints,
            held: BTreeMap::new(),
            stats: DeviceStats::default(),
            map: None,
        })
    }

    /// Makes discards wait for the background zeroer to leave the block.
    pub(crate) fn set_zero_map(&mut self, map: Arc<ZeroMap>) {
        self.map = Some(map);
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// Discards one block; its verdict.
    fn discard(&mut self, block: &PageRange) -> Result<ZeroGuarantee, ReportError> {
        let offset = (block.start.0 * PAGE_SIZE) as usize;
        let len = block.bytes() as usize;
        // The block is isolated by the engine: no allocation holds a claim on it, and once
        // the zeroer is out no zeroer will take it (it checks that the block is free).
        if let Some(map) = &self.map {
            map.wait_no_zeroing(*block);
        }
        let mut range = self.ram.claim(offset, len).map_err(ReportError::new)?;
        match range.discard(self.op) {
            Ok(g) => {
                self.stats.discarded_bytes += len as u64;
                if g.is_zeroed() && self.zero_hints {
                    self.stats.zeroed_bytes += len as u64;
                    Ok(ZeroGuarantee::Zeroed)
                } else {
                    Ok(ZeroGuarantee::NotZeroed)
                }
            }
            Err(e) => {
                self.stats.errors += 1;
                tracing::warn!(%e, offset, len, "discard failed; batch goes back unreported");
                Err(ReportError::new(e))
            }
        }
    }

    /// One debug line for a batch of `blocks` blocks the engine handed over (`what`:
    /// "report" or "settle"): what this call discarded, answered zero and now holds.
    fn log_batch(&self, what: &'static str, blocks: usize, before: DeviceStats) {
        tracing::debug!(
            blocks,
            discarded_bytes = self.stats.discarded_bytes - before.discarded_bytes,
            answered_zero_bytes = self.stats.zeroed_bytes - before.zeroed_bytes,
            held_bytes = self.stats.held_bytes,
            op = %self.op,
            policy = ?self.policy,
            "host: {what} batch"
        );
    }

    /// Forgets held records overlapping `block` (it is being reported or settled anew).
    fn unhold(&mut self, block: &PageRange) -> Vec<(u64, u64, Instant)> {
        let end = block.end().0;
        let overlapping: Vec<u64> = self
            .held
            .range(..end)
            .rev()
            .take_while(|(&s, &(pages, _))| s + pages > block.start.0)
            .map(|(&s, _)| s)
            .collect();
        overlapping
            .into_iter()
            .filter_map(|s| {
                let (pages, until) = self.held.remove(&s)?;
                self.stats.held_bytes -= pages * PAGE_SIZE;
                Some((s, pages, until))
            })
            .collect()
    }
}

impl ReportingDevice for ProcessDevice {
    fn capacity(&self) -> usize {
        usize::MAX
    }

    fn report(
        &mut self,
        now: Instant,
        blocks: &[PageRange],
        verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), ReportError> {
        let before = self.stats;
        for (block, verdict) in blocks.iter().zip(verdicts.iter_mut()) {
            *verdict = match self.policy {
                DiscardPolicy::Immediate | DiscardPolicy::Lazy => self.discard(block)?,
                DiscardPolicy::Hold(hold) => {
                    // Nothing discarded yet: reported, not zero, until the hold is over.
                    self.unhold(block);
                    self.held
                        .insert(block.start.0, (block.pages, deadline_after(now, hold)));
                    self.stats.held_bytes += block.bytes();
                    ZeroGuarantee::NotZeroed
                }
            };
        }
        self.log_batch("report", blocks.len(), before);
        Ok(())
    }

    fn hold_expiry(&self) -> Option<Instant> {
        self.held.values().map(|&(_, until)| until).min()
    }

    fn settle(
        &mut self,
        now: Instant,
        blocks: &[PageRange],
        verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), ReportError> {
        let before = self.stats;
        for (block, verdict) in blocks.iter().zip(verdicts.iter_mut()) {
            let records = self.unhold(block);
            let covered: u64 = records
                .iter()
                .map(|&(s, p, _)| (s + p).min(block.end().0) - s.max(block.start.0))
                .sum();
            let expired = records.iter().all(|&(_, _, until)| until <= now);
            if covered == block.pages && expired {
                // Whole block held and its hold is over: discard it now, zero from now on.
                *verdict = self.discard(block)?;
            } else {
                // Still (partly) in its hold, or never held here: keep the records. A
                // whole block held in parts (buddies reported in different passes, merged
                // since) is held until its latest part's hold ends: its expired parts must
                // not be forgotten by `end_settle`, or the block would never be discarded.
                let whole = covered == block.pages;
                let latest = records.iter().map(|&(_, _, u)| u).max();
                for (s, p, until) in records {
                    let until = if whole {
                        latest.unwrap_or(until)
                    } else {
                        until
                    };
                    self.held.insert(s, (p, until));
                    self.stats.held_bytes += p * PAGE_SIZE;
                }
            }
        }
        self.log_batch("settle", blocks.len(), before);
        Ok(())
    }

    fn end_settle(&mut self, now: Instant) {
        // Every free held block whose hold was over was just offered; what is left expired
        // belongs to blocks allocated during their hold (taken back), or could not be
        // settled (gated zone, failed discard; they stay reported and not known zero):
        // forget them, so an expired hold never makes the worker spin.
        let stale: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, &(_, u))| u <= now)
            .map(|(&s, _)| s)
            .collect();
        for s in stale {
            if let Some((pages, _)) = self.held.remove(&s) {
                self.stats.held_bytes -= pages * PAGE_SIZE;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use zeronce_mem::{BackingKind, GuestRam};
    use zeronce_mm::Pfn;

    fn device(policy: DiscardPolicy) -> ProcessDevice {
        let ram =
            SharedRam::new(GuestRam::new(8 << 20, BackingKind::Anonymous { thp: false }).unwrap());
        ProcessDevice::new(ram, policy, true).unwrap()
    }

    fn range(pfn: u64, pages: u64) -> PageRange {
        PageRange::new(Pfn(pfn), pages)
    }

    #[test]
    fn a_hold_answers_not_zero_until_it_is_over_and_only_whole_held_blocks_settle() {
        let mut d = device(DiscardPolicy::Hold(Duration::from_secs(10)));
        let t0 = Instant::now();
        let mut v = [ZeroGuarantee::Zeroed; 2];
        d.report(t0, &[range(0, 512), range(512, 512)], &mut v)
            .unwrap();
        assert_eq!(v, [ZeroGuarantee::NotZeroed; 2]);
        assert_eq!(d.hold_expiry(), Some(t0 + Duration::from_secs(10)));
        assert_eq!(
            (d.stats().held_bytes, d.stats().discarded_bytes),
            (4 << 20, 0)
        );
        // Before the end of the hold: nothing discarded, records kept.
        let mut v = [ZeroGuarantee::NotZeroed];
        d.settle(t0 + Duration::from_secs(5), &[range(0, 1024)], &mut v)
            .unwrap();
        assert_eq!(v, [ZeroGuarantee::NotZeroed]);
        assert_eq!(d.stats().held_bytes, 4 << 20);
        // After: the merged block of both holds is discarded and zero; a half of a hold
        // (its other half was taken back) too; a block never held is left alone.
        let later = t0 + Duration::from_secs(10);
        let mut v = [ZeroGuarantee::NotZeroed; 2];
        d.settle(later, &[range(0, 256), range(1024, 256)], &mut v)
            .unwrap();
        assert_eq!(v, [ZeroGuarantee::Zeroed, ZeroGuarantee::NotZeroed]);
        assert_eq!(d.stats().discarded_bytes, 1 << 20);
        // The rest of the first hold was dropped with it; the second hold is still there
        // until the pass ends, then forgotten (its block was taken back).
        assert_eq!(d.stats().held_bytes, 2 << 20);
        d.end_settle(later);
        assert_eq!((d.stats().held_bytes, d.hold_expiry()), (0, None));
    }

    #[test]
    fn two_holds_merged_into_one_free_block_are_settled_when_the_later_one_ends() {
        // Two buddies reported in different passes, then merged on the free list: at the
        // first expiry the merged block is still partly in its hold; it must be discarded
        // once the second hold is over (the first, expired record must not be forgotten).
        let mut d = device(DiscardPolicy::Hold(Duration::from_secs(10)));
        let t0 = Instant::now();
        let mut v = [ZeroGuarantee::NotZeroed];
        d.report(t0, &[range(0, 512)], &mut v).unwrap();
        d.report(t0 + Duration::from_secs(5), &[range(512, 512)], &mut v)
            .unwrap();
        let first = t0 + Duration::from_secs(10);
        d.settle(first, &[range(0, 1024)], &mut v).unwrap();
        assert_eq!(
            v,
            [ZeroGuarantee::NotZeroed],
            "the second half is still held"
        );
        d.end_settle(first);
        assert_eq!(
            d.stats().held_bytes,
            4 << 20,
            "the whole block is still held"
        );
        let second = t0 + Duration::from_secs(15);
        assert_eq!(d.hold_expiry(), Some(second));
        d.settle(second, &[range(0, 1024)], &mut v).unwrap();
        assert_eq!(v, [ZeroGuarantee::Zeroed]);
        assert_eq!(d.stats().discarded_bytes, 4 << 20);
        d.end_settle(second);
        assert_eq!((d.stats().held_bytes, d.hold_expiry()), (0, None));
    }

    #[test]
    fn a_hold_too_long_for_the_clock_holds_forever_without_panicking() {
        // `Hold(Duration::MAX)`, "never discard": the end of the hold is past what an
        // `Instant` can hold. A panic here would leave the engine's batch isolated (lost).
        let mut d = device(DiscardPolicy::Hold(Duration::MAX));
        let t0 = Instant::now();
        let mut v = [ZeroGuarantee::Zeroed];
        d.report(t0, &[range(0, 512)], &mut v).unwrap();
        assert_eq!(v, [ZeroGuarantee::NotZeroed]);
        let later = t0 + Duration::from_secs(100 * 365 * 86_400);
        assert!(d.hold_expiry().is_some_and(|t| t > later));
        d.settle(later, &[range(0, 512)], &mut v).unwrap();
        d.end_settle(later);
        assert_eq!(
            (v, d.stats().held_bytes),
            ([ZeroGuarantee::NotZeroed], 2 << 20)
        );
    }

    #[test]
    fn a_new_report_replaces_overlapping_holds() {
        let mut d = device(DiscardPolicy::Hold(Duration::from_secs(10)));
        let t0 = Instant::now();
        let mut v = [ZeroGuarantee::NotZeroed];
        d.report(t0, &[range(0, 1024)], &mut v).unwrap();
        d.report(t0 + Duration::from_secs(8), &[range(512, 512)], &mut v)
            .unwrap();
        assert_eq!(d.stats().held_bytes, 2 << 20);
        assert_eq!(d.hold_expiry(), Some(t0 + Duration::from_secs(18)));
    }

    #[test]
    fn immediate_discards_and_lazy_never_claims_zero() {
        let mut d = device(DiscardPolicy::Immediate);
        let mut v = [ZeroGuarantee::NotZeroed];
        d.report(Instant::now(), &[range(0, 512)], &mut v).unwrap();
        assert_eq!(
            (v[0], d.stats().zeroed_bytes),
            (ZeroGuarantee::Zeroed, 2 << 20)
        );
        let mut d = device(DiscardPolicy::Lazy);
        d.report(Instant::now(), &[range(0, 512)], &mut v).unwrap();
        assert_eq!(
            (v[0], d.stats().discarded_bytes, d.stats().zeroed_bytes),
            (ZeroGuarantee::NotZeroed, 2 << 20, 0)
        );
    }

    #[test]
    fn a_failed_discard_fails_the_whole_call() {
        let mut d = device(DiscardPolicy::Immediate);
        let mut v = [ZeroGuarantee::NotZeroed; 2];
        // The second range is outside the RAM: the claim fails, the call fails.
        assert!(d
            .report(Instant::now(), &[range(0, 512), range(4096, 512)], &mut v)
            .is_err());
    }
}
