//! Who is on the other end of a connection: `SO_PEERCRED`, the credentials the kernel
//! recorded when the peer connected (they cannot be forged by the peer).
//!
//! [`PeerPolicy`] says who may talk to a daemon: root, the daemon's own user, and any
//! uid or gid an operator adds. [`PeerGate`] applies it to each accepted connection,
//! counts refusals and logs them rate-limited ([`zeronce_types::rate::log_this`]).

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};

use zeronce_types::rate::log_this;

/// The peer credentials of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The peer's process id (when it connected).
    pub pid: i32,
    /// Its user.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
}

/// Reads the credentials of the peer of `stream`.
pub fn peer_of(stream: &UnixStream) -> std::io::Result<Peer> {
    let c = rustix::net::sockopt::socket_peercred(stream)?;
    Ok(Peer {
        pid: c.pid.as_raw_nonzero().get(),
        uid: c.uid.as_raw(),
        gid: c.gid.as_raw(),
    })
}

/// Who may connect: root, the daemon's user, and the listed users and groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerPolicy {
    root: bool,
    own: u32,
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl PeerPolicy {
    /// Root and the user this process runs as.
    pub fn current_user() -> Self {
        PeerPolicy {
            root: true,
            own: rustix::process::geteuid().as_raw(),
            uids: Vec::new(),
            gids: Vec::new(),
        }
    }

    /// Also allows the users `uids` and the members (primary group) of `gids`.
    pub fn allowing(mut self, uids: &[u32], gids: &[u32]) -> Self {
        self.uids.extend_from_slice(uids);
        self.gids.extend_from_slice(gids);
        self
    }

    /// Whether `peer` may talk to the daemon.
    pub fn allows(&self, peer: &Peer) -> bool {
        (self.root && peer.uid == 0)
            || peer.uid == self.own
            || self.uids.contains(&peer.uid)
            || self.gids.contains(&peer.gid)
    }
}

/// A [`PeerPolicy`] applied to accepted connections, with the count of refusals.
#[derive(Debug)]
pub struct PeerGate {
    policy: PeerPolicy,
    what: &'static str,
    refused: AtomicU64,
}

impl PeerGate {
    /// A gate for the socket called `what` in log lines.
    pub fn new(policy: PeerPolicy, what: &'static str) -> Self {
        PeerGate {
            policy,
            what,
            refused: AtomicU64::new(0),
        }
    }

    /// Whether the peer of `stream` may talk to the daemon. A refused peer (or one
    /// whose credentials cannot be read) is counted and logged (the first ten, then at
    /// each doubling); the caller closes the connection.
    pub fn admit(&self, stream: &UnixStream) -> Option<Peer> {
        let peer = peer_of(stream);
        if let Ok(p) = &peer {
            if self.policy.allows(p) {
                return Some(*p);
            }
        }
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if log_this(n) {
            match peer {
                Ok(p) => tracing::warn!(
                    socket = self.what,
                    uid = p.uid,
                    gid = p.gid,
                    pid = p.pid,
                    refused_peers = n,
                    "peer not allowed: connection closed (first 10 logged, then at each doubling)"
                ),
                Err(e) => tracing::warn!(
                    socket = self.what,
                    error = %e,
                    refused_peers = n,
                    "cannot read the peer's credentials: connection closed"
                ),
            }
        }
        None
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_the_own_user_and_the_listed_ones_are_allowed() {
        let me = rustix::process::geteuid().as_raw();
        let p = |uid, gid| Peer { pid: 1, uid, gid };
        let policy = PeerPolicy::current_user();
        assert!(policy.allows(&p(0, 0)));
        assert!(policy.allows(&p(me, 12345)));
        let other = me.wrapping_add(4242);
        assert!(!policy.allows(&p(other, 4243)));
        let listed = policy.clone().allowing(&[other], &[]);
        assert!(listed.allows(&p(other, 4243)));
        let group = policy.allowing(&[], &[4243]);
        assert!(group.allows(&p(other, 4243)));
        assert!(!group.allows(&p(other, 4244)));
    }

    #[test]
    fn the_gate_admits_this_process_and_counts_refusals() {
        let (a, _b) = UnixStream::pair().unwrap();
        let gate = PeerGate::new(PeerPolicy::current_user(), "test");
        let me = gate.admit(&a).expect("our own user");
        assert_eq!(me.pid as u32, std::process::id());
        assert_eq!(gate.refused(), 0);
        // A policy that allows neither root nor this user: every connection refused.
        let nobody = PeerPolicy {
            root: false,
            own: me.uid.wrapping_add(1),
            uids: Vec::new(),
            gids: Vec::new(),
        };
        let gate = PeerGate::new(nobody, "test");
        for _ in 0..100 {
            assert!(gate.admit(&a).is_none());
        }
        assert_eq!(gate.refused(), 100);
    }
}
