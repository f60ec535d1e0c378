//! The fuzz harness shared by the cargo-fuzz target (`fuzz/fuzz_targets/queue_handlers.rs`)
//! and the bounded proptest run in CI: arbitrary bytes become a hostile driver writing
//! arbitrary descriptors, rings, buffers and config accesses against a device on
//! vm-memory guest memory with a hole, through real split rings ([`DriverQueue`]).
//!
//! [`run`] panics if an invariant breaks: a discard outside guest RAM, unaligned to its
//! backing, or crossing a region; a reporting `used_len` other than 0 or the chain
//! length; an inflate `used_len` longer than the PFN count allows; an error from guest
//! input that is not of a named malformed class (a "VMM error"); a descriptor returned
//! more often than the device popped it (an invalid head never); a zero promise that is
//! false in memory (the recording discarder really writes zeros); a chain with an
//! indirect descriptor served with a nonzero `used_len`; a call serving more
//! than a queue's worth of chains, or held work past its bound; or a device that no
//! longer serves a well-formed request after reset. Guest memory also changes *during*
//! calls ([`HookedMemory`]: a guest publishing more heads, valid or not, while the
//! device pops), and arbitrary head indices and indirect descriptors are published.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use zeronce_mem::clock::deadline_after;
use zeronce_mem::Backing;

use crate::device::{BalloonDevice, BalloonOptions};
use crate::discard::DiscardPolicy;
use crate::error::MalformedKind;
use crate::features::{FeatureOffer, FeatureSet, QueueKind};
use crate::guest_ring::{DriverBuf, DriverQueue, DESC_F_INDIRECT, DESC_F_NEXT};
use crate::mock::{HookedMemory, RecordingDiscarder, RecordingInterrupt};
use crate::spec::limits::{
    MAX_CHAIN_DESCRIPTORS, MAX_HELD_BYTES, MAX_PAGES_PER_CALL, MAX_PFNS_PER_REQUEST,
    MAX_REPORT_BLOCK,
};
use crate::spec::PFN_PAGE_SIZE;
use crate::QueueReport;

mod mutation;
mod oracle;
use mutation::Mutation;
use oracle::{Oracle, Promise};

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
    /// Zero promises checked against memory.
    pub promises_checked: usize,
    /// Calls that stopped at a queue's worth with more available.
    pub more: usize,
    /// Descriptor or buffer words the guest overwrote during a call.
    pub mutations: usize,
    /// Malformed requests per class ([`MalformedKind::index`]).
    pub kinds: [u64; MalformedKind::COUNT],
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
    oracle: Oracle,
}

impl Harness {
    /// Policy, region backings, options and features from the first bytes; activated.
    fn new(c: &mut Cursor<'_>) -> Harness {
        let mem = GuestMemoryMmap::<()>::from_ranges(
            &REGIONS.map(|(s, l)| (GuestAddress(s), l as usize)),
        )
        .expect("harness memory");
        let policy = match c.u8() % 4 {
            0 => DiscardPolicy::Immediate,
            1 => DiscardPolicy::Hold(Duration::from_millis(10)),
            2 => DiscardPolicy::Hold(Duration::MAX),
            _ => DiscardPolicy::Lazy,
        };
        let mut discarder = RecordingDiscarder::zeroing();
        let huge = Backing::Hugetlb { page_size: 2 << 20 };
        match c.u8() % 3 {
            0 => {}
            1 => drop(discarder.backings.insert(REGIONS[1].0, Backing::SharedFile)),
            _ => drop(discarder.backings.insert(REGIONS[1].0, huge)),
        }
        let options = BalloonOptions {
            offer: FeatureOffer::default().with_zero_hints(),
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
        let mut oracle = Oracle::default();
        oracle.reset(queues.len());
        Harness {
            mem,
            dev,
            queues,
            acked,
            t0: Instant::now(),
            out: FuzzOutcome::default(),
            oracle,
        }
    }

    /// One operation chosen by the next byte.
    fn step(&mut self, c: &mut Cursor<'_>) {
        let nq = self.queues.len().max(1);
        match c.u8() % 14 {
            12 => {
                // Several well-formed requests in one batch (promises across requests).
                let q = usize::from(c.u8()) % nq;
                let n = c.u8() % 4 + 2;
                // Each with its own PFN array page (one shared page would be rewritten
                // before the device reads it).
                let heads: Vec<_> = (0..n)
                    .filter_map(|i| self.add_plausible(c, q, Some(u64::from(i))))
                    .collect();
                // The guest may also rewrite a descriptor or buffer while the device reads.
                let table = self.queues.get(q).map_or(0, |dq| dq.addrs().desc.0);
                let mutation = Mutation::parse(c, table);
                let index = u16::try_from(q).unwrap_or(u16::MAX);
                let (_, applied) = self.notify(index, None, mutation);
                let batch: Vec<u16> = heads.iter().map(|h| h.0).collect();
                for (head, before, p) in heads {
                    self.oracle.expect(q, head, before, p);
                }
                if let Some(a) = applied {
                    self.out.mutations += 1;
                    self.oracle.mutated(q, &batch, a);
                }
            }
            13 => {
                let q = usize::from(c.u8()) % nq;
                let mode = c.u8();
                drop(self.notify(u16::try_from(q).unwrap_or(u16::MAX), Some(mode), None));
            }
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
                self.oracle.forget();
            }
            3 | 4 => drop(self.notify(u16::from(c.u8() % 6), None, None)),
            5 => {
                let at = self.t0 + Duration::from_millis(u64::from(c.u8()));
                self.dev
                    .tick(&self.mem, at)
                    .expect("tick: used ring in RAM");
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
                self.set_avail_idx(q, idx);
            }
            _ => {
                let acked = FeatureSet::from_bits(u64::from(c.u8()) | 1 << 32)
                    .intersect(self.dev.device_features());
                let _ = self.dev.ack_features(acked);
                self.queues = activate(&mut self.dev, &self.mem, acked).0;
                self.oracle.reset(self.queues.len());
            }
        }
        self.check_used();
    }

    /// Takes the used elements of every queue: each checked by the oracle and by kind.
    fn check_used(&mut self) {
        let layout = self.dev.layout();
        for (i, q) in self.queues.iter_mut().enumerate() {
            let kind = layout.as_ref().and_then(|l| l.kind(i as u16));
            for (id, len) in q.take_used(&self.mem).unwrap_or_default() {
                self.oracle.used(&self.mem, i, kind, id, len);
                match kind {
                    Some(QueueKind::Inflate) => {
                        assert!(len as usize <= MAX_PFNS_PER_REQUEST / 8)
                    }
                    Some(QueueKind::Reporting) => assert_eq!(u64::from(len) % PFN_PAGE_SIZE, 0),
                    _ => assert_eq!(len, 0, "{kind:?}"),
                }
            }
        }
    }

    /// Sets queue `q`'s available index (anywhere: the device may see stale entries).
    fn set_avail_idx(&mut self, q: usize, idx: u16) {
        if let Some(dq) = self.queues.get_mut(q) {
            let _ = dq.set_avail_idx(&self.mem, idx);
        }
        self.oracle.forget();
    }

    /// Adds a well-formed request for queue `q`; returns its head, how many times the
    /// device had popped that head without returning it, and the request's promise.
    fn add_plausible(
        &mut self,
        c: &mut Cursor<'_>,
        q: usize,
        slot: Option<u64>,
    ) -> Option<(u16, u32, Promise)> {
        let kind = self
            .dev
            .layout()
            .and_then(|l| l.kind(u16::try_from(q).ok()?));
        let bitmap = self.dev.negotiated().is_some_and(|n| n.inflate_bitmap());
        let (bufs, promise) = plausible_request(c, &self.mem, kind, bitmap, slot);
        let head = self.queues.get_mut(q)?.add_chain(&self.mem, &bufs).ok()?;
        Some((head, self.oracle.outstanding(q, head), promise?))
    }

    /// Notifies queue `index` (which may not exist) through memory that records each
    /// available entry the device reads: what it popped, which is what the guest made
    /// available whatever it did to `avail.idx` ([`Oracle::popped`]). With `publish`,
    /// the guest also publishes a head each time the device reads an entry (keeping
    /// pace; some heads invalid when `mode` is odd), and the driver side resynchronises.
    /// With `mutation`, the guest overwrites a descriptor or buffer word during the call
    /// (returned if it did).
    fn notify(
        &mut self,
        index: u16,
        publish: Option<u8>,
        mutation: Option<Mutation>,
    ) -> (Option<QueueReport>, Option<mutation::Applied>) {
        let q = usize::from(index);
        let pages = self.pages_served();
        let Some(avail) = self.queues.get(q).map(|dq| dq.addrs().avail.0) else {
            let r = self.dev.process_queue_at(&self.mem, index, self.t0);
            return (self.account(r, pages), None);
        };
        let entries = avail + 4..avail + 4 + 2 * u64::from(QUEUE_SIZE);
        let popped = std::cell::RefCell::new(Vec::new());
        let mut budget = 3 * u32::from(QUEUE_SIZE);
        let (mut seen, mut applied) = (0, None);
        let hook = |m: &GuestMemoryMmap, at: GuestAddress| {
            if !entries.contains(&at.0) {
                if let Some(a) = mutation.and_then(|mu| mu.on_lookup(m, &mut seen)) {
                    applied = Some(a);
                }
                return;
            }
            if let Some(mode) = publish.filter(|_| budget > 0) {
                budget -= 1;
                let idx: u16 = m.read_obj(GuestAddress(avail + 2)).unwrap_or(0);
                let head = if mode & 1 == 1 && budget % 5 == 0 {
                    u16::MAX
                } else {
                    (idx ^ u16::from(mode)) % QUEUE_SIZE
                };
                let slot = GuestAddress(avail + 4 + 2 * u64::from(idx % QUEUE_SIZE));
                if m.write_obj(head, slot).is_ok() {
                    let _ = m.write_obj(idx.wrapping_add(1), GuestAddress(avail + 2));
                }
            }
            // The device reads this entry next (after the guest's write, if any).
            if let Ok(head) = m.read_obj::<u16>(at) {
                popped.borrow_mut().push(head);
            }
        };
        if publish.is_some() {
            self.oracle.forget();
        }
        let prefaults = self.dev.discarder().prefaults.len();
        let hooked = HookedMemory::new(self.mem.clone(), hook);
        let r = self.dev.process_queue_at(&hooked, index, self.t0);
        drop(hooked);
        if r.as_ref().is_ok_and(|r| r.chains == 1) {
            check_one_request_prefaults(&self.dev.discarder().prefaults[prefaults..]);
        }
        if publish.is_some() {
            let idx: u16 = self.mem.read_obj(GuestAddress(avail + 2)).unwrap_or(0);
            if let Some(dq) = self.queues.get_mut(q) {
                let _ = dq.set_avail_idx(&self.mem, idx);
            }
        }
        let popped = popped.into_inner();
        let desc_kept = !applied.is_some_and(|a: mutation::Applied| a.desc);
        if let (Ok(r), Some(dq)) = (&r, self.queues.get(q)) {
            assert_eq!(popped.len(), r.chains, "pops seen by the hook");
            // Unless the guest rewrote a descriptor during the call, the table is as the
            // device walked it: a chain served with a nonzero length had no indirect
            // descriptor (never negotiated, so refused).
            for &(head, len) in r.used.iter().filter(|_| desc_kept) {
                assert!(
                    len == 0 || !chain_has_indirect(&self.mem, dq.addrs().desc, head),
                    "queue {q}: chain {head} with an indirect descriptor served (used_len {len})"
                );
            }
        }
        for head in popped {
            self.oracle.popped(q, head);
        }
        (self.account(r, pages), applied)
    }

    /// Pages inflated, deflated and reported so far (the device's own counters).
    fn pages_served(&self) -> u64 {
        let m = self.dev.metrics();
        m.pages_inflated.get() + m.pages_deflated.get() + m.pages_reported.get()
    }

    /// Counts a call's report and checks the documented per-call bounds (`pages`: pages
    /// served before the call); an error must be a named class.
    fn account(
        &mut self,
        r: Result<QueueReport, crate::BalloonError>,
        pages: u64,
    ) -> Option<QueueReport> {
        self.out.notifications += 1;
        // A call stops at MAX_PAGES_PER_CALL pages; the chain that crosses it is served
        // whole (at most a full inflate, or a chain of the largest reported blocks).
        let chain_pages = (MAX_PFNS_PER_REQUEST as u64)
            .max(MAX_CHAIN_DESCRIPTORS as u64 * MAX_REPORT_BLOCK / PFN_PAGE_SIZE);
        let served = self.pages_served() - pages;
        assert!(
            served < MAX_PAGES_PER_CALL + chain_pages,
            "{served} pages in one call"
        );
        // Held work: its bytes under MAX_HELD_BYTES, at most one record per head.
        assert!(self.dev.held_bytes() <= MAX_HELD_BYTES);
        let heads = self.queues.len() * usize::from(QUEUE_SIZE);
        assert!(
            self.dev.held_requests() <= heads,
            "{} held",
            self.dev.held_requests()
        );
        match r {
            Ok(r) => {
                assert!(r.chains <= usize::from(QUEUE_SIZE), "{} chains", r.chains);
                self.out.chains += r.chains;
                self.out.malformed += r.malformed;
                self.out.more += usize::from(r.more);
                Some(r)
            }
            Err(e) => {
                assert!(e.kind().is_some(), "a VMM error from guest input: {e}");
                None
            }
        }
    }

    /// A request shaped for queue `q`'s kind, added and notified; its promise is
    /// checked when it is used ([`Oracle::expect`] says when it can be).
    fn plausible_request(&mut self, c: &mut Cursor<'_>, q: usize) {
        let added = self.add_plausible(c, q, None);
        drop(self.notify(u16::try_from(q).unwrap_or(u16::MAX), None, None));
        if let Some((head, before, p)) = added {
            self.oracle.expect(q, head, before, p);
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

    /// One raw descriptor (loops, bad `next`, any flags: indirect too) written into
    /// queue `q`'s table, and an arbitrary head (often that one) published.
    fn raw_descriptor(&mut self, c: &mut Cursor<'_>, q: usize) {
        let (i, a, l, f, n) = (c.u16(), c.addr(), c.len(), c.u16(), c.u16());
        let head = match c.u8() % 4 {
            0 => c.u16(),
            _ => i % QUEUE_SIZE,
        };
        self.oracle.forget();
        if let Some(dq) = self.queues.get_mut(q) {
            let _ = dq.write_desc(&self.mem, i, a, l, f, n);
            let _ = dq.publish(&self.mem, head);
        }
    }

    /// Completes held work, checks the end-of-run invariants, and says what the run did.
    fn finish(mut self) -> FuzzOutcome {
        self.dev
            .tick(&self.mem, deadline_after(self.t0, Duration::MAX))
            .expect("tick: used ring in RAM");
        self.check_used();
        check_discards(&self.mem, self.dev.discarder());
        self.out.discards = self.dev.discarder().calls.len();
        self.out.promises_checked = self.oracle.checked;
        let m = self.dev.metrics();
        for k in MalformedKind::ALL {
            self.out.kinds[k.index()] = m.malformed_count(k);
        }
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

/// A request shaped for `kind`, with fuzz-chosen (mostly valid) contents, its PFN array
/// or stats buffer in page `slot` of the data area (fuzz-chosen when `None`).
fn plausible_request(
    c: &mut Cursor<'_>,
    mem: &GuestMemoryMmap,
    kind: Option<QueueKind>,
    bitmap: bool,
    slot: Option<u64>,
) -> (Vec<DriverBuf>, Option<Promise>) {
    let arr = DATA + 0x1000 * slot.unwrap_or_else(|| u64::from(c.u8() % 16));
    match kind {
        Some(QueueKind::Inflate | QueueKind::Deflate) => {
            let k = u32::from(c.u8() % 16) + 1;
            let pfns: Vec<u32> = (0..k)
                .map(|_| match c.u8() % 5 {
                    0 => c.u32(),
                    1 => 0x800 + u32::from(c.u16() % 1024), // region 1
                    2 if c.u8() < 128 => 0xbfc + u32::from(c.u8() % 8), // 1|2 edge
                    3 => 0x110 + u32::from(c.u8() % 4),     // the bitmaps' page
                    _ => 0x200 + u32::from(c.u16() % 512),  // region 0, above DATA
                })
                .collect();
            let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
            let _ = mem.write_slice(&bytes, GuestAddress(arr));
            let mut bufs = vec![DriverBuf::read(arr, 4 * k)];
            let mut promise = None;
            if bitmap && kind == Some(QueueKind::Inflate) {
                let at = DATA + 0x10_000 + 0x40 * u64::from(c.u8() % 64);
                bufs.push(DriverBuf::write(at, k.div_ceil(8)));
                promise = Some(Promise::Inflate {
                    alt: pfns.clone(),
                    pfns,
                    arr,
                    bitmap: at,
                });
            }
            (bufs, promise)
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
            (vec![DriverBuf::read(arr, bytes.len() as u32)], None)
        }
        _ => {
            let bufs: Vec<DriverBuf> = (0..c.u8() % 4 + 1)
                .map(|_| {
                    let at = REGIONS[1].0 + 0x1000 * u64::from(c.u16() % 1024);
                    DriverBuf::write(at, 0x1000 * (u32::from(c.u8() % 16) + 1))
                })
                .collect();
            let blocks: Vec<(u64, u64)> = bufs.iter().map(|b| (b.addr, u64::from(b.len))).collect();
            let total = blocks.iter().map(|b| b.1 as u32).sum();
            (bufs, Some(Promise::Report { blocks, total }))
        }
    }
}

/// The prefaults of one deflate request are merged runs: no page twice, and no two runs
/// that touch inside one region (a deflate of `n` PFNs is at most `n` calls, fewer when
/// they are contiguous or repeated).
fn check_one_request_prefaults(calls: &[(GuestAddress, u64)]) {
    let mut runs: Vec<(u64, u64)> = calls.iter().map(|(g, l)| (g.0, g.0 + l)).collect();
    runs.sort_unstable();
    for w in runs.windows(2) {
        let ((_, end), (next, _)) = (w[0], w[1]);
        let region_start = REGIONS.iter().any(|r| r.0 == next);
        assert!(
            end < next || (end == next && region_start),
            "deflate prefaults not merged: {runs:x?}"
        );
    }
}

/// Whether the chain from `head` in the descriptor table at `table` holds a descriptor
/// flagged `VIRTQ_DESC_F_INDIRECT` (within the 64 descriptors a chain may have).
fn chain_has_indirect(mem: &GuestMemoryMmap, table: GuestAddress, head: u16) -> bool {
    let mut i = head;
    for _ in 0..crate::spec::limits::MAX_CHAIN_DESCRIPTORS {
        let at = table.0 + 16 * u64::from(i);
        let flags: u16 = mem.read_obj(GuestAddress(at + 12)).unwrap_or(0);
        if flags & DESC_F_INDIRECT != 0 {
            return true;
        }
        i = mem.read_obj(GuestAddress(at + 14)).unwrap_or(u16::MAX);
        if flags & DESC_F_NEXT == 0 || i >= QUEUE_SIZE {
            return false;
        }
    }
    false
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
    let _ = dev.tick(mem, deadline_after(Instant::now(), Duration::MAX));
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
