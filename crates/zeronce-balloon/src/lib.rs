//! zeronce-balloon: a virtio-balloon device (host side) with free page reporting and
//! host-zeroed page hints (feature bits 6 `DEVICE_INIT_REPORTED` and 7
//! `DEVICE_INIT_ON_INFLATE`), built on rust-vmm `vm-memory` and `virtio-queue` so any
//! rust-vmm VMM can embed it.
//!
//! The VMM hands the device guest memory, [`virtio_queue::Queue`]s and an
//! [`InterruptSignal`]; the device discards memory through a [`Discarder`]
//! ([`MmapDiscarder`] for real guest memory) and tells the guest, page by page, which
//! pages now read zero — only where the discard guarantees it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use vm_memory::{GuestAddress, GuestMemoryMmap};
//! use zeronce_balloon::{BalloonDevice, BalloonOptions, InterruptSignal, MmapDiscarder};
//!
//! struct Irq;
//! impl InterruptSignal for Irq {
//!     fn signal_used_queue(&self, _queue: u16) { /* inject the interrupt */ }
//!     fn signal_config_change(&self) {}
//! }
//! let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 30)]).unwrap();
//! let mut dev = BalloonDevice::new(BalloonOptions::default(), MmapDiscarder::new(), Irq);
//! // transport: dev.device_features(), dev.ack_features(..), dev.activate(queues),
//! // then on each queue notification:
//! let _ = dev.process_queue(&mem, 0);
//! ```
//!
//! Index: the device and its vocabulary are re-exported here; [`spec`] holds the virtio
//! constants (layout, limits). Every other module is private, except the ones behind Cargo
//! features below.
//!
//! Cargo features: `guest-ring` adds `guest_ring`, the driver's side of a split
//! virtqueue (used by the guest driver crate `zeronce-balloon-driver`); `test-utils` adds
//! `mock` (recording discarder and interrupt), `fuzzing` (the fuzz harness) and the raw
//! writers a hostile driver needs. A VMM embedding the device needs neither.
//!
//! How the device fits in the whole system, and the rules behind its zero promises, are
//! in the repository's `docs/ARCHITECTURE.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod inflight;
mod options;
mod queues;

mod device;
mod discard;
mod error;
mod features;
mod interrupt;
mod metrics;

#[cfg(any(test, feature = "test-utils"))]
pub mod fuzzing;
#[cfg(any(test, feature = "guest-ring", feature = "test-utils"))]
pub mod guest_ring;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
pub mod spec;

/// The config space the device serves.
pub use config::ConfigSpace;
/// The device, how it is set up, how it signals the guest and what a queue pass did.
pub use device::{
    BalloonDevice, BalloonOptions, HintState, HintStatus, InterruptSignal, QueueReport,
};
/// How and with what the device discards guest memory.
pub use discard::{DiscardError, DiscardPolicy, Discarder, MmapDiscarder, RegionBacking};
/// Errors: what went wrong, and which kind of malformed guest request it was.
pub use error::{BalloonError, MalformedKind, NotReadyReason, QueueError};
/// Feature bits, their negotiation and the queue layout they imply.
pub use features::{Feature, FeatureOffer, FeatureSet, Negotiated, QueueKind, QueueLayout};
/// The device's counters.
pub use metrics::{BalloonMetrics, Counter, MetricsSnapshot};
/// A 4 KiB page frame number of the inflate and deflate queues.
pub use queues::inflate::Pfn4k;
/// The last statistics the guest sent.
pub use queues::stats::GuestStats;
/// A statistics tag of the stats queue.
pub use spec::StatTag;
/// The backing kinds and discard operations of `zeronce-mem`.
pub use zeronce_mem::{Backing, DiscardOp};
