//! zeronce-daemon: the socket hygiene both zeronce daemons share (`zeronce serve`, the
//! vhost-user balloon back-end, and `zeronce pool serve`), one implementation each.
//!
//! The index:
//! - [`socket`]: [`bind`] a unix listening socket: a live socket or a path that is not a
//!   socket is refused, a stale one (connecting is refused) replaced, the socket created
//!   with mode 0600 (or [`SocketOptions`]) whatever the umask.
//! - [`access`]: [`Access`] (both of the above) and [`AccessArgs`], the command-line
//!   options that set it (`--socket-mode`, `--socket-group`, `--allow-uid`, `--allow-gid`).
//! - [`peer`]: [`PeerPolicy`] and [`PeerGate`]: `SO_PEERCRED` checked against the
//!   daemon's user (and root) or an allowed list; refusals counted and logged
//!   rate-limited.
//! - [`accept`]: [`AcceptBackoff`] (an accept loop that sleeps, doubling up to a second,
//!   on `EMFILE` / `ENFILE` / `ENOBUFS` / `ENOMEM`), [`ConnLimit`] (at most N
//!   connections, each held by a [`ConnSlot`]) and [`refuse`] (one line, then close).
//! - [`line`](mod@line): [`read_line`], a line of at most N bytes that must be UTF-8.
//! - [`notify`]: `sd_notify` (`READY=1`, `STOPPING=1`) when `NOTIFY_SOCKET` is set.
//! - [`prometheus`]: the Prometheus text exposition format, and [`endpoint`]: the opt-in
//!   HTTP endpoint that serves it (a unix socket or a loopback port).
//!
//! Log lines about floods (refused peers, failed accepts) use the doubling scheme of
//! [`zeronce_types::rate::log_this`], as the balloon device's refused-input lines do.
#![forbid(unsafe_code)]

pub mod accept;
pub mod access;
pub mod endpoint;
pub mod line;
pub mod notify;
pub mod peer;
pub mod prometheus;
pub mod socket;

pub use accept::{refuse, AcceptBackoff, ConnLimit, ConnSlot};
pub use access::{Access, AccessArgs};
pub use line::{read_line, Line};
pub use peer::{PeerGate, PeerPolicy};
pub use socket::{bind, BindError, SocketOptions};
