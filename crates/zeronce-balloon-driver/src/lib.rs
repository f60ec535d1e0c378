//! zeronce-balloon-driver: the guest side of virtio-balloon free page reporting.
//!
//! The index:
//! - [`BalloonDriver`]: negotiates features as Linux does ([`choose_features`], with
//!   [`DriverOptions`]; [`MissingFeature`] when the device lacks one), lays out its split
//!   virtqueues in guest RAM ([`DriverQueue`], [`DriverBuf`], [`QueueAddrs`], from
//!   `zeronce_balloon::guest_ring`), and implements
//!   [`zeronce_mm::reporting::ReportingDevice`] over the reporting queue; [`DriverStats`]
//!   counts its reports, [`DriverError`] says why one failed.
//! - [`Transport`]: how the driver reaches its device (features, config, queue setup,
//!   kicks, reset), with [`TransportError`] and the used-buffer wake-up [`UsedSignal`].
//! - [`InProcessTransport`]: runs a `zeronce_balloon::BalloonDevice` in a thread of the
//!   same process as that transport (VM mode without a VMM).
//!
//! Inside: the driver (`driver`: one report call, the ring area), feature negotiation
//! (`negotiate`), the transport trait (`transport`) and the in-process device thread
//! (`inprocess`).
//!
//! The architecture (crates, state rules, the device's zero promises) is described in
//! the repository's `docs/ARCHITECTURE.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod driver;
mod inprocess;
mod negotiate;
mod transport;

pub use driver::{BalloonDriver, DriverError, DriverStats};
pub use inprocess::InProcessTransport;
pub use negotiate::{choose_features, DriverOptions, MissingFeature};
pub use transport::{Transport, TransportError, UsedSignal};
pub use zeronce_balloon::guest_ring::{DriverBuf, DriverQueue, QueueAddrs};
