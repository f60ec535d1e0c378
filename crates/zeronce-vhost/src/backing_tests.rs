//! The host policies (`--host immediate|hold|lazy`) and the backings of guest RAM over
//! vhost-user, measured on the file the front-end shares: a scripted front-end reports a
//! written 2 MiB block on the reporting ring and reads what the back-end answered
//! (`used_len`: the zero promise of bit 6) and what the file kept — a memfd's allocated
//! blocks (`fstat` st_blocks), a hugetlbfs file's huge pages (the pool's
//! `free_hugepages`).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::DriverBuf;
use zeronce_balloon::{BalloonOptions, DiscardPolicy, FeatureOffer};
use zeronce_mem::file_allocated_bytes;

use crate::protocol_tests::{
    ack, mem_table, reply, send, u64_payload, Daemon, GET_FEATURES, GET_PROTOCOL_FEATURES,
    NEED_REPLY, SET_FEATURES, SET_OWNER, SET_PROTOCOL_FEATURES,
};
use crate::restart_tests::{start_rings, stop_ring, Ring};
use crate::wire;

pub(crate) const MIB: u64 = 1 << 20;
/// The reported block: one 2 MiB block (Linux's reporting order), the second of guest RAM
/// (the rings are in the first).
pub(crate) const BLOCK: u64 = 2 * MIB;
/// Guest RAM: two 2 MiB blocks.
pub(crate) const SIZE: u64 = 4 * MIB;
/// inflate, deflate, reporting.
const REPORTING: usize = 2;

/// VERSION_1, the protocol features bit, PAGE_REPORTING and DEVICE_INIT_REPORTED (bit 6:
/// `used_len` is the zero promise).
const FEATURES: u64 = (1 << 32) | (1 << 30) | (1 << 5) | (1 << 6);

/// Device options with `policy` and the zero hints offered.
pub(crate) fn options(policy: DiscardPolicy) -> BalloonOptions {
    BalloonOptions {
        offer: FeatureOffer::default().with_zero_hints(),
        policy,
        ..BalloonOptions::default()
    }
}

/// A scripted front-end with its guest RAM in `file`, rings started.
pub(crate) struct Guest {
    pub(crate) s: UnixStream,
    pub(crate) mem: GuestMemoryMmap,
    pub(crate) file: File,
    pub(crate) rings: Vec<Ring>,
}

impl Guest {
    /// Negotiates reporting with zero hints, sends the memory table (one region, all of
    /// `file`), starts the three rings.
    pub(crate) fn connect(d: &Daemon, file: File) -> Guest {
        let s = UnixStream::connect(&d.socket).unwrap();
        send(&s, SET_OWNER, 0, &[], &[]);
        send(&s, GET_FEATURES, 0, &[], &[]);
        let offered = u64::from_le_bytes(reply(&s, GET_FEATURES)[..8].try_into().unwrap());
        assert_eq!(offered & FEATURES, FEATURES, "offered {offered:#x}");
        send(&s, GET_PROTOCOL_FEATURES, 0, &[], &[]);
        reply(&s, GET_PROTOCOL_FEATURES);
        send(&s, SET_PROTOCOL_FEATURES, 0, &u64_payload(1 << 3), &[]); // REPLY_ACK
        send(&s, SET_FEATURES, NEED_REPLY, &u64_payload(FEATURES), &[]);
        assert_eq!(ack(&s, SET_FEATURES), 0);
        let mem = share_memory(&s, &file, NEED_REPLY);
        let rings = start_rings(&s, &mem, 3);
        Guest {
            s,
            mem,
            file,
            rings,
        }
    }

    /// Writes `byte` over the reported block.
    pub(crate) fn fill_block(&self, byte: u8) {
        let data = vec![byte; BLOCK as usize];
        self.mem.write_slice(&data, GuestAddress(BLOCK)).unwrap();
    }

    /// Reports `[gpa, gpa + len)` (one device-writable buffer) and kicks; the head.
    pub(crate) fn report(&mut self, gpa: u64, len: u32) -> u32 {
        let ring = &mut self.rings[REPORTING];
        let head = ring
            .queue
            .add_chain(&self.mem, &[DriverBuf::write(gpa, len)])
            .unwrap();
        rustix::io::write(&ring.kick, &1u64.to_ne_bytes()).unwrap();
        u32::from(head)
    }

    /// The reporting ring's used entries now.
    pub(crate) fn used(&mut self) -> Vec<(u32, u32)> {
        self.rings[REPORTING].queue.take_used(&self.mem).unwrap()
    }

    /// Waits (at most 10 s, a bound for a lost buffer, not a measurement) for the
    /// reporting ring's next used entries.
    pub(crate) fn wait_used(&mut self, what: &str) -> Vec<(u32, u32)> {
        let t0 = Instant::now();
        loop {
            let used = self.used();
            if !used.is_empty() {
                return used;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}: never used");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the reporting ring's call eventfd was signalled (and clears it).
    pub(crate) fn called(&self) -> bool {
        let mut buf = [0u8; 8];
        rustix::io::read(&self.rings[REPORTING].call, &mut buf).is_ok()
    }

    /// Whether the reported block reads zero.
    pub(crate) fn block_reads_zero(&self) -> bool {
        let mut buf = vec![1u8; BLOCK as usize];
        self.mem.read_slice(&mut buf, GuestAddress(BLOCK)).unwrap();
        buf.iter().all(|&b| b == 0)
    }

    /// Bytes the file has allocated.
    pub(crate) fn allocated(&self) -> u64 {
        file_allocated_bytes(&self.file).unwrap()
    }
}

/// Guest RAM at guest address 0: all of `file` (as the test's side maps it).
pub(crate) fn guest_mem(file: &File) -> GuestMemoryMmap {
    GuestMemoryMmap::<()>::from_ranges_with_files([(
        GuestAddress(0),
        file_len(file) as usize,
        Some(FileOffset::new(file.try_clone().unwrap(), 0)),
    )])
    .unwrap()
}

/// SET_MEM_TABLE of one region, all of `file` at guest address 0, header `flags` (with
/// [`NEED_REPLY`], checks the ack): the test's own mapping of it.
pub(crate) fn share_memory(s: &UnixStream, file: &File, flags: u32) -> GuestMemoryMmap {
    let fd = OwnedFd::from(file.try_clone().unwrap());
    send(
        s,
        wire::SET_MEM_TABLE,
        flags,
        &mem_table(file_len(file), 1),
        &[fd],
    );
    if flags & NEED_REPLY != 0 {
        assert_eq!(ack(s, wire::SET_MEM_TABLE), 0);
    }
    guest_mem(file)
}

fn file_len(file: &File) -> u64 {
    file.metadata().unwrap().len()
}

/// A memfd of guest RAM.
pub(crate) fn memfd() -> File {
    let fd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, SIZE).unwrap();
    File::from(fd)
}

pub(crate) fn status(d: &Daemon) -> Value {
    crate::control::request(&d.control, &json!({"op": "status"})).unwrap()
}

#[test]
fn memfd_region_is_learnt_as_shared_file_and_a_report_punches_a_hole_promising_zero() {
    let d = Daemon::start_with("memfd", false, options(DiscardPolicy::Immediate));
    let mut g = Guest::connect(&d, memfd());
    let st = status(&d);
    assert_eq!(
        st["regions"],
        json!([{"gpa": 0, "size": SIZE, "backing": "shared_file"}]),
        "the region's backing, learnt at SET_MEM_TABLE: {st}"
    );
    assert_eq!(st["host"], json!({"policy": "immediate"}));
    g.fill_block(0x5a);
    let before = g.allocated();
    let head = g.report(BLOCK, BLOCK as u32);
    assert_eq!(g.wait_used("the report"), vec![(head, BLOCK as u32)]);
    let after = g.allocated();
    eprintln!("memfd: allocated {before} -> {after} bytes");
    assert_eq!(before - after, BLOCK, "the block's pages left the memfd");
    assert!(g.block_reads_zero());
    assert_eq!(status(&d)["metrics"]["zero_promises"], 1);
}

#[test]
fn lazy_on_a_memfd_falls_back_to_punch_hole_and_promises_nothing() {
    let d = Daemon::start_with("lazy", false, options(DiscardPolicy::Lazy));
    let mut g = Guest::connect(&d, memfd());
    assert_eq!(status(&d)["host"], json!({"policy": "lazy"}));
    g.fill_block(0x5a);
    let before = g.allocated();
    let head = g.report(BLOCK, BLOCK as u32);
    assert_eq!(
        g.wait_used("the report"),
        vec![(head, 0)],
        "MADV_FREE's fallback promises nothing"
    );
    let after = g.allocated();
    assert_eq!(
        before - after,
        BLOCK,
        "the fallback (punch hole) still frees the pages: MADV_FREE cannot on shmem"
    );
    let st = status(&d);
    assert_eq!(st["metrics"]["bytes_discarded"], BLOCK, "{st}");
    assert_eq!(st["metrics"]["zero_promises"], 0, "{st}");
}

#[test]
fn hold_keeps_buffer_and_memory_until_the_delay_then_discards_uses_and_notifies() {
    let delay = Duration::from_millis(400);
    let d = Daemon::start_with("hold", false, options(DiscardPolicy::Hold(delay)));
    let mut g = Guest::connect(&d, memfd());
    assert_eq!(
        status(&d)["host"],
        json!({"policy": "hold", "hold_ms": 400})
    );
    g.fill_block(0x5a);
    let before = g.allocated();
    let t0 = Instant::now();
    let head = g.report(BLOCK, BLOCK as u32);
    // Until the device holds the request; then, under the device lock (no tick can run
    // meanwhile), nothing is used, signalled or discarded.
    let backend = d.hub.backend().expect("connected");
    let t = Instant::now();
    loop {
        let mut dev = backend.lock();
        if dev.device().held_requests() == 1 {
            assert_eq!(g.used(), vec![], "not used before the delay");
            assert!(!g.called(), "no notification before the delay");
            assert_eq!(g.allocated(), before, "not discarded before the delay");
            break;
        }
        drop(dev);
        assert!(t.elapsed() < Duration::from_secs(10), "never held");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(g.wait_used("the held report"), vec![(head, BLOCK as u32)]);
    assert!(
        t0.elapsed() >= delay,
        "used after {:?}, before the hold of {delay:?}",
        t0.elapsed()
    );
    assert!(g.called(), "the used buffer was notified");
    assert_eq!(before - g.allocated(), BLOCK, "discarded once used");
    assert!(g.block_reads_zero());
    assert_eq!(status(&d)["metrics"]["zero_promises"], 1);
}

#[test]
fn rings_stopped_during_a_hold_get_the_held_buffer_back_first() {
    let hold = DiscardPolicy::Hold(Duration::from_secs(600));
    let d = Daemon::start_with("hold-stop", false, options(hold));
    let mut g = Guest::connect(&d, memfd());
    g.fill_block(0x5a);
    let before = g.allocated();
    let head = g.report(BLOCK, BLOCK as u32);
    let backend = d.hub.backend().expect("connected");
    let t = Instant::now();
    while backend.lock().device().held_requests() == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "never held");
        std::thread::sleep(Duration::from_millis(2));
    }
    let bases: Vec<u32> = (0..3).map(|i| stop_ring(&g.s, i)).collect();
    assert_eq!(bases, [0, 0, 1], "each ring's next_avail");
    assert_eq!(
        g.used(),
        vec![(head, BLOCK as u32)],
        "used by the time GET_VRING_BASE answered"
    );
    assert_eq!(before - g.allocated(), BLOCK);
    assert_eq!(backend.lock().device().held_requests(), 0);
}
