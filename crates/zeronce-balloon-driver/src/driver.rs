//! The driver: [`BalloonDriver`] negotiates, lays out its split virtqueues in guest RAM
//! and implements [`ReportingDevice`] over the reporting queue, through a [`Transport`].
//!
//! One report call puts one device-writable descriptor per block (no indirect
//! descriptors) on the reporting queue, kicks the device and waits for the used ring
//! (woken by [`UsedSignal`], bounded by [`DriverOptions::timeout`]). Per block: with
//! `DEVICE_INIT_REPORTED` negotiated, `used_len` equal to the buffer length means
//! [`ZeroGuarantee::Zeroed`], anything else [`ZeroGuarantee::NotZeroed`]; without it `used_len` is
//! ignored. A timeout, a used id that is not in flight or a `used_len` beyond its buffer
//! fails the call (the engine puts every block back unreported), resets the device so it
//! can no longer touch those blocks, and leaves the driver [`DriverError::Broken`].
//!
//! Ring area: queue `i` of the negotiated layout at `base + i × slot` (slot = the rings'
//! footprint rounded up to 4 KiB), then the statistics buffer; see
//! [`BalloonDriver::ring_area_bytes`]. The caller keeps that area away from its allocator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};
use zeronce_mm::reporting::{ReportError, ReportingDevice, ZeroGuarantee};
use zeronce_mm::{PageRange, PAGE_SIZE};

use zeronce_balloon::guest_ring::{DriverBuf, DriverQueue, QueueAddrs};
use zeronce_balloon::spec::config_layout::POISON_VAL;
use zeronce_balloon::spec::{StatTag, STAT_ENTRY_SIZE, STAT_TAG_COUNT};
use zeronce_balloon::{Feature, FeatureSet, QueueKind, QueueLayout};

use crate::negotiate::{choose_features, DriverOptions, MissingFeature};
use crate::transport::{Transport, TransportError, UsedSignal};

/// Most queues this driver negotiates: inflateq, deflateq, statsq, reporting_vq.
const MAX_QUEUES: u64 = 4;
/// Bytes reserved for the statistics buffer (one entry per known tag).
const STATS_AREA: u64 = 4096;
/// Ring slots are 4 KiB aligned.
const SLOT_ALIGN: u64 = 4096;

/// Why the driver could not start or a report failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The transport refused an access or the device is gone.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The device lacks a required feature.
    #[error(transparent)]
    MissingFeature(#[from] MissingFeature),
    /// The rings could not be read or written.
    #[error("ring memory: {0}")]
    Memory(#[from] GuestMemoryError),
    /// The queue size is not a power of two in 1..=32768.
    #[error("queue size {0} is not a power of two in 1..=32768")]
    QueueSize(u16),
    /// The ring area is smaller than [`BalloonDriver::ring_area_bytes`].
    #[error("ring area of {given} bytes is smaller than the {needed} bytes needed")]
    RingAreaTooSmall {
        /// Bytes needed.
        needed: u64,
        /// Bytes given.
        given: u64,
    },
    /// More blocks than the queue holds, or a block too large for one descriptor.
    #[error("report of {blocks} blocks (largest {largest} bytes) does not fit the queue")]
    BatchTooLarge {
        /// Blocks in the call.
        blocks: usize,
        /// Bytes of the largest block.
        largest: u64,
    },
    /// The device did not use every buffer in time.
    #[error("the device used {used} of {sent} buffers within {timeout:?}")]
    Timeout {
        /// Buffers sent.
        sent: usize,
        /// Buffers used before the deadline.
        used: usize,
        /// The timeout.
        timeout: Duration,
    },
    /// The device used a descriptor that was not in flight.
    #[error("the device used descriptor {id}, which is not in flight")]
    UnknownUsedId {
        /// The used element's id.
        id: u32,
    },
    /// The device wrote a `used_len` longer than the buffer.
    #[error("the device used descriptor {id} with length {len} > buffer length {buf_len}")]
    UsedLenTooLong {
        /// The used element's id.
        id: u32,
        /// Its `used_len`.
        len: u32,
        /// The buffer's length.
        buf_len: u32,
    },
    /// An earlier failure reset the device; the driver no longer reports.
    #[error("the driver stopped after an earlier failure (device reset)")]
    Broken,
}

/// Counters of a [`BalloonDriver`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Report calls that succeeded.
    pub reports: u64,
    /// Blocks the device answered with its full length under bit 6.
    pub zeroed: u64,
    /// Blocks answered otherwise (or any block without bit 6).
    pub not_zeroed: u64,
    /// Report calls that failed (timeout, malformed answer, transport error).
    pub failures: u64,
}

/// The statistics queue and whether the device holds its one buffer.
struct StatsQueue {
    index: u16,
    queue: DriverQueue,
    outstanding: bool,
}

/// The guest's virtio-balloon driver; see the module docs. `M` is the guest's view of
/// the ring area, `T` the transport.
pub struct BalloonDriver<M, T> {
    mem: M,
    transport: T,
    irq: Arc<UsedSignal>,
    opts: DriverOptions,
    negotiated: FeatureSet,
    layout: QueueLayout,
    reporting_index: u16,
    reporting: DriverQueue,
    stats_queue: Option<StatsQueue>,
    stats_buffer: GuestAddress,
    /// Why an earlier failure stopped the driver (`None`: it runs).
    broken: Option<String>,
    stats: DriverStats,
}

impl<M: GuestMemory, T: Transport> BalloonDriver<M, T> {
    /// Bytes of guest RAM the rings (and the statistics buffer) take for `queue_size`.
    pub fn ring_area_bytes(queue_size: u16) -> u64 {
        Self::slot(queue_size) * MAX_QUEUES + STATS_AREA
    }

    fn slot(queue_size: u16) -> u64 {
        DriverQueue::footprint(queue_size).div_ceil(SLOT_ALIGN) * SLOT_ALIGN
    }

    /// Initialises the device as Linux's `virtballoon_probe` does: reset, negotiate,
    /// tell the poison value, lay out and enable the negotiated queues in
    /// `[ring_base, ring_base + ring_len)` of `mem`, DRIVER_OK.
    pub fn probe(
        mem: M,
        ring_base: GuestAddress,
        ring_len: u64,
        mut transport: T,
        irq: Arc<UsedSignal>,
        opts: DriverOptions,
    ) -> Result<Self, DriverError> {
        let size = opts.queue_size;
        if size == 0 || !size.is_power_of_two() || size > 32768 {
            return Err(DriverError::QueueSize(size));
        }
        let needed = Self::ring_area_bytes(size);
        if ring_len < needed {
            return Err(DriverError::RingAreaTooSmall {
                needed,
                given: ring_len,
            });
        }
        transport.reset()?;
        let acked = choose_features(transport.device_features()?, &opts)?;
        transport.set_driver_features(acked)?;
        if let Some(poison) = opts
            .page_poison
            .filter(|_| acked.contains(Feature::PagePoison))
        {
            transport.write_config(POISON_VAL, &poison.to_le_bytes())?;
        }
        let layout = QueueLayout::for_features(acked);
        let queues = (0..layout.len() as u64)
            .map(|i| DriverQueue::new(&mem, GuestAddress(ring_base.0 + i * Self::slot(size)), size))
            .collect::<Result<Vec<_>, _>>()?;
        let addrs: Vec<QueueAddrs> = queues.iter().map(DriverQueue::addrs).collect();
        transport.activate(&addrs)?;
        let index_of = |kind| layout.index(kind);
        let reporting_index =
            index_of(QueueKind::Reporting).ok_or(MissingFeature(Feature::PageReporting))?;
        let stats_queue = index_of(QueueKind::Stats).map(|index| StatsQueue {
            index,
            queue: queues[usize::from(index)].clone(),
            outstanding: false,
        });
        tracing::debug!(?acked, reporting_index, "virtio-balloon driver ready");
        Ok(BalloonDriver {
            reporting: queues[usize::from(reporting_index)].clone(),
            mem,
            transport,
            irq,
            opts,
            negotiated: acked,
            layout,
            reporting_index,
            stats_queue,
            stats_buffer: GuestAddress(ring_base.0 + MAX_QUEUES * Self::slot(size)),
            broken: None,
            stats: DriverStats::default(),
        })
    }

    /// The negotiated features.
    pub fn negotiated(&self) -> FeatureSet {
        self.negotiated
    }

    /// The queue layout of the negotiated features.
    pub fn layout(&self) -> &QueueLayout {
        &self.layout
    }

    /// Index of the reporting queue (counting only negotiated queues).
    pub fn reporting_queue_index(&self) -> u16 {
        self.reporting_index
    }

    /// Whether the device's `used_len` carries a zero promise (bit 6 negotiated).
    pub fn zero_hints(&self) -> bool {
        self.negotiated.contains(Feature::DeviceInitReported)
    }

    /// Whether an earlier failure stopped the driver.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// The failure that stopped the driver, if one did.
    pub fn broken_reason(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Counters.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Offers the device a statistics buffer holding `entries` (Linux primes the queue
    /// with one at probe, and re-posts it whenever the device uses it as a request).
    /// Returns `false` when there is no statistics queue or the device still holds the
    /// previous buffer.
    pub fn post_stats(&mut self, entries: &[(StatTag, u64)]) -> Result<bool, DriverError> {
        let Some(sq) = self.stats_queue.as_mut() else {
            return Ok(false);
        };
        // The one buffer is the device's until it uses it (as a request for new stats).
        if sq.outstanding && sq.queue.take_used(&self.mem)?.is_empty() {
            return Ok(false);
        }
        sq.outstanding = false;
        let bytes: Vec<u8> = entries
            .iter()
            .take(STAT_TAG_COUNT)
            .flat_map(|(tag, v)| tag.raw().to_le_bytes().into_iter().chain(v.to_le_bytes()))
            .collect();
        debug_assert!(bytes.len() <= STATS_AREA as usize);
        self.mem.write_slice(&bytes, self.stats_buffer)?;
        let len = (entries.len().min(STAT_TAG_COUNT) * STAT_ENTRY_SIZE) as u32;
        sq.queue
            .add_chain(&self.mem, &[DriverBuf::read(self.stats_buffer.0, len)])?;
        sq.outstanding = true;
        self.transport.notify(sq.index)?;
        Ok(true)
    }

    fn report_blocks(
        &mut self,
        blocks: &[PageRange],
        verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), DriverError> {
        if self.broken.is_some() {
            return Err(DriverError::Broken);
        }
        let largest = blocks.iter().map(PageRange::bytes).max().unwrap_or(0);
        let size = usize::from(self.reporting.size());
        if blocks.len() > size || largest > u64::from(u32::MAX) {
            return Err(DriverError::BatchTooLarge {
                blocks: blocks.len(),
                largest,
            });
        }
        // in_flight[head] = (block index, buffer length)
        let mut in_flight: Vec<Option<(usize, u32)>> = vec![None; size];
        for (i, b) in blocks.iter().enumerate() {
            let len = b.bytes() as u32;
            let buf = DriverBuf::write(b.start.0 * PAGE_SIZE, len);
            let head = self.reporting.add_chain(&self.mem, &[buf])?;
            in_flight[usize::from(head)] = Some((i, len));
        }
        let index = self.reporting_index;
        self.transport.notify(index)?;
        let deadline = zeronce_types::clock::deadline_after(Instant::now(), self.opts.timeout);
        let bit6 = self.zero_hints();
        let mut used = 0;
        while used < blocks.len() {
            let seen = self.irq.count(index);
            for (id, len) in self.reporting.take_used(&self.mem)? {
                let (block, buf_len) = in_flight
                    .get_mut(id as usize)
                    .and_then(Option::take)
                    .ok_or(DriverError::UnknownUsedId { id })?;
                if len > buf_len {
                    return Err(DriverError::UsedLenTooLong { id, len, buf_len });
                }
                verdicts[block] = if bit6 && len == buf_len {
                    ZeroGuarantee::Zeroed
                } else {
                    ZeroGuarantee::NotZeroed
                };
                used += 1;
            }
            if used == blocks.len() {
                break;
            }
            // A device that stopped for good answers nothing more: fail now, not at the
            // timeout (it records why before it wakes the waiters).
            if let Some(why) = self.transport.failure() {
                return Err(TransportError::DeviceFailed(why).into());
            }
            if !self.irq.wait_past(index, seen, deadline) {
                return Err(DriverError::Timeout {
                    sent: blocks.len(),
                    used,
                    timeout: self.opts.timeout,
                });
            }
        }
        self.stats.reports += 1;
        let zeroed = verdicts
            .iter()
            .filter(|v| **v == ZeroGuarantee::Zeroed)
            .count() as u64;
        self.stats.zeroed += zeroed;
        self.stats.not_zeroed += blocks.len() as u64 - zeroed;
        Ok(())
    }

    /// After a failed call: the device may still hold buffers naming blocks the engine is
    /// about to put back; a reset makes it forget them before anyone reuses the memory.
    fn fail(&mut self, e: &DriverError) {
        self.stats.failures += 1;
        if self.broken.is_some() {
            return;
        }
        self.broken = Some(e.to_string());
        tracing::warn!(error = %e, "virtio-balloon driver: report failed; resetting the device");
        if let Err(e) = self.transport.reset() {
            tracing::warn!(error = %e, "virtio-balloon driver: device reset failed");
        }
    }
}

impl<M: GuestMemory + Send, T: Transport> ReportingDevice for BalloonDriver<M, T> {
    fn capacity(&self) -> usize {
        usize::from(self.reporting.size())
    }

    fn report(
        &mut self,
        _now: Instant,
        blocks: &[PageRange],
        verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), ReportError> {
        self.report_blocks(blocks, verdicts).map_err(|e| {
            self.fail(&e);
            ReportError::new(e)
        })
    }
}
