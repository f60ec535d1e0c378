//! What the demo's steps measured: one plain data type per kind of step, made by the
//! steps (`process`, `vm`, `steps`) and shown by the renderer (`out`). Nothing here
//! measures or prints.

use std::time::{Duration, Instant};
use zeronce::zeronce_mm::reporting::{ReportingConfig, ReportingStats};
use zeronce::zeronce_mm::Stats;

/// Memory held at one moment: resident bytes (process mode) or the memfd's allocated
/// bytes (VM mode), for the plot.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// When it was read.
    pub at: Instant,
    /// Bytes held.
    pub bytes: u64,
}

impl Sample {
    /// `bytes`, read now.
    pub fn now(bytes: u64) -> Sample {
        Sample {
            at: Instant::now(),
            bytes,
        }
    }
}

/// The first line: which demo, on how much memory of which backing.
pub struct Intro {
    /// Process or VM mode (and where the device runs).
    pub mode: IntroMode,
    /// `--size-mib`.
    pub size_mib: usize,
    /// What backs the memory, in words.
    pub backing: &'static str,
    /// `--working-set-mib`.
    pub working_set_mib: usize,
}

/// The mode of [`Intro`].
pub enum IntroMode {
    /// This process's kernel is the host.
    Process,
    /// A virtio-balloon device is the host; where it runs, in words.
    Vm {
        /// "in a thread of this process", or the `zeronce serve` child.
        device_at: String,
    },
}

/// VM mode: what the driver and the device agreed on.
pub struct Negotiated {
    /// The negotiated feature bits, by name.
    pub features: Vec<String>,
    /// Index of the reporting queue.
    pub reporting_queue: u16,
    /// Guest address of the rings.
    pub ring_gpa: u64,
    /// Bytes of the ring area.
    pub ring_bytes: u64,
}

/// What the reporter and the host do.
pub struct Settings {
    /// `--size-mib`.
    pub size_mib: usize,
    /// `--working-set-mib`.
    pub working_set_mib: usize,
    /// The reporting engine's settings.
    pub config: ReportingConfig,
    /// The host's policy, in words.
    pub host: String,
    /// Whether the host's zero hints are on.
    pub zero_hints: bool,
}

/// Steps 0 to 3: memory held after a phase of the working set's round trip.
pub struct Level {
    /// Which phase.
    pub phase: Phase,
    /// What was read, and when.
    pub held: Sample,
    /// What `held` counts.
    pub gauge: Gauge,
    /// The reporting delay.
    pub delay: Duration,
}

/// The phases of [`Level`].
pub enum Phase {
    /// Before the working set was written (VM mode shows it).
    Start,
    /// The working set was written.
    Wrote,
    /// It was freed, not yet reported.
    Freed,
    /// The reporter reported it.
    Reported {
        /// When, and in how many passes.
        settled: Settled,
        /// `--host hold`: how long reported memory stays resident.
        hold: Option<Duration>,
    },
}

/// What a [`Level`] counts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// Resident bytes of the process's memory.
    Resident,
    /// Allocated bytes of the guest RAM's memfd.
    Memfd,
}

/// How long after the free the reporter had reported it, and in how many passes.
pub struct Settled {
    /// Time since the free.
    pub after: Duration,
    /// Scheduled passes run meanwhile.
    pub passes: u64,
    /// Memory held, read every 0.1 s while waiting.
    pub samples: Vec<Sample>,
}

/// Wall time of allocating a working set zeroed, and of then touching every page.
#[derive(Clone, Copy)]
pub struct Timing {
    /// The allocations.
    pub alloc: Duration,
    /// The first touch of every page.
    pub touch: Duration,
}

/// Step 4: the working set allocated again zeroed, and where each block came from.
pub struct Realloc {
    /// Blocks allocated.
    pub blocks: usize,
    /// MiB allocated.
    pub mib: usize,
    /// Blocks whose zeroing was skipped (known zero).
    pub known_zero: usize,
    /// Of those, blocks written in step 1 that the host zeroed.
    pub by_host: usize,
    /// Of those, blocks never written since they were mapped.
    pub fresh: usize,
    /// Of those, blocks zeroed ahead of time.
    pub ahead: usize,
    /// Blocks the allocator zeroed.
    pub zeroed: usize,
    /// How long it took.
    pub timing: Timing,
    /// Why the host zeroed none, when the settings explain it ("" otherwise).
    pub why_not_host: &'static str,
}

/// Step 5: the same allocation on a baseline.
pub struct Baseline {
    /// Which baseline.
    pub kind: BaselineKind,
    /// MiB the allocator zeroed.
    pub zeroed_mib: u64,
    /// How long it took.
    pub timing: Timing,
}

/// The kinds of [`Baseline`].
pub enum BaselineKind {
    /// Process mode: memory that never left (reporting off).
    NeverLeft {
        /// Its resident MiB after the touch.
        resident_mib: u64,
        /// Step 4's timing, to explain a slower first touch there.
        ours: Timing,
    },
    /// VM mode: a device that makes no zero promise.
    NoZeroPromise,
}

/// Process mode's counters, as of step 4.
pub struct ProcessCounters {
    /// The allocator's.
    pub mm: Stats,
    /// The reporting engine's.
    pub reporting: Option<ReportingStats>,
    /// The host's (this process's kernel).
    pub host: Option<HostCounts>,
}

/// What process mode's host did with reported memory.
pub struct HostCounts {
    /// Bytes discarded.
    pub discarded: u64,
    /// Bytes answered "now zero".
    pub answered_zero: u64,
    /// Bytes held now (reported, not yet discarded).
    pub held: u64,
    /// Failed discards.
    pub failed: u64,
}

/// VM mode: the allocator's zeroing counters.
pub struct Allocator(pub Stats);

/// VM mode: one device's counters and its driver's.
pub struct DeviceCounters {
    /// Its JSON key.
    pub key: &'static str,
    /// Its name in the text (the demo has two devices).
    pub label: &'static str,
    /// Whether the counters came from a daemon's control socket.
    pub served: bool,
    /// The device's counters (`None`: the daemon did not say).
    pub device: DeviceCounts,
    /// The driver's counters.
    pub driver: DriverCounts,
    /// Bytes of the working set the demo freed for it to report.
    pub working_set: u64,
    /// Bytes reported beyond the working set.
    pub beyond: u64,
    /// Why the device may have been reported more than the working set.
    pub beyond_why: &'static str,
}

/// A device's counters.
pub struct DeviceCounts {
    /// Pages reported.
    pub pages_reported: Option<u64>,
    /// Bytes discarded.
    pub bytes_discarded: Option<u64>,
    /// Blocks promised zero.
    pub zero_promises: Option<u64>,
    /// Failed discards.
    pub failed_discards: Option<u64>,
    /// Malformed requests.
    pub malformed: Option<u64>,
}

/// A driver's counters.
pub struct DriverCounts {
    /// Report calls.
    pub reports: u64,
    /// Blocks answered zero.
    pub zeroed: u64,
    /// Blocks answered not zero.
    pub not_zeroed: u64,
    /// Failed calls.
    pub failures: u64,
}
