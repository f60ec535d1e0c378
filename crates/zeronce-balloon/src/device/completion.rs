//! Completing work: the discards of an inflate or report request, the `used_len` that
//! tells the guest which pages now read zero, held requests coming due, and returning
//! descriptors on the used ring.

use std::time::Instant;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::{BalloonDevice, State};
use crate::discard::{execute, Discarder, PlanResult, PlannedDiscard};
use crate::error::{BalloonError, QueueError};
use crate::features::{Feature, Negotiated};
use crate::inflight::Work;
use crate::interrupt::InterruptSignal;
use crate::queues::inflate::{self, PartialPages, Pfn4k};

impl<D, I: InterruptSignal> BalloonDevice<D, I> {
    /// Completes held requests whose deadline is at or before `now`: discards, uses the
    /// descriptors with their verdicts, signals. Returns how many were completed.
    pub fn tick<M>(&mut self, mem: &M, now: Instant) -> Result<usize, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let Some(neg) = self.negotiated().filter(|_| self.is_active()) else {
            return Ok(0);
        };
        let due = self.inflight.take_due(now);
        let mut used: Vec<(u16, u16, u32)> = Vec::with_capacity(due.len());
        for h in &due {
            let len = self.complete(mem, neg, &h.work);
            used.push((h.queue_index, h.head, len));
        }
        self.inflight.end_batch();
        // Grouped per queue: one signal per queue.
        used.sort_by_key(|u| u.0);
        let mut result = Ok(());
        for chunk in used.chunk_by(|a, b| a.0 == b.0) {
            let pairs: Vec<(u16, u32)> = chunk.iter().map(|u| (u.1, u.2)).collect();
            result = result.and(self.push_used(mem, chunk[0].0, &pairs));
        }
        result.map(|()| due.len())
    }

    /// Performs `work`'s discards and returns the `used_len` that tells the truth.
    pub(super) fn complete<M>(&mut self, mem: &M, neg: Negotiated, work: &Work) -> u32
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        match work {
            Work::Inflate { pfns, bitmap } => self.complete_inflate(mem, neg, pfns, *bitmap),
            Work::Report { blocks, total_len } => {
                self.complete_report(mem, neg, blocks, *total_len)
            }
        }
    }

    /// Discards the host pages an inflate request completes and, when the driver gave a
    /// bitmap, writes which pages now read zero; `used_len` is the bitmap's length.
    fn complete_inflate<M>(
        &mut self,
        mem: &M,
        neg: Negotiated,
        pfns: &[Pfn4k],
        bitmap: Option<GuestAddress>,
    ) -> u32
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        // Without MUST_TELL_HOST the guest may reuse deflated pages before the device has
        // seen the deflate, so sub-pages inflated by earlier requests may be in use again:
        // a host page must be complete within this request.
        let mut own = PartialPages::default();
        let partial = if neg.has(Feature::MustTellHost) {
            &mut self.partial
        } else {
            &mut own
        };
        let (plan, errs) = inflate::plan(mem, &mut self.discarder, partial, pfns);
        self.failed(errs, &"backing of an inflated page unknown");
        let poison = self.config.poison_val();
        let promise = self.options.zero_promises && neg.init_on_inflate(poison);
        let r = self.discard(mem, &plan, promise, "inflate discard failed");
        let Some(addr) = bitmap else { return 0 };
        let bytes = inflate::bitmap_bytes(pfns.len(), &r.zero_bits);
        if let Err(e) = mem.write_slice(&bytes, addr) {
            tracing::warn!(error = %e, "inflate bitmap write failed");
            return 0;
        }
        let set: u32 = bytes.iter().map(|b| b.count_ones()).sum();
        self.metrics.zero_promises.add(u64::from(set));
        bytes.len() as u32
    }

    /// Discards a report's blocks; `used_len` is the report's length only when every
    /// block now reads zero and the device may promise it, else 0.
    fn complete_report<M>(
        &mut self,
        mem: &M,
        neg: Negotiated,
        blocks: &[PlannedDiscard],
        total_len: u32,
    ) -> u32
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let poison = self.config.poison_val();
        if neg.poison_forbids_zero(poison) {
            // Discarding would replace the guest's poison with zeros.
            self.metrics.reports_skipped_poison.inc();
            return 0;
        }
        let promise = self.options.zero_promises && neg.init_reported(poison);
        let r = self.discard(mem, blocks, promise, "report discard failed");
        if promise && r.all_zero {
            self.metrics.zero_promises.inc();
            total_len
        } else {
            0
        }
    }

    /// Runs `plan` with the device's discard policy, counting the bytes discarded and the
    /// failures (logged as `failure`).
    pub(super) fn discard<M>(
        &mut self,
        mem: &M,
        plan: &[PlannedDiscard],
        promise: bool,
        failure: &'static str,
    ) -> PlanResult
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let r = execute(plan, self.options.policy, promise, mem, &mut self.discarder);
        self.metrics.bytes_discarded.add(r.bytes);
        self.failed(r.errors, &failure);
        r
    }

    /// Forgets deflated pages' partial host pages and, if asked, prefaults them back.
    pub(super) fn deflate<M>(&mut self, mem: &M, pfns: &[Pfn4k])
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        self.metrics.pages_deflated.add(pfns.len() as u64);
        for p in pfns {
            self.partial.remove(p.gpa().0);
        }
        if self.options.prefault_on_deflate {
            // One call per run of contiguous pages inside one region, duplicates merged.
            for (gpa, len) in inflate::page_runs(mem, pfns) {
                if let Err(e) = self.discarder.prefault(mem, gpa, len) {
                    tracing::debug!(gpa = gpa.0, error = %e, "prefault failed");
                }
            }
        }
    }

    /// Returns `used` (head, length) pairs on queue `index` and signals the driver if the
    /// queue asks for it.
    pub(super) fn push_used<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        index: u16,
        used: &[(u16, u32)],
    ) -> Result<(), BalloonError> {
        let State::Active { queues, .. } = &mut self.state else {
            return Ok(());
        };
        if used.is_empty() {
            return Ok(());
        }
        let q = &mut queues[usize::from(index)];
        // Every element is tried and the driver signalled whatever one of them hit.
        let mut result = Ok(());
        for (head, len) in used {
            if let Err(e) = q.add_used(mem, *head, *len) {
                result = result.and(Err(QueueError::from(e).into()));
            }
        }
        if q.needs_notification(mem).unwrap_or(true) {
            self.interrupt.signal_used_queue(index);
        }
        result
    }
}
