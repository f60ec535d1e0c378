//! zeronce-vhost: the [`zeronce_balloon::BalloonDevice`] as a vhost-user back-end daemon,
//! on rust-vmm `vhost-user-backend`, for any VMM that speaks vhost-user (and for User Mode
//! Linux, whose `virtio_uml` transport is a vhost-user front-end).
//!
//! The index:
//! - [`serve`]: run the daemon from a [`ServeConfig`] until it is stopped (SIGINT /
//!   SIGTERM or [`Hub::stop`]); one front-end connection at a time, each with a fresh
//!   [`BalloonBackend`]; the [`Hub`] is its shared state (target, counters, the
//!   connection served); [`ServeError`] and [`SocketPathError`] say why it failed.
//! - [`control`]: the JSON-lines control socket's protocol (target, status, statistics)
//!   and its client, [`control::request`].
//! - [`cli`]: the `serve` and `balloon` verbs, shared by the `zeronce` program and this
//!   crate's `zeronce-vhost` binary.
//! - [`VhostUserTransport`]: the other side, for zeronce's own guest driver (rust-vmm
//!   `vhost`'s `Frontend`); [`ServeProcess`]: a `serve` child process.
//!
//! Inside: the device behind `vhost-user-backend`'s trait (`backend`: features, config
//! space through `GET_CONFIG`/`SET_CONFIG`, queues, interrupts), the accept loop
//! (`server`) over the shared state (`hub`), the normalising relay in front of rust-vmm's
//! request handler (`relay`, `wire`: the 72-byte `SET_MEM_TABLE` of `virtio_uml`, and
//! the back-end request channel on which `CONFIG_CHANGE_MSG` announces a new target; `slots`:
//! the bound on memory slots, `GET_MAX_MEM_SLOTS` / `ADD_MEM_REG`), the hint verbs and the
//! time limit on a hint run (`hint`), the socket path checks (`path`), and the Prometheus
//! page (`metrics`, `--metrics`).
//!
//! Where the daemon sits in the whole system, and how it maps the guest's memory: the
//! repository's `docs/ARCHITECTURE.md` (§2, §9).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod child;
pub mod cli;
pub mod control;
mod frontend;
mod hint;
mod hub;
mod metrics;
mod path;
mod relay;
mod server;
mod slots;
mod timer;
mod totals;
mod wire;

#[cfg(test)]
mod backing_tests;
#[cfg(test)]
mod hint_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod hugetlb_tests;
#[cfg(test)]
mod memslot_tests;
#[cfg(test)]
mod protocol_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod rust_vmm_frontend_tests;
#[cfg(test)]
mod soak_tests;
#[cfg(test)]
mod vmm_tests;

pub use backend::{BalloonBackend, DeviceGuard};
pub use child::ServeProcess;
pub use frontend::VhostUserTransport;
pub use hub::{Hub, Limits, ServeConfig};
pub use path::SocketPathError;
pub use server::{serve, ServeError};
