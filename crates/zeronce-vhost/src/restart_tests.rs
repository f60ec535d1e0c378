//! A front-end stops the rings (`GET_VRING_BASE` on each, as QEMU's `vhost_dev_stop`
//! and crosvm's `deactivate_vring` do) and starts them again with the saved indices
//! (`SET_VRING_BASE`): every ring answers the device's own position, and the device
//! resumes serving without a new `SET_FEATURES`. The rings live in a memfd the test maps
//! too, driven by the driver-side ring writer of `zeronce-balloon`.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::{DriverBuf, DriverQueue};

use crate::protocol_tests::{
    ack, mem_table, reply, send, u64_payload, Daemon, GET_FEATURES, GET_PROTOCOL_FEATURES,
    NEED_REPLY, SET_FEATURES, SET_OWNER, SET_PROTOCOL_FEATURES,
};
use crate::wire;

pub(crate) const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_BASE: u32 = 10;
const GET_VRING_BASE: u32 = 11;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const SET_VRING_ENABLE: u32 = 18;
/// Where the front-end "maps" guest address 0 (as in `mem_table`).
pub(crate) const VA_BASE: u64 = 0x7f00_0000_0000;
const SIZE: u64 = 4 << 20;
pub(crate) const QSIZE: u16 = 16;

/// One ring as the front-end holds it: the driver's rings, the kick eventfd and the
/// call eventfd (the used-buffer notifications).
pub(crate) struct Ring {
    pub(crate) queue: DriverQueue,
    pub(crate) kick: OwnedFd,
    pub(crate) call: OwnedFd,
}

impl Ring {
    /// A ring of [`QSIZE`] entries at `at` in `mem`, with fresh kick and call eventfds.
    pub(crate) fn new(mem: &GuestMemoryMmap, at: GuestAddress) -> Ring {
        Ring {
            queue: DriverQueue::new(mem, at, QSIZE).unwrap(),
            kick: eventfd(),
            call: rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )
            .unwrap(),
        }
    }

    /// Ring `index` of the rings the tests lay out in guest memory (16 KiB apart from 0).
    pub(crate) fn nth(mem: &GuestMemoryMmap, index: u64) -> Ring {
        Ring::new(mem, GuestAddress(0x4000 * index))
    }

    /// Adds a chain, kicks, and waits until the device used it: its used length.
    pub(crate) fn roundtrip(&mut self, mem: &GuestMemoryMmap, bufs: &[DriverBuf]) -> u32 {
        let head = self.queue.add_chain(mem, bufs).unwrap();
        rustix::io::write(&self.kick, &1u64.to_ne_bytes()).unwrap();
        let t0 = Instant::now();
        loop {
            let used = self.queue.take_used(mem).unwrap();
            if let Some(&(h, len)) = used.first() {
                assert_eq!(used.len(), 1, "one chain used: {used:?}");
                assert_eq!(h, u32::from(head), "the chain added");
                return len;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the chain was not served"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

pub(crate) fn eventfd() -> OwnedFd {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap()
}

/// One of the per-ring setup messages a front-end sends.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RingMsg {
    /// SET_VRING_NUM: the ring's size ([`QSIZE`]).
    Num,
    /// SET_VRING_ADDR: the rings' addresses in the front-end's mapping.
    Addr,
    /// SET_VRING_BASE: the index to start from.
    Base,
    /// SET_VRING_CALL: the ring's call eventfd.
    Call,
    /// SET_VRING_KICK: the ring's kick eventfd.
    Kick,
    /// SET_VRING_ENABLE 1.
    Enable,
}

/// QEMU's per-ring order (`vhost_virtqueue_start`, then `vhost_user_set_vring_enable`).
pub(crate) const QEMU_RING_ORDER: [RingMsg; 6] = [
    RingMsg::Num,
    RingMsg::Addr,
    RingMsg::Base,
    RingMsg::Call,
    RingMsg::Kick,
    RingMsg::Enable,
];

/// Sends `order`'s messages for ring `index` (from `base`) with header `flags`; with
/// [`NEED_REPLY`] in them, checks each is acknowledged with 0.
pub(crate) fn setup_ring(
    s: &UnixStream,
    index: u32,
    ring: &Ring,
    base: u16,
    order: &[RingMsg],
    flags: u32,
) {
    let state = |num: u32| [index.to_le_bytes(), num.to_le_bytes()].concat();
    for &m in order {
        let (request, payload, fds) = match m {
            RingMsg::Num => (SET_VRING_NUM, state(u32::from(QSIZE)), vec![]),
            RingMsg::Addr => {
                let a = ring.queue.addrs();
                let mut p = Vec::new();
                p.extend_from_slice(&index.to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                for gpa in [a.desc, a.used, a.avail] {
                    p.extend_from_slice(&(VA_BASE + gpa.0).to_le_bytes());
                }
                p.extend_from_slice(&0u64.to_le_bytes());
                (SET_VRING_ADDR, p, vec![])
            }
            RingMsg::Base => (SET_VRING_BASE, state(u32::from(base)), vec![]),
            RingMsg::Call => (
                SET_VRING_CALL,
                u64_payload(u64::from(index)),
                vec![ring.call.try_clone().unwrap()],
            ),
            RingMsg::Kick => (
                SET_VRING_KICK,
                u64_payload(u64::from(index)),
                vec![ring.kick.try_clone().unwrap()],
            ),
            RingMsg::Enable => (SET_VRING_ENABLE, state(1), vec![]),
        };
        send(s, request, flags, &payload, &fds);
        if flags & NEED_REPLY != 0 {
            assert_eq!(ack(s, request), 0, "{m:?} on ring {index}");
        }
    }
}

/// SET_VRING_NUM, _ADDR, _BASE, _CALL, _KICK, _ENABLE for ring `index`, from `base`,
/// each asking for a reply.
pub(crate) fn start_ring(s: &UnixStream, index: u32, ring: &Ring, base: u16) {
    setup_ring(s, index, ring, base, &QEMU_RING_ORDER, NEED_REPLY);
}

/// The first `n` rings of `mem` ([`Ring::nth`]), each started from index 0.
pub(crate) fn start_rings(s: &UnixStream, mem: &GuestMemoryMmap, n: u64) -> Vec<Ring> {
    let rings: Vec<Ring> = (0..n).map(|i| Ring::nth(mem, i)).collect();
    for (i, r) in rings.iter().enumerate() {
        start_ring(s, i as u32, r, 0);
    }
    rings
}

/// GET_VRING_BASE of ring `index`: the index the back-end answers.
pub(crate) fn stop_ring(s: &UnixStream, index: u32) -> u32 {
    let p = [index.to_le_bytes(), 0u32.to_le_bytes()].concat();
    send(s, GET_VRING_BASE, 0, &p, &[]);
    let r = reply(s, GET_VRING_BASE);
    assert_eq!(u32::from_le_bytes(r[..4].try_into().unwrap()), index);
    u32::from_le_bytes(r[4..8].try_into().unwrap())
}

/// Sends one PFN (written at 2 MiB) on `ring`, kicked; waits until the device used it.
pub(crate) fn send_pfn(mem: &GuestMemoryMmap, ring: &mut Ring, pfn: u32) {
    let pfns = GuestAddress(0x20_0000);
    vm_memory::Bytes::write_slice(mem, &pfn.to_le_bytes(), pfns).unwrap();
    assert_eq!(ring.roundtrip(mem, &[DriverBuf::read(pfns.0, 4)]), 0);
}

/// A one-PFN deflate on ring 1, kicked; waits until the device used it.
fn deflate(mem: &GuestMemoryMmap, ring: &mut Ring) {
    send_pfn(mem, ring, 0x300);
}

#[test]
fn rings_stopped_and_started_again_resume_at_the_devices_indices() {
    let d = Daemon::start("restart");
    let s = UnixStream::connect(&d.socket).unwrap();
    send(&s, SET_OWNER, 0, &[], &[]);
    send(&s, GET_FEATURES, 0, &[], &[]);
    reply(&s, GET_FEATURES);
    send(&s, GET_PROTOCOL_FEATURES, 0, &[], &[]);
    reply(&s, GET_PROTOCOL_FEATURES);
    send(&s, SET_PROTOCOL_FEATURES, 0, &u64_payload(1 << 3), &[]); // REPLY_ACK
                                                                   // VERSION_1 and bit 30 only: two rings, inflate and deflate.
    send(
        &s,
        SET_FEATURES,
        NEED_REPLY,
        &u64_payload((1 << 32) | (1 << 30)),
        &[],
    );
    assert_eq!(ack(&s, SET_FEATURES), 0);
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, SIZE).unwrap();
    let file = std::fs::File::from(memfd.try_clone().unwrap());
    let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
        GuestAddress(0),
        SIZE as usize,
        Some(FileOffset::new(file, 0)),
    )])
    .unwrap();
    send(
        &s,
        wire::SET_MEM_TABLE,
        NEED_REPLY,
        &mem_table(SIZE, 1),
        &[memfd],
    );
    assert_eq!(ack(&s, wire::SET_MEM_TABLE), 0);
    let mut rings: Vec<Ring> = (0..2u64).map(|i| Ring::nth(&mem, i)).collect();
    for (i, r) in rings.iter().enumerate() {
        start_ring(&s, i as u32, r, 0);
    }
    deflate(&mem, &mut rings[1]);
    deflate(&mem, &mut rings[1]);

    // Stop: ring 0 first (the device stops with it), then ring 1, which must still
    // answer where the device was, not where the framework last set it (0).
    let bases = [stop_ring(&s, 0), stop_ring(&s, 1)];
    assert_eq!(bases, [0, 2], "each ring's next_avail");
    for (i, r) in rings.iter().enumerate() {
        start_ring(&s, i as u32, r, bases[i] as u16);
    }
    deflate(&mem, &mut rings[1]);
    let status = crate::control::request(&d.control, &serde_json::json!({"op": "status"})).unwrap();
    assert_eq!(status["metrics"]["balloon_deflate"], 3, "{status}");
    assert_eq!(status["metrics"]["malformed"], 0, "{status}");
}
