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

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zeronce_mem::Backing;
use zeronce_types::clock::deadline_after;

use crate::device::{BalloonDevice, BalloonOptions};
use crate::discard::DiscardPolicy;
use crate::error::MalformedKind;
use crate::features::{FeatureOffer, FeatureSet, QueueKind};
use crate::guest_ring::{DriverBuf, DriverQueue};
use crate::mock::{HookedMemory, RecordingDiscarder, RecordingInterrupt};
use crate::spec::limits::{
    MAX_CHAIN_DESCRIPTORS, MAX_HELD_BYTES, MAX_PAGES_PER_CALL, MAX_PFNS_PER_REQUEST,
    MAX_REPORT_BLOCK,
};
use crate::spec::PFN_PAGE_SIZE;
use crate::QueueReport;

mod checks;
mod input;
mod mutation;
mod oracle;
use checks::{
    activate, chain_has_indirect, check_discards, check_one_request_prefaults, check_still_serves,
};
use input::{plausible_request, Cursor};
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
    /// 4 KiB pages hinted (and discarded) on free_page_vq during a run.
    pub pages_hinted: u64,
    /// Malformed requests per class ([`MalformedKind::index`]).
    pub kinds: [u64; MalformedKind::COUNT],
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
            offer: FeatureOffer {
                free_page_hint: true,
                ..FeatureOffer::default().with_zero_hints()
            },
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
                // A hint run too, when bit 3 is negotiated (no input byte: replays keep
                // their meaning).
                let _ = self.dev.start_hint_run();
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
        let cmd_id = self.dev.config().free_page_hint_cmd_id();
        let (bufs, promise) = plausible_request(c, &self.mem, kind, bitmap, slot, cmd_id);
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
        self.out.pages_hinted = m.pages_hinted.get();
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
