//! The device: lifecycle (features → activate → notifications → reset), the queue loop,
//! held requests, the statistics request cycle and the target size.

use std::sync::Arc;
use std::time::Instant;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::config::ConfigSpace;
use crate::discard::{execute, hold_deadline, DiscardPolicy, Discarder, PlannedDiscard};
use crate::error::{BalloonError, NotReadyReason};
use crate::features::{Feature, FeatureOffer, FeatureSet, Negotiated, QueueKind, QueueLayout};
pub use crate::interrupt::InterruptSignal;
use crate::metrics::BalloonMetrics;
use crate::queues::inflate::{self, PartialPages};
use crate::queues::stats::{self, GuestStats};
use crate::queues::{collect_chain, reporting, Desc};
use crate::spec::limits::MAX_HELD_PFNS;
use crate::spec::PFN_PAGE_SIZE;

/// Device options chosen by the VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BalloonOptions {
    /// Features offered (each switchable).
    pub offer: FeatureOffer,
    /// When and how to discard.
    pub policy: DiscardPolicy,
    /// Pre-fault deflated pages (`MADV_POPULATE_WRITE`).
    pub prefault_on_deflate: bool,
    /// Allow zero promises at all; turn off for confidential guests, whose memory the
    /// host cannot vouch for (bits 6 and 7 are then not offered).
    pub zero_promises: bool,
}

impl Default for BalloonOptions {
    fn default() -> Self {
        BalloonOptions {
            offer: FeatureOffer::default(),
            policy: DiscardPolicy::Immediate,
            prefault_on_deflate: false,
            zero_promises: true,
        }
    }
}

/// What one call to [`BalloonDevice::process_queue`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueReport {
    /// Chains popped.
    pub chains: usize,
    /// Chains refused as malformed (returned with `used_len` 0, or held on statsq).
    pub malformed: usize,
    /// Chains held (held policy, or the stats buffer).
    pub held: usize,
    /// `(head, used_len)` of each chain used, in order.
    pub used: Vec<(u16, u32)>,
}

#[derive(Clone, Debug)]
enum Work {
    /// Planned at completion (4 bytes per PFN while held, not a plan's ~90; and the
    /// partial host pages advance when the discard really happens).
    Inflate {
        pfns: Vec<inflate::Pfn4k>,
        bitmap: Option<GuestAddress>,
    },
    Report {
        blocks: Vec<PlannedDiscard>,
        total_len: u32,
    },
}

#[derive(Clone, Debug)]
struct Held {
    queue_index: u16,
    head: u16,
    deadline: Instant,
    work: Work,
}

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
    held: Vec<Held>,
    /// PFNs of the held inflate requests (bounded by [`MAX_HELD_PFNS`]).
    held_pfns: usize,
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
            held: Vec::new(),
            held_pfns: 0,
            stats: GuestStats::default(),
            stats_head: None,
        }
    }

    /// virtio device type (5).
    pub fn device_type(&self) -> u32 {
        crate::spec::VIRTIO_ID_BALLOON
    }

    /// The features offered to the driver. Without zero promises (a confidential guest)
    /// bits 6 and 7 are never offered, whatever [`FeatureOffer`] says: the device could
    /// never honour them (docs/ARCHITECTURE.md §5).
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
        self.held.clear();
        self.held_pfns = 0;
        self.partial.clear();
        self.stats_head = None;
        let target = self.config.num_pages();
        self.config = ConfigSpace::default();
        self.config.set_num_pages(target);
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
        self.held.len()
    }

    /// The earliest held deadline, for the VMM's timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.held.iter().map(|h| h.deadline).min()
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

    /// Logs and counts a guest-caused error, and hands it back.
    fn refuse(&self, e: BalloonError) -> BalloonError {
        if let Some(kind) = e.kind() {
            self.metrics.malformed(kind);
        }
        tracing::warn!(error = %e, "virtio-balloon: refused guest input");
        e
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

    /// Handles a notification of queue `index` at time `now`: pops every available chain,
    /// validates and serves it, uses it (or holds it), and signals the driver. Malformed
    /// chains are logged, counted and used with `used_len` 0; the queue keeps being served.
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

        // Phase 1: pop every chain (bounded by the queue size).
        let mut chains: Vec<(u16, Result<Vec<Desc>, BalloonError>)> = Vec::new();
        if let State::Active { queues, .. } = &mut self.state {
            let q = &mut queues[usize::from(index)];
            while let Some(chain) = q.pop_descriptor_chain(mem) {
                chains.push((chain.head_index(), collect_chain(chain, kind)));
            }
        }
        // Phase 2: serve each chain.
        let mut report = QueueReport {
            chains: chains.len(),
            ..QueueReport::default()
        };
        for (head, descs) in chains {
            let outcome = descs.and_then(|d| self.serve(mem, kind, neg, index, head, &d, now));
            match outcome {
                Ok(Some(len)) => report.used.push((head, len)),
                Ok(None) => report.held += 1,
                Err(e) => {
                    let is_guest = e.kind().is_some();
                    if is_guest {
                        report.malformed += 1;
                        self.refuse(e);
                    } else {
                        self.metrics.discard_errors.inc();
                        tracing::warn!(error = %e, "virtio-balloon: request failed");
                    }
                    if kind == QueueKind::Stats {
                        self.hold_stats(mem, index, head)?;
                        report.held += 1;
                    } else {
                        report.used.push((head, 0));
                    }
                }
            }
        }
        // Phase 3: use the buffers and notify.
        self.push_used(mem, index, &report.used)?;
        Ok(report)
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
        if self
            .held
            .iter()
            .any(|h| h.queue_index == index && h.head == head)
        {
            return Err(BalloonError::DescriptorInFlight { queue: kind, head });
        }
        let work = match kind {
            QueueKind::Inflate => {
                let req = inflate::parse(mem, kind, descs, neg.inflate_bitmap())?;
                let mut avoid = self.ring_ranges();
                if let Some((addr, _)) = req.bitmap {
                    avoid.push((addr.0, addr.0 + u64::from(req.bitmap_len())));
                }
                for p in &req.pfns {
                    check_no_overlap(&avoid, kind, p.gpa().0, PFN_PAGE_SIZE)?;
                }
                self.metrics.pages_inflated.add(req.pfns.len() as u64);
                Work::Inflate {
                    pfns: req.pfns,
                    bitmap: req.bitmap.map(|b| b.0),
                }
            }
            QueueKind::Deflate => {
                let req = inflate::parse(mem, kind, descs, false)?;
                self.deflate(mem, &req.pfns);
                return Ok(Some(0));
            }
            QueueKind::Reporting => {
                let r = reporting::plan(mem, &mut self.discarder, descs)?;
                let rings = self.ring_ranges();
                for b in &r.blocks {
                    check_no_overlap(&rings, kind, b.gpa.0, b.len)?;
                }
                self.metrics
                    .pages_reported
                    .add(r.blocks.iter().map(|b| b.len / PFN_PAGE_SIZE).sum());
                Work::Report {
                    blocks: r.blocks,
                    total_len: r.total_len,
                }
            }
            QueueKind::Stats => {
                // A malformed buffer is held by the caller's error path.
                let entries = stats::parse(mem, descs)?;
                self.hold_stats(mem, index, head)?;
                self.stats.apply(&entries);
                self.metrics.stats_updates.inc();
                return Ok(None);
            }
            QueueKind::FreePageHint => return Ok(Some(0)),
        };
        let pfns = match &work {
            Work::Inflate { pfns, .. } => pfns.len(),
            Work::Report { .. } => 0,
        };
        let deadline = hold_deadline(self.options.policy, now)
            .filter(|_| self.held_pfns + pfns <= MAX_HELD_PFNS);
        if let Some(deadline) = deadline {
            self.held_pfns += pfns;
            self.held.push(Held {
                queue_index: index,
                head,
                deadline,
                work,
            });
            return Ok(None);
        }
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
            for p in pfns {
                if let Err(e) = self.discarder.prefault(mem, p.gpa(), PFN_PAGE_SIZE) {
                    tracing::debug!(gpa = p.gpa().0, error = %e, "prefault failed");
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
                self.metrics.discard_errors.add(errs);
                let promise = allowed && neg.init_on_inflate(poison);
                let r = execute(&plan, policy, promise, mem, &mut self.discarder);
                self.metrics.bytes_discarded.add(r.bytes);
                self.metrics.discard_errors.add(r.errors);
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
                self.metrics.discard_errors.add(r.errors);
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
        let (due, keep): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.deadline <= now);
        self.held = keep;
        for h in &due {
            if let Work::Inflate { pfns, .. } = &h.work {
                self.held_pfns -= pfns.len();
            }
            let len = self.complete(mem, neg, &h.work);
            self.push_used(mem, h.queue_index, &[(h.head, len)])?;
        }
        Ok(due.len())
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
        for (head, len) in used {
            q.add_used(mem, *head, *len)
                .map_err(|e| BalloonError::Queue(e.to_string()))?;
        }
        if q.needs_notification(mem).unwrap_or(true) {
            self.interrupt.signal_used_queue(index);
        }
        Ok(())
    }
}

/// Refuses discarding `[gpa, gpa + len)` when it overlaps one of `avoid` (`[start, end)`).
fn check_no_overlap(
    avoid: &[(u64, u64)],
    queue: QueueKind,
    gpa: u64,
    len: u64,
) -> Result<(), BalloonError> {
    let end = gpa.saturating_add(len);
    if avoid.iter().any(|&(s, e)| gpa < e && s < end) {
        return Err(BalloonError::DiscardOverlap { queue, gpa, len });
    }
    Ok(())
}
