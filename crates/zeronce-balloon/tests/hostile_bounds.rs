//! A hostile guest trying to make the device's costs unbounded: chains and pages served
//! per call, held work, the log, system calls per deflate, and a hold past the clock.
//! The classes are listed in RELIABILITY.md.

mod common;

use std::time::Duration;

use common::hostile::held;
use common::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::{DriverBuf, DESC_F_NEXT, DESC_F_WRITE};
use zeronce_balloon::mock::{HookedMemory, RecordingDiscarder};
use zeronce_balloon::spec::limits::{HELD_BYTES_PER_REPORTED_BLOCK, MAX_HELD_BYTES};
use zeronce_balloon::{BalloonOptions, Feature, MalformedKind, QueueKind};
use Feature::*;

/// Class 4: a guest that keeps advancing `avail.idx` while the device pops kept one
/// `process_queue` call popping without limit, returning nothing until the end.
#[test]
fn one_call_serves_at_most_a_queue_of_chains() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &[PageReporting]);
    let q = usize::from(rig.index(QueueKind::Reporting));
    let avail = rig.queues[q].addrs().avail.0;
    // Sixteen one-block chains, heads 0..16, one published.
    for i in 0..16u16 {
        let gpa = 8 * MIB + 0x1000 * u64::from(i);
        rig.queues[q]
            .write_desc(&mem, i, gpa, 0x1000, DESC_F_WRITE, 0)
            .unwrap();
    }
    rig.queues[q].publish(&mem, 0).unwrap();
    // Whenever the device reads an available entry, the guest publishes one more (a
    // guest keeping pace with the device), up to 5000.
    let mut published: u16 = 1;
    let hostile = HookedMemory::new(mem.clone(), move |m: &GuestMemoryMmap, at| {
        let reads_entry = (avail + 4..avail + 4 + 32).contains(&at.0);
        if reads_entry && published < 5000 {
            let slot = GuestAddress(avail + 4 + 2 * u64::from(published % 16));
            m.write_obj(published % 16, slot).unwrap();
            published += 1;
            m.write_obj(published, GuestAddress(avail + 2)).unwrap();
        }
    });
    let index = rig.index(QueueKind::Reporting);
    let mut served = 0;
    for _ in 0..3 {
        let r = rig.dev.process_queue_at(&hostile, index, rig.now).unwrap();
        assert!(r.chains <= 16, "{} chains in one call", r.chains);
        assert!(r.more, "the rest is left for the next call");
        let used = rig.used(QueueKind::Reporting);
        assert_eq!(used.len(), r.used.len(), "what was served is returned");
        served += used.len();
    }
    assert!(served >= 16);
}

/// Class 4, by work: 64 Ki-PFN requests on every head make one call cost seconds per
/// 100 heads with nothing returned until the end; a call serves about
/// MAX_PAGES_PER_CALL pages, returns them, and says there is more.
#[test]
fn one_call_serves_at_most_its_page_budget() {
    use zeronce_balloon::spec::limits::{MAX_PAGES_PER_CALL, MAX_PFNS_PER_REQUEST};
    let mem = mem_with_hole();
    let mut rig = Rig::new(
        &mem,
        BalloonOptions::default(),
        RecordingDiscarder::default(),
        &[],
        64,
    );
    let pfns: Vec<u32> = (0..MAX_PFNS_PER_REQUEST as u32)
        .map(|i| 0x200 + i % 256)
        .collect();
    let bufs = rig.inflate_bufs(&pfns, None);
    let n = 20;
    for _ in 0..n {
        rig.submit(QueueKind::Deflate, &bufs);
    }
    let per_call = (MAX_PAGES_PER_CALL as usize).div_ceil(MAX_PFNS_PER_REQUEST);
    assert!(per_call < n, "the test must exceed the budget");
    let r = rig.notify(QueueKind::Deflate);
    assert_eq!((r.chains, r.malformed, r.more), (per_call, 0, true));
    assert_eq!(
        rig.used(QueueKind::Deflate).len(),
        per_call,
        "returned at once"
    );
    let r = rig.notify(QueueKind::Deflate);
    assert_eq!((r.chains, r.more), (n - per_call, false));
    assert_eq!(rig.used(QueueKind::Deflate).len(), n - per_call);
}

/// Class 5: held reports with many blocks per chain (shared tails) were not counted
/// against the bound on held work: +114 MiB on a 32 768-entry queue.
#[test]
fn held_reports_count_against_the_one_bound() {
    let mem = mem_with_hole();
    let size = 4096u16;
    let mut rig = Rig::new(
        &mem,
        held(Duration::from_secs(60)),
        RecordingDiscarder::zeroing(),
        &[PageReporting],
        size,
    );
    let q = usize::from(rig.index(QueueKind::Reporting));
    // A shared tail of 63 one-page blocks (descriptors 0..63), and every other
    // descriptor a head chaining into it: 4033 chains of 64 blocks.
    for i in 0..63u16 {
        let gpa = 8 * MIB + 0x1000 * u64::from(i);
        let (flags, next) = if i < 62 {
            (DESC_F_WRITE | DESC_F_NEXT, i + 1)
        } else {
            (DESC_F_WRITE, 0)
        };
        rig.queues[q]
            .write_desc(&mem, i, gpa, 0x1000, flags, next)
            .unwrap();
    }
    for head in 63..size {
        let gpa = 9 * MIB;
        rig.queues[q]
            .write_desc(&mem, head, gpa, 0x1000, DESC_F_WRITE | DESC_F_NEXT, 0)
            .unwrap();
        rig.queues[q].publish(&mem, head).unwrap();
    }
    let r = rig.notify(QueueKind::Reporting);
    assert_eq!(r.malformed, 0);
    let per_chain = 64 * HELD_BYTES_PER_REPORTED_BLOCK;
    assert!(
        rig.dev.held_requests() * per_chain <= MAX_HELD_BYTES,
        "{} chains of 64 blocks held",
        rig.dev.held_requests()
    );
    assert_eq!(
        r.held + r.used.len(),
        usize::from(size) - 63,
        "the rest served"
    );
}

/// Class 7: `Hold(Duration::MAX)` ("never discard") must not panic on the first
/// report (`now + delay` overflows `Instant`).
#[test]
fn a_hold_past_the_clock_does_not_panic() {
    let mem = mem_with_hole();
    let mut rig = Rig::new(
        &mem,
        held(Duration::MAX),
        RecordingDiscarder::zeroing(),
        &[PageReporting],
        16,
    );
    rig.submit(QueueKind::Reporting, &[DriverBuf::write(8 * MIB, 0x1000)]);
    assert_eq!(rig.notify(QueueKind::Reporting).held, 1);
    let deadline = rig.dev.next_deadline().expect("held");
    assert!(deadline > rig.now + Duration::from_secs(100 * 365 * 86_400));
    assert_eq!(rig.dev.tick(&mem, rig.now).unwrap(), 0);
}

/// A `tracing` writer counting the lines written.
#[derive(Clone, Default)]
struct LineCount(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl std::io::Write for LineCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let lines = buf.iter().filter(|&&b| b == b'\n').count();
        self.0
            .fetch_add(lines, std::sync::atomic::Ordering::Relaxed);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Class 8: 100 000 malformed chains produced 112 500 WARN lines. Now the first few of
/// each class and then a line at each doubling; the counters stay exact.
#[test]
fn a_flood_of_malformed_chains_does_not_flood_the_log() {
    let lines = LineCount::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    let n = 8_000;
    tracing::subscriber::with_default(subscriber, || {
        let mem = mem_with_hole();
        let mut rig = Rig::mock(&mem, &[PageReporting]);
        for _ in 0..n / 8 {
            for _ in 0..8 {
                rig.submit(QueueKind::Reporting, &[DriverBuf::write(6 * MIB, 0x1000)]);
            }
            rig.notify(QueueKind::Reporting);
            rig.used(QueueKind::Reporting);
        }
        let m = rig.dev.metrics();
        assert_eq!(m.malformed_count(MalformedKind::OutOfGuestMemory), n);
    });
    let lines = lines.0.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        lines <= 10 + 13,
        "{lines} log lines for {n} malformed chains"
    );
}

/// Class 9: `prefault_on_deflate` made one madvise per PFN, duplicates not merged.
#[test]
fn deflate_prefaults_merged_runs() {
    let mem = mem_with_hole();
    let opts = BalloonOptions {
        prefault_on_deflate: true,
        ..BalloonOptions::default()
    };
    let mut rig = Rig::new(&mem, opts, RecordingDiscarder::zeroing(), &[], 16);
    // 512 PFNs: [0x300, 0x400) twice, shuffled, and the last page of region 0 plus the
    // first of region 1 (not contiguous in guest memory: two runs).
    let mut pfns: Vec<u32> = (0x300..0x400).chain((0x300..0x400).rev()).collect();
    pfns.extend([0x3ff, 0x800]);
    rig.write_pfns(DATA, &pfns);
    rig.roundtrip(
        QueueKind::Deflate,
        &[DriverBuf::read(DATA, 4 * pfns.len() as u32)],
    );
    assert_eq!(
        rig.dev.discarder().prefaults,
        vec![
            (GuestAddress(0x30_0000), 0x10_0000),
            (GuestAddress(8 * MIB), 0x1000)
        ]
    );
}
