//! The device: lifecycle (features → activate → notifications → reset), configuration
//! space, the statistics request cycle and the target size. Serving a queue notification
//! is in `queue`, completing the work (discards, zero promises, used ring) in
//! `completion`.

use std::sync::Arc;
use std::time::Instant;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryBackend;

use crate::config::ConfigSpace;
use crate::error::{BalloonError, NotReadyReason, QueueError};
use crate::features::{Feature, FeatureSet, Negotiated, QueueKind, QueueLayout};
use crate::inflight::InFlight;
pub use crate::interrupt::InterruptSignal;
use crate::metrics::BalloonMetrics;
use crate::metrics::{log_this, FAILED, REFUSED};
pub use crate::options::{BalloonOptions, QueueReport};
use crate::queues::inflate::PartialPages;
use crate::queues::stats::GuestStats;

mod completion;
mod hint;
mod queue;

pub use hint::{HintState, HintStatus};

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
    hint: hint::HintRun,
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
            hint: hint::HintRun::default(),
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
    /// FEATURES_OK, with the full 64-bit set it wrote. Drops any previous queues and held
    /// work ([`BalloonDevice::stop`]) but keeps the configuration space: a vhost-user
    /// front-end may send the features after the driver wrote `poison_val` (QEMU and
    /// crosvm send `SET_FEATURES` when the device starts, at DRIVER_OK), and a poison
    /// lost there would let the device discard reports it must keep.
    /// Unoffered bits are refused (the transport must then not set FEATURES_OK).
    pub fn ack_features(&mut self, acked: FeatureSet) -> Result<Negotiated, BalloonError> {
        let extra = acked.bits() & !self.device_features().bits();
        if extra != 0 {
            return Err(self.refuse(BalloonError::UnofferedFeature { bits: extra }));
        }
        let neg = Negotiated::new(self.device_features(), acked);
        self.stop();
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

    /// Stops serving without a device reset (a vhost-user `GET_VRING_BASE`): drops the
    /// queues, held requests (not discarded), partial host pages and the held stats
    /// buffer, and keeps the negotiated features and the whole configuration space
    /// (`actual`, `poison_val`), so that the front-end can start the rings again with
    /// their saved indices and the guest need not write its poison again.
    pub fn stop(&mut self) {
        self.state = match self.state {
            State::FeaturesOk(neg) | State::Active { neg, .. } => State::FeaturesOk(neg),
            State::Reset => State::Reset,
        };
        self.inflight.clear();
        self.partial.clear();
        self.stats_head = None;
    }

    /// Device reset: [`BalloonDevice::stop`], the negotiated features forgotten, and the
    /// driver-written config fields back to zero.
    pub fn reset(&mut self) {
        self.stop();
        self.state = State::Reset;
        self.hint.reset();
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

    /// The discarder, to change (e.g. [`crate::MmapDiscarder::learn`] at a new memory
    /// table).
    pub fn discarder_mut(&mut self) -> &mut D {
        &mut self.discarder
    }

    /// The interrupt line (e.g. to wake a driver waiting on a device thread that failed).
    pub fn interrupt(&self) -> &I {
        &self.interrupt
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

    /// Driver config write (`actual`, `poison_val`; `free_page_hint_cmd_id` is the
    /// device's).
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
        q.add_used(mem, head, 0).map_err(QueueError::from)?;
        self.stats_head = None;
        self.interrupt.signal_used_queue(index);
        Ok(true)
    }
}
