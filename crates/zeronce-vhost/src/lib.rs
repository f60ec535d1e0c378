//! zeronce-vhost: the [`zeronce_balloon::BalloonDevice`] as a vhost-user back-end daemon,
//! on rust-vmm `vhost-user-backend`, for any VMM that speaks vhost-user (and for User Mode
//! Linux, whose `virtio_uml` transport is a vhost-user front-end).
//!
//! - [`server`]: listen, serve one front-end connection at a time with a fresh device,
//!   wait for the next, stop on SIGINT / SIGTERM.
//! - [`backend`]: the device behind `vhost-user-backend`'s `VhostUserBackend` trait
//!   (features, config space through `GET_CONFIG`/`SET_CONFIG`, queues, interrupts).
//! - [`relay`] and [`wire`]: the normalising relay in front of rust-vmm's request
//!   handler (the 72-byte `SET_MEM_TABLE` of `virtio_uml`) that also keeps the back-end
//!   request channel, on which `CONFIG_CHANGE_MSG` announces a new target.
//! - [`control`]: the JSON-lines control socket (target, status, statistics).
//! - [`cli`]: the `serve` and `balloon` verbs.
//! - [`path`]: socket path checks.
//! - [`frontend`]: the other side, for zeronce's own guest driver: its transport over
//!   vhost-user (rust-vmm `vhost`'s `Frontend`); [`child`]: a `serve` child process.
//!
//! Where the daemon sits in the whole system, and how it maps the guest's memory: the
//! repository's `docs/ARCHITECTURE.md` (§2, §9).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod child;
pub mod cli;
pub mod control;
pub mod frontend;
mod hub;
pub mod path;
pub mod relay;
pub mod server;
pub mod wire;

pub use backend::BalloonBackend;
pub use hub::{Hub, ServeConfig};
pub use server::{serve, ServeError};
