//! The device: lifecycle (features → activate → notifications → reset), the queue loop,
//! held requests, the statistics request cycle and the target size.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::config::ConfigSpace;
use crate::discard::{execute, hold_deadline, Discarder};
use crate::error::{BalloonError, NotReadyReason};
use crate::features::{Feature, FeatureSet, Negotiated, QueueKind, QueueLayout};
use crate::inflight::{Held, InFlight, Work};
pub use crate::interrupt::InterruptSignal;
use crate::metrics::BalloonMetrics;
use crate::metrics::{log_this, FAILED, REFUSED};
pub use crate::options::{BalloonOptions, QueueReport};
use crate::queues::inflate::{self, PartialPages};
use crate::queues::stats::{self, GuestStats};
use crate::queues::{collect_chain, reporting, Desc};
use crate::spec::PFN_PAGE_SIZE;

enum State {
    Reset,
    FeaturesOk(Negotiated),
    Active {
        neg: Negotiated,
        layout: QueueLayout,
        queues: Vec<Queue>,
    },
}

/// The virtio-balloon device (host side). `D` performs discards, `I` signals the driver.
pub struct BalloonDevice<D, I> {
    options: BalloonOptions,
    config: ConfigSpace,
    state: State,
    discarder: D,
    interrupt: I,
    metrics: Arc<BalloonMetrics>,
    partial: PartialPages,
    inflight: InFlight,
    stats: GuestStats,
    stats_head: Option<u16>,
}

impl<D, I: InterruptSignal> BalloonDevice<D, I> {
    /// A device in reset state.
    pub fn new(options: BalloonOptions, discarder: D, interrupt: I) -> Self {
        BalloonDevice {
            options,
            config: ConfigSpace::default(),
            state: State::Reset,
            discarder,
            interrupt,
            metrics: Arc::default(),
            partial: PartialPages::default(),
            inflight: InFlight::default(),
            stats: GuestStats::default(),
            stats_head: None,
        }
    }

    /// virtio device type (5).
    pub fn device_type(&self) -> u32 {
        crate::spec::VIRTIO_ID_BALLOON
    }

    /// The features offered to the driver. Without zero promises (a confidential guest)
    /// bits 6 and 7 are never offered, whatever
    /// [`FeatureOffer`](crate::features::FeatureOffer) says: the device could never honour
    /// them (docs/ARCHITECTURE.md §5).
    pub fn device_features(&self) -> FeatureSet {
        let offer = self.options.offer.features();
        if self.options.zero_promises {
            offer
        } else {
            offer
                .with(Feature::DeviceInitReported, false)
                .with(Feature::DeviceInitOnInflate, false)
        }
    }

    /// Number of queues the transport should expose before negotiation (the layout of all
    /// offered features); after negotiation use [`BalloonDevice::layout`].
    pub fn max_queues(&self) -> usize {
        QueueLayout::for_features(self.device_features()).len()
    }

    /// The negotiated features, once acked.
    pub fn negotiated(&self) -> Option<Negotiated> {
        match &self.state {
            State::Reset => None,
            State::FeaturesOk(n) | State::Active { neg: n, .. } => Some(*n),
        }
    }

    /// The queue layout of the negotiated features.
    pub fn layout(&self) -> Option<QueueLayout> {
        self.negotiated().map(Negotiated::layout)
    }

    /// The driver's feature acknowledgement, called once when the driver sets
    /// FEATURES_OK, with the full 64-bit set it wrote. Resets any previous state.
    /// Unoffered bits are refused (the transport must then not set FEATURES_OK).
    pub fn ack_features(&mut self, acked: FeatureSet) -> Result<Negotiated, BalloonError> {
        let extra = acked.bits() & !self.device_features().bits();
        if extra != 0 {
            return Err(self.refuse(BalloonError::UnofferedFeature { bits: extra }));
        }
        let neg = Negotiated::new(self.device_features(), acked);
        self.reset();
        self.state = State::FeaturesOk(neg);
        tracing::debug!(?neg, "features negotiated");
        Ok(neg)
    }

    /// DRIVER_OK: takes the queues, one per index of the negotiated layout.
    pub fn activate(&mut self, queues: Vec<Queue>) -> Result<(), BalloonError> {
        let State::FeaturesOk(neg) = self.state else {
            return Err(self.refuse(BalloonError::NotReady {
                index: 0,
                reason: NotReadyReason::FeaturesNotNegotiated,
            }));
        };
        let layout = neg.layout();
        if queues.len() != layout.len() {
            return Err(BalloonError::QueueCount {
                given: queues.len(),
                needed: layout.len(),
            });
        }
        self.state = State::Active {
            neg,
            layout,
            queues,
        };
        Ok(())
    }

    /// Device reset: drops queues, held requests (not discarded), partial host pages and
    /// the held stats buffer; the driver-written config fields go back to zero.
    pub fn reset(&mut self) {
        self.state = State::Reset;
        self.inflight.clear();
        self.partial.clear();
        self.stats_head = None;
        let target = self.config.num_pages();
        self.config = ConfigSpace::default();
        self.config.set_num_pages(target);
    }

    /// Queue `index` of an active device (e.g. for a vhost-user back-end answering
    /// `GET_VRING_BASE` with the device's own `next_avail`).
    pub fn queue(&self, index: u16) -> Option<&Queue> {
        match &self.state {
            State::Active { queues, .. } => queues.get(usize::from(index)),
            _ => None,
        }
    }

    /// Whether the device is activated (DRIVER_OK).
    pub fn is_active(&self) -> bool {
        matches!(self.state, State::Active { .. })
    }

    /// Shared metrics.
    pub fn metrics(&self) -> Arc<BalloonMetrics> {
        Arc::clone(&self.metrics)
    }

    /// The latest guest statistics.
    pub fn stats(&self) -> &GuestStats {
        &self.stats
    }

    /// The discarder (e.g. to inspect a mock).
    pub fn discarder(&self) -> &D {
        &self.discarder
    }

    /// The configuration space.
    pub fn config(&self) -> &ConfigSpace {
        &self.config
    }

    /// Partial host pages remembered from inflate requests.
    pub fn partial_host_pages(&self) -> usize {
        self.partial.len()
    }

    /// Requests held, waiting for [`BalloonDevice::tick`].
    pub fn held_requests(&self) -> usize {
        self.inflight.len()
    }

    /// Host bytes of held work, at most
    /// [`MAX_HELD_BYTES`](crate::spec::limits::MAX_HELD_BYTES).
    pub fn held_bytes(&self) -> usize {
        self.inflight.cost()
    }

    /// The earliest held deadline, for the VMM's timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inflight.next_deadline()
    }

    /// Driver config read.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) -> Result<(), BalloonError> {
        self.config.read(offset, data).map_err(|e| self.refuse(e))
    }

    /// Driver config write (`actual`, `poison_val`).
    pub fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), BalloonError> {
        self.config.write(offset, data).map_err(|e| self.refuse(e))
    }

    /// Sets the host's target balloon size (4 KiB pages) and notifies the driver.
    pub fn set_num_pages(&mut self, pages: u32) {
        self.config.set_num_pages(pages);
        self.metrics.config_changes.inc();
        self.interrupt.signal_config_change();
    }

    /// Counts a guest-caused error, logs it (rate-limited per class: the counters stay
    /// exact, the log does not grow with a flood), and hands it back.
    fn refuse(&self, e: BalloonError) -> BalloonError {
        match e.kind() {
            Some(kind) => {
                let n = self.metrics.malformed(kind);
                if log_this(n) {
                    tracing::warn!(error = %e, ?kind, count = n, "{REFUSED}");
                }
            }
            None => tracing::warn!(error = %e, "virtio-balloon: refused"),
        }
        e
    }

    /// Counts and logs (rate-limited) `n` failed discards or VMM-side request failures.
    fn failed(&self, n: u64, what: &dyn std::fmt::Display) {
        for _ in 0..n {
            let count = self.metrics.discard_errors.inc_get();
            if log_this(count) {
                tracing::warn!(error = %what, count, "{FAILED}");
            }
        }
    }

    /// Asks the guest for fresh statistics by using the held stats buffer. Returns
    /// whether a request was sent (false: no buffer held, or no stats queue).
    pub fn request_stats<M>(&mut self, mem: &M) -> Result<bool, BalloonError>
    where
        M: GuestMemoryBackend,
    {
        let State::Active { layout, queues, .. } = &mut self.state else {
            return Ok(false);
        };
        let (Some(index), Some(head)) = (layout.index(QueueKind::Stats), self.stats_head) else {
            return Ok(false);
        };
        let q = &mut queues[usize::from(index)];
        q.add_used(mem, head, 0)
            .map_err(|e| BalloonError::Queue(e.to_string()))?;
        self.stats_head = None;
        self.interrupt.signal_used_queue(index);
        Ok(true)
    }
}

impl<D, I: InterruptSignal> BalloonDevice<D, I> {
    /// Handles a notification of queue `index` now (see [`Self::process_queue_at`]).
    pub fn process_queue<M>(&mut self, mem: &M, index: u16) -> Result<QueueReport, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        self.process_queue_at(mem, index, Instant::now())
    }

    /// Handles a notification of queue `index` at time `now`: pops the available chains
    /// (at most a queue's worth: [`QueueReport::more`] says to call again), validates and
    /// serves each, uses it (or holds it), and signals the driver. Malformed chains are
    /// logged (rate-limited), counted and used with `used_len` 0; the queue keeps being
    /// served. An available entry naming no descriptor, or a descriptor the device already
    /// holds, is counted and never used (a descriptor is returned exactly once).
    pub fn process_queue_at<M>(
        &mut self,
        mem: &M,
        index: u16,
        now: Instant,
    ) -> Result<QueueReport, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let (kind, neg) = match &self.state {
            State::Reset => Err(NotReadyReason::FeaturesNotNegotiated),
            State::FeaturesOk(_) => Err(NotReadyReason::DriverNotOk),
            State::Active {
                neg,
                layout,
                queues,
            } => match layout.kind(index) {
                None => return Err(self.refuse(BalloonError::UnknownQueue { index })),
                Some(_) if !queues[usize::from(index)].is_valid(mem) => {
                    Err(NotReadyReason::QueueNotReady)
                }
                Some(k) => Ok((k, *neg)),
            },
        }
        .map_err(|reason| self.refuse(BalloonError::NotReady { index, reason }))?;

        let State::Active { queues, .. } = &self.state else {
            unreachable!("checked active above");
        };
        let q = &queues[usize::from(index)];
        let (size, desc_table) = (q.size(), GuestAddress(q.desc_table()));
        // One call serves at most a queue's worth of chains (a guest advancing avail.idx
        // as fast as the device pops cannot keep it here), and every good chain is
        // completed whatever its neighbours hold.
        let mut report = QueueReport::default();
        let mut taken = vec![false; usize::from(size)];
        while report.chains < usize::from(size) {
            let Some(head) = self.pop_head(mem, index) else {
                break;
            };
            report.chains += 1;
            let outcome = self
                .take_head(kind, index, head, &mut taken)
                .and_then(|()| collect_chain(mem, desc_table, size, head, kind))
                .and_then(|d| self.serve(mem, kind, neg, index, head, &d, now));
            match outcome {
                Ok(Some(len)) => report.used.push((head, len)),
                Ok(None) => report.held += 1,
                Err(e) => {
                    // An invalid head has no descriptor to return, and one in flight is
                    // returned once, by whoever holds it.
                    let returnable = !matches!(
                        e,
                        BalloonError::InvalidHead { .. } | BalloonError::DescriptorInFlight { .. }
                    );
                    if e.kind().is_some() {
                        report.malformed += 1;
                        self.refuse(e);
                    } else {
                        self.failed(1, &e);
                    }
                    if !returnable {
                    } else if kind == QueueKind::Stats {
                        self.hold_stats(mem, index, head)?;
                        report.held += 1;
                    } else {
                        report.used.push((head, 0));
                    }
                }
            }
        }
        report.more = report.chains == usize::from(size) && self.has_available(mem, index);
        self.inflight.end_batch();
        self.push_used(mem, index, &report.used)?;
        Ok(report)
    }

    /// Pops the next available head of queue `index`.
    fn pop_head<M: GuestMemoryBackend>(&mut self, mem: &M, index: u16) -> Option<u16> {
        let State::Active { queues, .. } = &mut self.state else {
            return None;
        };
        queues[usize::from(index)]
            .pop_descriptor_chain(mem)
            .map(|c| c.head_index())
    }

    /// Whether queue `index` has chains available beyond those popped.
    fn has_available<M: GuestMemoryBackend>(&self, mem: &M, index: u16) -> bool {
        let State::Active { queues, .. } = &self.state else {
            return false;
        };
        let q = &queues[usize::from(index)];
        q.avail_idx(mem, Ordering::Acquire)
            .is_ok_and(|i| i.0 != q.next_avail())
    }

    /// Takes `head` for this batch, refusing one the device already has: taken earlier in
    /// the batch, held, or the held statistics buffer.
    fn take_head(
        &self,
        kind: QueueKind,
        index: u16,
        head: u16,
        taken: &mut [bool],
    ) -> Result<(), BalloonError> {
        let Some(slot) = taken.get_mut(usize::from(head)) else {
            return Ok(()); // an invalid head: the chain walk refuses it
        };
        let stats_token = kind == QueueKind::Stats && self.stats_head == Some(head);
        if *slot || stats_token || self.inflight.is_held(index, head) {
            return Err(BalloonError::DescriptorInFlight { queue: kind, head });
        }
        *slot = true;
        Ok(())
    }

    /// Serves one chain: `Some(used_len)` to use it now, `None` when held.
    #[allow(clippy::too_many_arguments)]
    fn serve<M>(
        &mut self,
        mem: &M,
        kind: QueueKind,
        neg: Negotiated,
        index: u16,
        head: u16,
        descs: &[Desc],
        now: Instant,
    ) -> Result<Option<u32>, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let work = match kind {
            QueueKind::Inflate => {
                let req = inflate::parse(mem, kind, descs, neg.inflate_bitmap())?;
                let work = Work::Inflate {
                    pfns: req.pfns,
                    bitmap: req.bitmap.map(|b| b.0),
                };
                self.inflight.check(kind, &self.ring_ranges(), &work)?;
                work
            }
            QueueKind::Deflate => {
                let req = inflate::parse(mem, kind, descs, false)?;
                self.deflate(mem, &req.pfns);
                return Ok(Some(0));
            }
            QueueKind::Reporting => {
                let r = reporting::plan(mem, &mut self.discarder, descs)?;
                let work = Work::Report {
                    blocks: r.blocks,
                    total_len: r.total_len,
                };
                self.inflight.check(kind, &self.ring_ranges(), &work)?;
                work
            }
            QueueKind::Stats => {
                // A malformed buffer is held by the caller's error path.
                let entries = stats::parse(mem, descs)?;
                self.hold_stats(mem, index, head)?;
                self.stats.apply(&entries);
                self.metrics.stats_updates.inc();
                return Ok(None);
            }
        };
        match &work {
            Work::Inflate { pfns, .. } => self.metrics.pages_inflated.add(pfns.len() as u64),
            Work::Report { blocks, .. } => self
                .metrics
                .pages_reported
                .add(blocks.iter().map(|b| b.len / PFN_PAGE_SIZE).sum()),
        }
        self.inflight.admit(&work);
        let deadline =
            hold_deadline(self.options.policy, now).filter(|_| self.inflight.can_hold(&work));
        if let Some(deadline) = deadline {
            let held = Held {
                queue_index: index,
                head,
                work,
            };
            self.inflight.hold(deadline, held);
            return Ok(None);
        }
        self.inflight.completed();
        Ok(Some(self.complete(mem, neg, &work)))
    }

    /// The guest ranges `[start, end)` of every active queue's descriptor table,
    /// available ring and used ring (split layout), which the device must never discard.
    fn ring_ranges(&self) -> Vec<(u64, u64)> {
        let State::Active { queues, .. } = &self.state else {
            return Vec::new();
        };
        queues
            .iter()
            .flat_map(|q| {
                let n = u64::from(q.size());
                [
                    (q.desc_table(), 16 * n),
                    (q.avail_ring(), 6 + 2 * n),
                    (q.used_ring(), 6 + 8 * n),
                ]
            })
            .map(|(a, l)| (a, a.saturating_add(l)))
            .collect()
    }

    /// Holds stats buffer `head`, returning a previously held one (driver violation).
    fn hold_stats<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        index: u16,
        head: u16,
    ) -> Result<(), BalloonError> {
        if let Some(old) = self.stats_head.replace(head) {
            self.refuse(BalloonError::StatsOverflow);
            self.push_used(mem, index, &[(old, 0)])?;
        }
        Ok(())
    }

    fn deflate<M>(&mut self, mem: &M, pfns: &[inflate::Pfn4k])
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

    /// Performs `work`'s discards and returns the `used_len` that tells the truth.
    fn complete<M>(&mut self, mem: &M, neg: Negotiated, work: &Work) -> u32
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let poison = self.config.poison_val();
        let policy = self.options.policy;
        let allowed = self.options.zero_promises;
        match work {
            Work::Inflate { pfns, bitmap } => {
                // Without MUST_TELL_HOST the guest may reuse deflated pages before the
                // device has seen the deflate, so sub-pages inflated by earlier requests
                // may be in use again: a host page must be complete within this request.
                let mut own = PartialPages::default();
                let partial = if neg.has(Feature::MustTellHost) {
                    &mut self.partial
                } else {
                    &mut own
                };
                let (plan, errs) = inflate::plan(mem, &mut self.discarder, partial, pfns);
                self.failed(errs, &"backing of an inflated page unknown");
                let promise = allowed && neg.init_on_inflate(poison);
                let r = execute(&plan, policy, promise, mem, &mut self.discarder);
                self.metrics.bytes_discarded.add(r.bytes);
                self.failed(r.errors, &"inflate discard failed");
                let Some(addr) = bitmap else { return 0 };
                let bytes = inflate::bitmap_bytes(pfns.len(), &r.zero_bits);
                if let Err(e) = mem.write_slice(&bytes, *addr) {
                    tracing::warn!(error = %e, "inflate bitmap write failed");
                    return 0;
                }
                let set: u32 = bytes.iter().map(|b| b.count_ones()).sum();
                self.metrics.zero_promises.add(u64::from(set));
                bytes.len() as u32
            }
            Work::Report { blocks, total_len } => {
                if neg.poison_forbids_zero(poison) {
                    // Discarding would replace the guest's poison with zeros.
                    self.metrics.reports_skipped_poison.inc();
                    return 0;
                }
                let promise = allowed && neg.init_reported(poison);
                let r = execute(blocks, policy, promise, mem, &mut self.discarder);
                self.metrics.bytes_discarded.add(r.bytes);
                self.failed(r.errors, &"report discard failed");
                if promise && r.all_zero {
                    self.metrics.zero_promises.inc();
                    *total_len
                } else {
                    0
                }
            }
        }
    }

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

    fn push_used<M: GuestMemoryBackend>(
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
                result = result.and(Err(BalloonError::Queue(e.to_string())));
            }
        }
        if q.needs_notification(mem).unwrap_or(true) {
            self.interrupt.signal_used_queue(index);
        }
        result
    }
}
