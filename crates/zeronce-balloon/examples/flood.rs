//! What one notification of a hostile guest costs the device: for a flood of each kind,
//! the time of the one `process_queue` call and the growth of this process's resident
//! memory (VmRSS) across it. The figures in RELIABILITY.md come from
//! `cargo run --release -p zeronce-balloon --example flood` (a debug build gives the
//! same bounds, slower). Arguments: a substring of the rows to run, and the queue size
//! of the reporting floods (default 32768).

use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use zeronce_balloon::guest_ring::{
    DriverBuf, DriverQueue, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE,
};
use zeronce_balloon::mock::RecordingInterrupt;
use zeronce_balloon::{
    Backing, BalloonDevice, BalloonOptions, DiscardError, DiscardOp, DiscardPolicy, Discarder,
    Feature, FeatureSet, QueueKind,
};

const MIB: u64 = 1 << 20;
/// Where buffers start; the rings of the four queues sit below.
const DATA: u64 = 16 * MIB;

/// Discards nothing and records nothing (so the figures are the device's own).
struct Noop;

impl<M: GuestMemoryBackend + ?Sized> Discarder<M> for Noop {
    fn backing(&mut self, _: &M, _: GuestAddress) -> Result<Backing, DiscardError> {
        Ok(Backing::PrivateAnonymous)
    }
    fn discard(
        &mut self,
        _: &M,
        _: GuestAddress,
        _: u64,
        _: DiscardOp,
        _: Backing,
    ) -> Result<(), DiscardError> {
        Ok(())
    }
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A device with inflate, deflate, statistics and reporting queues of `size`, and its
/// rings.
fn setup(
    mem: &GuestMemoryMmap,
    size: u16,
    policy: DiscardPolicy,
) -> (
    BalloonDevice<Noop, std::sync::Arc<RecordingInterrupt>>,
    Vec<DriverQueue>,
) {
    let options = BalloonOptions {
        policy,
        ..BalloonOptions::default()
    };
    let mut dev = BalloonDevice::new(options, Noop, Default::default());
    let fs: FeatureSet = [Feature::Version1, Feature::StatsVq, Feature::PageReporting]
        .into_iter()
        .collect();
    let neg = dev.ack_features(fs).expect("features");
    let queues: Vec<DriverQueue> = (0..neg.layout().len())
        .map(|i| DriverQueue::new(mem, GuestAddress(4 * MIB * i as u64), size).expect("rings"))
        .collect();
    dev.activate(queues.iter().map(DriverQueue::device_queue).collect())
        .expect("activate");
    (dev, queues)
}

/// Runs one notification of `kind` after `fill` published the flood; prints a row.
fn measure(
    name: &str,
    size: u16,
    policy: DiscardPolicy,
    kind: QueueKind,
    fill: impl FnOnce(&GuestMemoryMmap, &mut DriverQueue),
) {
    if std::env::args().nth(1).is_some_and(|f| !name.contains(&f)) {
        return;
    }
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), (64 * MIB) as usize)])
        .expect("guest memory");
    let (mut dev, mut queues) = setup(&mem, size, policy);
    let index = dev.layout().and_then(|l| l.index(kind)).expect("queue");
    fill(&mem, &mut queues[usize::from(index)]);
    let before = rss_kib();
    let t = Instant::now();
    let r = dev
        .process_queue_at(&mem, index, Instant::now())
        .expect("served");
    let took = t.elapsed();
    let grown = rss_kib().saturating_sub(before);
    println!(
        "| {name} | {size} | {} | {} | {} | {:.1} ms | {:+} KiB | {} KiB |",
        r.chains,
        r.malformed,
        r.held,
        took.as_secs_f64() * 1e3,
        grown,
        dev.held_bytes() / 1024
    );
}

/// Writes at `DATA` one 256 KiB PFN array: 64 Ki scattered PFNs (every other page of
/// 32 MiB, each 16 times), the most one inflate request may carry.
fn write_pfn_array(m: &GuestMemoryMmap) {
    let pfns: Vec<u8> = (0..64 * 1024u32)
        .flat_map(|i| ((DATA >> 12) as u32 + (i % 4096) * 2).to_le_bytes())
        .collect();
    m.write_slice(&pfns, GuestAddress(DATA)).unwrap();
}

fn main() {
    let hold = DiscardPolicy::Hold(Duration::from_secs(3600));
    let now = DiscardPolicy::Immediate;
    println!("| flood | queue size | chains | malformed | held | time of the call | RSS growth | held work |");
    println!("|---|---|---|---|---|---|---|---|");
    let big: u16 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(32768);
    measure(
        "invalid heads (0xffff)",
        big,
        now,
        QueueKind::Reporting,
        |m, q| {
            for _ in 0..big {
                q.publish(m, 0xffff).unwrap();
            }
        },
    );
    measure(
        "reports in a hole (malformed)",
        big,
        now,
        QueueKind::Reporting,
        |m, q| {
            for _ in 0..big {
                q.add_chain(m, &[DriverBuf::write(80 * MIB, 0x1000)])
                    .unwrap();
            }
        },
    );
    measure(
        "indirect descriptors (malformed)",
        big,
        now,
        QueueKind::Reporting,
        |m, q| {
            for head in 0..q.size() {
                q.write_desc(m, head, DATA, 0x1000, DESC_F_INDIRECT, 0)
                    .unwrap();
                q.publish(m, head).unwrap();
            }
        },
    );
    measure(
        "statistics buffers (each returns the last)",
        big,
        now,
        QueueKind::Stats,
        |m, q| {
            for _ in 0..big {
                q.add_chain(m, &[DriverBuf::read(DATA, 10)]).unwrap();
            }
        },
    );
    let shared_tail = |m: &GuestMemoryMmap, q: &mut DriverQueue| {
        for i in 0..63u16 {
            let gpa = DATA + 0x1000 * u64::from(i);
            let (flags, next) = if i < 62 {
                (DESC_F_WRITE | DESC_F_NEXT, i + 1)
            } else {
                (DESC_F_WRITE, 0)
            };
            q.write_desc(m, i, gpa, 0x1000, flags, next).unwrap();
        }
        for head in 63..q.size() {
            q.write_desc(
                m,
                head,
                DATA + 0x100_0000,
                0x1000,
                DESC_F_WRITE | DESC_F_NEXT,
                0,
            )
            .unwrap();
            q.publish(m, head).unwrap();
        }
    };
    measure(
        "64-block reports, shared tail",
        big,
        now,
        QueueKind::Reporting,
        shared_tail,
    );
    measure(
        "64-block reports, shared tail, held",
        big,
        hold,
        QueueKind::Reporting,
        shared_tail,
    );
    let inflate_size = 256u16;
    let full_inflate = |m: &GuestMemoryMmap, q: &mut DriverQueue| {
        // One array, published on every head.
        write_pfn_array(m);
        q.write_desc(m, 0, DATA, 4 * 64 * 1024, 0, 0).unwrap();
        for _ in 0..inflate_size {
            q.publish(m, 0).unwrap();
        }
    };
    measure(
        "64 Ki-PFN inflates, one head republished",
        inflate_size,
        now,
        QueueKind::Inflate,
        full_inflate,
    );
    measure(
        "one 64 Ki-PFN inflate",
        inflate_size,
        now,
        QueueKind::Inflate,
        |m, q| {
            write_pfn_array(m);
            q.write_desc(m, 0, DATA, 4 * 64 * 1024, 0, 0).unwrap();
            q.publish(m, 0).unwrap();
        },
    );
    let distinct_inflates = |m: &GuestMemoryMmap, q: &mut DriverQueue| {
        write_pfn_array(m);
        for head in 0..inflate_size {
            q.write_desc(m, head, DATA, 4 * 64 * 1024, 0, 0).unwrap();
            q.publish(m, head).unwrap();
        }
    };
    measure(
        "64 Ki-PFN inflates, every head",
        inflate_size,
        now,
        QueueKind::Inflate,
        distinct_inflates,
    );
    measure(
        "64 Ki-PFN inflates, every head, held",
        inflate_size,
        hold,
        QueueKind::Inflate,
        distinct_inflates,
    );
    measure(
        "64 Ki-PFN deflates, every head",
        inflate_size,
        now,
        QueueKind::Deflate,
        distinct_inflates,
    );
}
