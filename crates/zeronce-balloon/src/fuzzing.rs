//! The fuzz harness shared by the cargo-fuzz target (`fuzz/fuzz_targets/queue_handlers.rs`)
//! and the bounded proptest run in CI: arbitrary bytes become a hostile driver writing
//! arbitrary descriptors, rings, buffers and config accesses against a device on
//! vm-memory guest memory with a hole, through real split rings ([`DriverQueue`]).
//!
//! [`run`] panics if an invariant breaks: a discard outside guest RAM, unaligned to its
//! backing, or crossing a region; a reporting `used_len` other than 0 or the chain
//! length; an inflate `used_len` longer than the PFN count allows; or a device that no
//! longer serves a well-formed request after reset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use zeronce_mem::Backing;

use crate::device::{BalloonDevice, BalloonOptions};
use crate::discard::DiscardPolicy;
use crate::features::{FeatureOffer, FeatureSet, QueueKind, QueueLayout};
use crate::guest_ring::{DriverBuf, DriverQueue};
use crate::mock::{RecordingDiscarder, RecordingInterrupt};
use crate::spec::limits::MAX_PFNS_PER_REQUEST;
use crate::spec::PFN_PAGE_SIZE;

/// Guest RAM of the harness: two 4 MiB regions with a 4 MiB hole between them, and a
/// third right after the second (two mappings back to back: nothing may span them).
pub const REGIONS: [(u64, u64); 3] = [(0, 4 << 20), (8 << 20, 4 << 20), (12 << 20, 4 << 20)];
const QUEUE_SIZE: u16 = 16;
const DATA: u64 = 0x10_0000;

/// What a run did (for assertions that the harness is not vacuous).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuzzOutcome {
    /// Queue notifications delivered.
    pub notifications: usize,
    /// Chains the device popped.
    pub chains: usize,
    /// Chains refused as malformed.
    pub malformed: usize,
    /// Discards performed.
    pub discards: usize,
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    /// An address: mostly inside RAM or at interesting edges.
    fn addr(&mut self) -> u64 {
        match self.u8() % 8 {
            0 => self.u64(),
            1 => u64::MAX - u64::from(self.u16()),
            2 => (4 << 20) - 0x1000 * u64::from(self.u8() % 4), // end of region 0
            3 => (6 << 20) + u64::from(self.u16()),             // hole
            4 => (8 << 20) + 0x1000 * u64::from(self.u16() % 1024),
            _ => DATA + 0x1000 * u64::from(self.u8()) + u64::from(self.u8() % 2) * 0x800,
        }
    }
    fn len(&mut self) -> u32 {
        match self.u8() % 6 {
            0 => self.u32(),
            1 => 0,
            2 => 0x1000 * u32::from(self.u8() % 8 + 1),
            3 => 0x20_0000,
            _ => u32::from(self.u16() % 512),
        }
    }
}

/// The device under test, with the recording discarder and interrupt of the harness.
type Dev = BalloonDevice<RecordingDiscarder, Arc<RecordingInterrupt>>;

/// One run: guest memory, the device, and the driver side of its queues.
struct Harness {
    mem: GuestMemoryMmap,
    dev: Dev,
    queues: Vec<DriverQueue>,
    /// The features negotiated first (a well-formed request must work with them at the end).
    acked: FeatureSet,
    t0: Instant,
    out: FuzzOutcome,
}

impl Harness {
    /// Policy, region backings, options and features from the first bytes; activated.
    fn new(c: &mut Cursor<'_>) -> Harness {
        let mem = GuestMemoryMmap::<()>::from_ranges(
            &REGIONS.map(|(s, l)| (GuestAddress(s), l as usize)),
        )
        .expect("harness memory");
        let policy = match c.u8() % 3 {
            0 => DiscardPolicy::Immediate,
            1 => DiscardPolicy::Hold(Duration::from_millis(10)),
            _ => DiscardPolicy::Lazy,
        };
        let mut discarder = RecordingDiscarder::default();
        let huge = Backing::Hugetlb { page_size: 2 << 20 };
        match c.u8() % 3 {
            0 => {}
            1 => drop(discarder.backings.insert(REGIONS[1].0, Backing::SharedFile)),
            _ => drop(discarder.backings.insert(REGIONS[1].0, huge)),
        }
        let options = BalloonOptions {
            offer: FeatureOffer::default(),
            policy,
            prefault_on_deflate: c.u8() & 1 == 1,
            zero_promises: true,
        };
        let mut dev =
            BalloonDevice::new(options, discarder, Arc::new(RecordingInterrupt::default()));
        let acked = FeatureSet::from_bits(u64::from(c.u8()) | 1 << 32);
        let _ = dev.ack_features(acked);
        let acked = acked.intersect(dev.device_features());
        let (queues, _) = activate(&mut dev, &mem, acked);
        Harness {
            mem,
            dev,
            queues,
            acked,
            t0: Instant::now(),
            out: FuzzOutcome::default(),
        }
    }

    /// One operation chosen by the next byte.
    fn step(&mut self, c: &mut Cursor<'_>) {
        let nq = self.queues.len().max(1);
        match c.u8() % 12 {
            10 | 11 => {
                let q = usize::from(c.u8()) % nq;
                self.plausible_request(c, q);
            }
            0 => {
                let q = usize::from(c.u8()) % nq;
                self.arbitrary_chain(c, q);
            }
            1 => {
                let q = usize::from(c.u8()) % nq;
                self.raw_descriptor(c, q);
            }
            2 => {
                let at = DATA + u64::from(c.u16()) * 4;
                let bytes: Vec<u8> = (0..c.u8()).map(|_| c.u8()).collect();
                let _ = self.mem.write_slice(&bytes, GuestAddress(at));
            }
            3 | 4 => self.notify(u16::from(c.u8() % 6)),
            5 => {
                let at = self.t0 + Duration::from_millis(u64::from(c.u8()));
                let _ = self.dev.tick(&self.mem, at);
            }
            6 => {
                let (off, len, val) = (u64::from(c.u8() % 24), usize::from(c.u8() % 8), c.u8());
                let mut buf = vec![val; len];
                let _ = self.dev.read_config(off, &mut buf);
                let _ = self.dev.write_config(off, &buf);
            }
            7 => {
                self.dev.set_num_pages(c.u32());
                let _ = self.dev.request_stats(&self.mem);
            }
            8 => {
                let q = usize::from(c.u8()) % nq;
                let idx = c.u16();
                if let Some(dq) = self.queues.get_mut(q) {
                    let _ = dq.set_avail_idx(&self.mem, idx);
                }
            }
            _ => {
                let acked = FeatureSet::from_bits(u64::from(c.u8()) | 1 << 32)
                    .intersect(self.dev.device_features());
                let _ = self.dev.ack_features(acked);
                self.queues = activate(&mut self.dev, &self.mem, acked).0;
            }
        }
        check_used(&self.mem, &mut self.queues, self.dev.layout());
    }

    /// A request shaped for queue `q`'s kind, added and notified.
    fn plausible_request(&mut self, c: &mut Cursor<'_>, q: usize) {
        let kind = self
            .dev
            .layout()
            .and_then(|l| l.kind(u16::try_from(q).ok()?));
        let bitmap = self.dev.negotiated().is_some_and(|n| n.inflate_bitmap());
        let bufs = plausible_request(c, &self.mem, kind, bitmap);
        if let Some(dq) = self.queues.get_mut(q) {
            let _ = dq.add_chain(&self.mem, &bufs);
            self.notify(u16::try_from(q).unwrap_or(u16::MAX));
        }
    }

    /// A chain of 1 to 5 arbitrary descriptors on queue `q`, not notified.
    fn arbitrary_chain(&mut self, c: &mut Cursor<'_>, q: usize) {
        let bufs: Vec<DriverBuf> = (0..c.u8() % 5 + 1)
            .map(|_| DriverBuf {
                addr: c.addr(),
                len: c.len(),
                writable: c.u8() & 1 == 1,
            })
            .collect();
        if let Some(dq) = self.queues.get_mut(q) {
            let _ = dq.add_chain(&self.mem, &bufs);
        }
    }

    /// One raw descriptor (loops, bad `next`) written into queue `q`'s table and published.
    fn raw_descriptor(&mut self, c: &mut Cursor<'_>, q: usize) {
        let (i, a, l, f, n) = (c.u16(), c.addr(), c.len(), c.u16(), c.u16());
        if let Some(dq) = self.queues.get_mut(q) {
            let _ = dq.write_desc(&self.mem, i, a, l, f, n);
            let _ = dq.publish(&self.mem, i % QUEUE_SIZE);
        }
    }

    /// Notifies queue `index` (which may not exist).
    fn notify(&mut self, index: u16) {
        self.out.notifications += 1;
        if let Ok(r) = self.dev.process_queue_at(&self.mem, index, self.t0) {
            self.out.chains += r.chains;
            self.out.malformed += r.malformed;
        }
    }

    /// Completes held work, checks the end-of-run invariants, and says what the run did.
    fn finish(mut self) -> FuzzOutcome {
        let _ = self
            .dev
            .tick(&self.mem, self.t0 + Duration::from_secs(3600));
        check_used(&self.mem, &mut self.queues, self.dev.layout());
        check_discards(&self.mem, self.dev.discarder());
        self.out.discards = self.dev.discarder().calls.len();
        check_still_serves(&mut self.dev, &self.mem, self.acked);
        self.out
    }
}

/// Runs the harness on `data` (see the module docs).
pub fn run(data: &[u8]) -> FuzzOutcome {
    let mut c = Cursor(data);
    let mut h = Harness::new(&mut c);
    for _ in 0..256 {
        if c.0.is_empty() {
            break;
        }
        h.step(&mut c);
    }
    h.finish()
}

/// A request shaped for `kind`, with fuzz-chosen (mostly valid) contents.
fn plausible_request(
    c: &mut Cursor<'_>,
    mem: &GuestMemoryMmap,
    kind: Option<QueueKind>,
    bitmap: bool,
) -> Vec<DriverBuf> {
    let arr = DATA + 0x1000 * u64::from(c.u8() % 16);
    match kind {
        Some(QueueKind::Inflate | QueueKind::Deflate) => {
            let k = u32::from(c.u8() % 16) + 1;
            let pfns: Vec<u8> = (0..k)
                .flat_map(|_| {
                    let pfn = match c.u8() % 4 {
                        0 => c.u32(),
                        1 => 0x800 + u32::from(c.u16() % 1024), // region 1
                        2 if c.u8() < 128 => 0xbfc + u32::from(c.u8() % 8), // 1|2 edge
                        _ => 0x200 + u32::from(c.u16() % 512),  // region 0, above DATA
                    };
                    pfn.to_le_bytes()
                })
                .collect();
            let _ = mem.write_slice(&pfns, GuestAddress(arr));
            let mut bufs = vec![DriverBuf::read(arr, 4 * k)];
            if bitmap && kind == Some(QueueKind::Inflate) {
                bufs.push(DriverBuf::write(DATA + 0x10_000, k.div_ceil(8)));
            }
            bufs
        }
        Some(QueueKind::Stats) => {
            let k = usize::from(c.u8() % 8);
            let bytes: Vec<u8> = (0..k)
                .flat_map(|_| {
                    let tag = u16::from(c.u8() % 20).to_le_bytes();
                    tag.into_iter().chain(c.u64().to_le_bytes())
                })
                .collect();
            let _ = mem.write_slice(&bytes, GuestAddress(arr));
            vec![DriverBuf::read(arr, bytes.len() as u32)]
        }
        _ => (0..c.u8() % 4 + 1)
            .map(|_| {
                let at = REGIONS[1].0 + 0x1000 * u64::from(c.u16() % 1024);
                DriverBuf::write(at, 0x1000 * (u32::from(c.u8() % 16) + 1))
            })
            .collect(),
    }
}

/// Negotiates `acked` and activates fresh queues; returns the driver side.
fn activate(
    dev: &mut BalloonDevice<RecordingDiscarder, Arc<RecordingInterrupt>>,
    mem: &GuestMemoryMmap,
    acked: FeatureSet,
) -> (Vec<DriverQueue>, bool) {
    let Ok(neg) = dev.ack_features(acked) else {
        return (Vec::new(), false);
    };
    let queues: Vec<DriverQueue> = (0..neg.layout().len())
        .map(|i| DriverQueue::new(mem, GuestAddress(0x1000 * i as u64), QUEUE_SIZE).expect("rings"))
        .collect();
    let ok = dev
        .activate(queues.iter().map(DriverQueue::device_queue).collect())
        .is_ok();
    (queues, ok)
}

/// Used lengths are ones the device could justify: none on deflate/stats, at most a
/// full bitmap on inflate, whole 4 KiB pages on reporting.
fn check_used(mem: &GuestMemoryMmap, queues: &mut [DriverQueue], layout: Option<QueueLayout>) {
    for (i, q) in queues.iter_mut().enumerate() {
        let kind = layout.as_ref().and_then(|l| l.kind(i as u16));
        for (id, len) in q.take_used(mem).unwrap_or_default() {
            assert!(id < u32::from(QUEUE_SIZE), "used id {id} out of the table");
            match kind {
                Some(QueueKind::Inflate) => assert!(len as usize <= MAX_PFNS_PER_REQUEST / 8),
                Some(QueueKind::Reporting) => assert_eq!(u64::from(len) % PFN_PAGE_SIZE, 0),
                _ => assert_eq!(len, 0, "{kind:?}"),
            }
        }
    }
}

/// Every discard lies inside one region of guest RAM and respects its page size.
fn check_discards(mem: &GuestMemoryMmap, d: &RecordingDiscarder) {
    for call in &d.calls {
        let ps = call.backing.page_size() as u64;
        assert!(
            call.len > 0 && call.gpa.0 % ps == 0 && call.len % ps == 0,
            "{call:?}"
        );
        let region = mem.find_region(call.gpa).expect("discard inside guest RAM");
        assert!(
            call.gpa.0 + call.len <= region.start_addr().0 + region.len(),
            "{call:?}"
        );
    }
}

/// After whatever happened, a reset device serves a well-formed report / inflate.
fn check_still_serves(
    dev: &mut BalloonDevice<RecordingDiscarder, Arc<RecordingInterrupt>>,
    mem: &GuestMemoryMmap,
    acked: FeatureSet,
) {
    dev.reset();
    let (mut queues, ok) = activate(dev, mem, acked);
    assert!(ok, "device refused to activate after reset");
    let layout = dev.layout().expect("negotiated");
    let (kind, bufs) = match layout.index(QueueKind::Reporting) {
        Some(_) => (QueueKind::Reporting, vec![DriverBuf::write(DATA, 0x1000)]),
        None => {
            mem.write_obj(0x200u32, GuestAddress(DATA)).expect("pfn");
            let mut bufs = vec![DriverBuf::read(DATA, 4)];
            if dev.negotiated().is_some_and(|n| n.inflate_bitmap()) {
                bufs.push(DriverBuf::write(DATA + 0x100, 1));
            }
            (QueueKind::Inflate, bufs)
        }
    };
    let index = layout.index(kind).expect("queue");
    let head = queues[usize::from(index)]
        .add_chain(mem, &bufs)
        .expect("add");
    let held_before = dev.held_requests();
    let r = dev
        .process_queue_at(mem, index, Instant::now())
        .expect("served");
    assert_eq!(r.malformed, 0, "{kind:?} rejected a well-formed request");
    let _ = dev.tick(mem, Instant::now() + Duration::from_secs(3600));
    let used = queues[usize::from(index)]
        .take_used(mem)
        .expect("used ring");
    assert_eq!(
        used.len(),
        1,
        "request not completed (held before: {held_before})"
    );
    assert_eq!(used[0].0, u32::from(head));
}
