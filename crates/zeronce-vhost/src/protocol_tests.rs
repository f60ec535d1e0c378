//! The daemon against a scripted vhost-user front-end speaking raw messages: the 72-byte
//! `SET_MEM_TABLE` of Linux `virtio_uml` is accepted, the config space answers through
//! `GET_CONFIG`, a new target set on the control socket arrives as `CONFIG_CHANGE_MSG` on
//! the back-end channel, and the daemon serves the next front-end after a disconnect.
//! (A test inside the crate: it frames messages with the relay's own `wire` code.)

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};

use serde_json::json;
use zeronce_balloon::BalloonOptions;
use zeronce_daemon::endpoint::{scrape, MetricsAddr};

use crate::relay::{recv_message, send_message};
use crate::wire::{self, Header};
use crate::{control, Hub, ServeConfig};

pub(crate) const GET_FEATURES: u32 = 1;
pub(crate) const SET_FEATURES: u32 = 2;
pub(crate) const SET_OWNER: u32 = 3;
pub(crate) const GET_PROTOCOL_FEATURES: u32 = 15;
pub(crate) const SET_PROTOCOL_FEATURES: u32 = 16;
pub(crate) const GET_CONFIG: u32 = 24;
pub(crate) const NEED_REPLY: u32 = 0x8;
const REPLY: u32 = 0x4;

pub(crate) struct Daemon {
    pub(crate) hub: Arc<Hub>,
    pub(crate) socket: PathBuf,
    pub(crate) control: PathBuf,
    pub(crate) dir: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    pub(crate) fn start(name: &str) -> Daemon {
        Daemon::start_with(name, false, BalloonOptions::default())
    }

    /// A daemon serving a device with `balloon`; with `metrics`, its Prometheus page on
    /// `dir/metrics.sock`.
    pub(crate) fn start_with(name: &str, metrics: bool, balloon: BalloonOptions) -> Daemon {
        Daemon::start_custom(name, |c| {
            c.balloon = balloon;
            if metrics {
                c.metrics = Some(MetricsAddr::Unix(c.socket.with_file_name("metrics.sock")));
            }
        })
    }

    /// A daemon with the test configuration as `adjust` changes it.
    pub(crate) fn start_custom(name: &str, adjust: impl FnOnce(&mut ServeConfig)) -> Daemon {
        let dir = std::env::temp_dir().join(format!("zeronce-vhost-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("vhost.sock");
        let control = dir.join("ctl.sock");
        let mut config = ServeConfig {
            socket: socket.clone(),
            control: control.clone(),
            balloon: BalloonOptions::default(),
            num_pages: 0,
            access: zeronce_daemon::Access::default(),
            limits: crate::Limits {
                handshake: std::time::Duration::from_millis(500),
                ..crate::Limits::default()
            },
            metrics: None,
        };
        adjust(&mut config);
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            crate::serve(config, |hub| tx.send(Arc::clone(hub)).unwrap()).unwrap();
        });
        let hub = rx.recv().expect("the daemon started");
        Daemon {
            hub,
            socket,
            control,
            dir,
            thread: Some(thread),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.hub.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        assert!(!self.socket.exists(), "the socket is removed at shutdown");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SET_BACKEND_REQ_FD with NEED_REPLY, acknowledged: the front-end's end of the new
/// back-end request channel.
pub(crate) fn backend_channel(s: &UnixStream) -> UnixStream {
    let (ours, theirs) = UnixStream::pair().unwrap();
    send(
        s,
        wire::SET_BACKEND_REQ_FD,
        NEED_REPLY,
        &[],
        &[OwnedFd::from(theirs)],
    );
    assert_eq!(ack(s, wire::SET_BACKEND_REQ_FD), 0);
    ours
}

pub(crate) fn send(s: &UnixStream, request: u32, flags: u32, payload: &[u8], fds: &[OwnedFd]) {
    let h = Header {
        request,
        flags: wire::VERSION_1 | flags,
        size: payload.len() as u32,
    };
    send_message(s, &h, payload, fds).unwrap();
}

pub(crate) fn reply(s: &UnixStream, request: u32) -> Vec<u8> {
    let m = recv_message(s).unwrap().expect("a reply");
    assert_eq!(m.header.request, request, "reply to the request sent");
    assert_ne!(m.header.flags & REPLY, 0, "flagged as a reply");
    m.payload
}

/// Whether the daemon closed the connection (nothing more comes from it).
pub(crate) fn recv_or_closed(s: &UnixStream) -> bool {
    matches!(recv_message(s), Ok(None) | Err(_))
}

pub(crate) fn ack(s: &UnixStream, request: u32) -> u64 {
    u64::from_le_bytes(reply(s, request)[..8].try_into().unwrap())
}

pub(crate) fn u64_payload(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// A SET_MEM_TABLE payload: one region at guest address 0, mapped by the front-end at
/// `0x7f00_0000_0000`, in a struct of `slots` region slots (the unused ones zero).
pub(crate) fn mem_table(size: u64, slots: usize) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&1u32.to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    for v in [0u64, size, 0x7f00_0000_0000, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.resize(8 + 32 * slots, 0);
    p
}

/// `virtio_uml`'s SET_MEM_TABLE: one region, two slots (72 bytes).
pub(crate) fn uml_mem_table(size: u64) -> Vec<u8> {
    let p = mem_table(size, 2);
    assert_eq!(p.len(), 72);
    p
}

fn num_pages(s: &UnixStream) -> u32 {
    let mut p = Vec::new();
    for v in [0u32, 16, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.extend_from_slice(&[0u8; 16]);
    send(s, GET_CONFIG, 0, &p, &[]);
    let r = reply(s, GET_CONFIG);
    assert_eq!(
        r.len(),
        12 + 16,
        "offset, size, flags, then the 16-byte config"
    );
    u32::from_le_bytes(r[12..16].try_into().unwrap())
}

/// Negotiates like `virtio_uml` does at boot and module load; returns the back-end channel.
pub(crate) fn handshake(s: &UnixStream) -> UnixStream {
    send(s, SET_OWNER, 0, &[], &[]);
    send(s, GET_FEATURES, 0, &[], &[]);
    let offered = u64::from_le_bytes(reply(s, GET_FEATURES)[..8].try_into().unwrap());
    assert_ne!(
        offered & (1 << 30),
        0,
        "VHOST_USER_F_PROTOCOL_FEATURES offered"
    );
    assert_ne!(offered & (1 << 5), 0, "PAGE_REPORTING offered");
    send(s, GET_PROTOCOL_FEATURES, 0, &[], &[]);
    let proto = u64::from_le_bytes(reply(s, GET_PROTOCOL_FEATURES)[..8].try_into().unwrap());
    let wanted = (1 << 3) | (1 << 5) | (1 << 9); // REPLY_ACK, BACKEND_REQ, CONFIG
    assert_eq!(proto & wanted, wanted, "protocol features {proto:#x}");
    send(s, SET_PROTOCOL_FEATURES, 0, &u64_payload(wanted), &[]);
    let ours = backend_channel(s);
    let acked = (1 << 0) | (1 << 1) | (1 << 5) | (1 << 30) | (1 << 32);
    send(s, SET_FEATURES, NEED_REPLY, &u64_payload(acked), &[]);
    assert_eq!(ack(s, SET_FEATURES), 0);
    ours
}

#[test]
fn uml_mem_table_config_and_config_change_over_the_backend_channel() {
    let d = Daemon::start("proto");
    let s = UnixStream::connect(&d.socket).unwrap();
    let channel = handshake(&s);

    let size = 4 << 20;
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, size).unwrap();
    send(
        &s,
        wire::SET_MEM_TABLE,
        NEED_REPLY,
        &uml_mem_table(size),
        &[memfd],
    );
    assert_eq!(
        ack(&s, wire::SET_MEM_TABLE),
        0,
        "the 72-byte SET_MEM_TABLE is accepted"
    );

    assert_eq!(num_pages(&s), 0);
    let answer = control::request(&d.control, &json!({"op": "set", "pages": 256})).unwrap();
    assert_eq!(answer["num_pages"], 256);
    let m = recv_message(&channel).unwrap().expect("CONFIG_CHANGE_MSG");
    assert_eq!(
        (m.header.request, m.header.flags, m.header.size),
        (wire::BACKEND_CONFIG_CHANGE_MSG, wire::VERSION_1, 0),
        "a config change without NEED_REPLY"
    );
    assert_eq!(num_pages(&s), 256, "the guest reads the new target");

    let status = control::request(&d.control, &json!({"op": "status"})).unwrap();
    assert_eq!(status["connected"], true);
    assert_eq!(status["metrics"]["config_changes"], 1);
    let bad = control::request(&d.control, &json!({"op": "set", "pages": -1}));
    assert!(
        matches!(bad, Err(control::ControlError::Refused(_))),
        "{bad:?}"
    );

    // The front-end goes away; the daemon serves the next one, target kept.
    drop(s);
    drop(channel);
    let s2 = UnixStream::connect(&d.socket).unwrap();
    let _channel2 = handshake(&s2);
    assert_eq!(
        num_pages(&s2),
        256,
        "the operator's target outlives a guest"
    );
    let status = control::request(&d.control, &json!({"op": "status"})).unwrap();
    assert_eq!(status["connections"], 2);
}

/// The page, read back ([`zeronce_daemon::prometheus::parse`] checks its form).
fn parse_page(text: &str) -> std::collections::BTreeMap<String, f64> {
    zeronce_daemon::prometheus::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_metrics_page_parses_and_keeps_the_counts_of_ended_sessions() {
    let d = Daemon::start_with("metrics", true, BalloonOptions::default());
    let addr = MetricsAddr::Unix(d.dir.join("metrics.sock"));
    let s = UnixStream::connect(&d.socket).unwrap();
    let channel = handshake(&s);
    control::request(&d.control, &json!({"op": "set", "pages": 16})).unwrap();
    recv_message(&channel).unwrap().expect("CONFIG_CHANGE_MSG");
    let page = parse_page(&scrape(&addr).unwrap());
    assert_eq!(page["zeronce_vhost_connected"], 1.0);
    assert_eq!(page["zeronce_balloon_config_changes_total"], 1.0);
    assert_eq!(page["zeronce_balloon_target_pages"], 16.0);
    assert_eq!(
        page["zeronce_balloon_malformed_total{class=\"BadChain\"}"],
        0.0
    );
    drop((s, channel));
    // The next session: the first one's counts stay in the totals.
    let s = UnixStream::connect(&d.socket).unwrap();
    let _channel = handshake(&s);
    let page = parse_page(&scrape(&addr).unwrap());
    assert_eq!(page["zeronce_vhost_connections_total"], 2.0);
    // The first session's change, and the second device's initial target (16 pages).
    assert_eq!(page["zeronce_balloon_config_changes_total"], 2.0);
}
