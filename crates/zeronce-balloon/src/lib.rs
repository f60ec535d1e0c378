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
//! Modules: [`spec`] constants, [`features`] negotiation and queue layout, [`config`]
//! space, [`device`], [`queues`] parsing per queue, [`discard`] policies and effects,
//! [`metrics`], [`error`].
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

pub mod config;
pub mod device;
pub mod discard;
pub mod error;
pub mod features;
#[cfg(any(test, feature = "test-utils"))]
pub mod fuzzing;
#[cfg(any(test, feature = "guest-ring", feature = "test-utils"))]
pub mod guest_ring;
mod inflight;
pub mod interrupt;
pub mod metrics;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
mod options;
pub mod queues;
pub mod spec;

pub use config::ConfigSpace;
pub use device::{BalloonDevice, BalloonOptions, InterruptSignal, QueueReport};
pub use discard::{DiscardError, DiscardPolicy, Discarder, MmapDiscarder};
pub use error::{BalloonError, MalformedKind, NotReadyReason};
pub use features::{Feature, FeatureOffer, FeatureSet, Negotiated, QueueKind, QueueLayout};
pub use metrics::{BalloonMetrics, MetricsSnapshot};
pub use queues::inflate::Pfn4k;
pub use queues::stats::GuestStats;
pub use spec::StatTag;
pub use zeronce_mem::{Backing, DiscardOp};
