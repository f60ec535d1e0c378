//! `zeronce bench alloc`: alloc+free pairs per second of the zeronce buddy allocator
//! ([`zeronce_mm::MemoryManager`]) against `buddy_system_allocator`'s `FrameAllocator`
//! (same max order, 10), in the same run.
//!
//! Each case is (order, threads). One iteration of a thread allocates a batch of blocks of
//! that order, then frees them all (so every iteration splits big blocks and merges them
//! back). Requests are not zero-requests and the zeroer is a no-op: this measures the
//! allocator, not memset. Two threads share one allocator: ours as is (a mutex per zone,
//! one zone here), theirs in a `std::sync::Mutex` as a user would wrap it; one thread
//! uses theirs without any lock (what a single-threaded user would do) while ours still
//! takes its lock.
//!
//! Every repetition runs every case with both allocators back to back (the first one
//! alternates), so they share the machine's noise; the ratio of a case is the median of
//! the per-repetition ratios (ours / theirs). Throughput is from wall-clock time.

use super::stats::{time_it, Summary};
use super::{BenchResult, Common};
use buddy_system_allocator::FrameAllocator;
use clap::Args;
use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;
use zeronce_mm::{
    AllocRequest, Block, FreeHint, MemoryManager, MmConfig, NoopZeroer, Order, PageRange, Pfn,
};

/// Arguments of `zeronce bench alloc`.
#[derive(Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub common: Common,
}

/// Pages managed by each allocator: 1 GiB of 4 KiB frames (no real memory behind them).
const PAGES: u64 = 1 << 18;
/// `buddy_system_allocator`'s size classes: `ORDER` = 11 means orders 0..=10, like ours.
type Theirs = FrameAllocator<11>;

/// One measured case.
#[derive(Clone, Copy, Debug)]
struct Case {
    order: u8,
    threads: usize,
}

impl Case {
    const ALL: [Case; 6] = [
        Case { order: 0, threads: 1 },
        Case { order: 3, threads: 1 },
        Case { order: 9, threads: 1 },
        Case { order: 0, threads: 2 },
        Case { order: 3, threads: 2 },
        Case { order: 9, threads: 2 },
    ];

    /// Blocks allocated per iteration before freeing them.
    fn batch(self) -> usize {
        match self.order {
            0..=3 => 64,
            _ => 8,
        }
    }

    fn key(self) -> String {
        format!("order{}_threads{}", self.order, self.threads)
    }
}

/// The two allocators under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Zeronce,
    BuddySystemAllocator,
}

/// Runs `iters` iterations of `case` on a fresh allocator; returns wall time.
fn measure(which: Which, case: Case, iters: usize) -> Result<Duration, String> {
    let order = Order::new(case.order).map_err(|e| e.to_string())?;
    let batch = case.batch();
    let barrier = Arc::new(Barrier::new(case.threads));
    match which {
        Which::Zeronce => {
            let cfg = MmConfig::new(vec![PageRange::new(Pfn(0), PAGES)]);
            let mm = Arc::new(MemoryManager::new(cfg, Arc::new(NoopZeroer)).map_err(|e| e.to_string())?);
            run_threads(case.threads, &barrier, move |_| {
                let mut blocks: Vec<Block> = Vec::with_capacity(batch);
                for _ in 0..iters {
                    for _ in 0..batch {
                        let a = mm.alloc(order, AllocRequest::DIRTY).map_err(|e| e.to_string())?;
                        blocks.push(a.block);
                    }
                    for b in blocks.drain(..) {
                        mm.free(black_box(b), FreeHint::Dirty).map_err(|e| e.to_string())?;
                    }
                }
                Ok(())
            })
        }
        Which::BuddySystemAllocator if case.threads == 1 => {
            let mut fa = Theirs::new();
            fa.add_frame(0, PAGES as usize);
            let mut blocks: Vec<usize> = Vec::with_capacity(batch);
            let count = order.pages() as usize;
            let (sample, res) = time_it(|| {
                for _ in 0..iters {
                    for _ in 0..batch {
                        blocks.push(fa.alloc(count).ok_or("buddy_system_allocator: out of frames")?);
                    }
                    for b in blocks.drain(..) {
                        fa.dealloc(black_box(b), count);
                    }
                }
                Ok::<(), String>(())
            });
            res.map(|()| sample.wall)
        }
        Which::BuddySystemAllocator => {
            let mut fa = Theirs::new();
            fa.add_frame(0, PAGES as usize);
            let fa = Arc::new(Mutex::new(fa));
            run_threads(case.threads, &barrier, move |_| {
                let mut blocks: Vec<usize> = Vec::with_capacity(batch);
                let count = order.pages() as usize;
                let lock = || fa.lock().map_err(|_| "poisoned".to_string());
                for _ in 0..iters {
                    for _ in 0..batch {
                        let b = lock()?.alloc(count);
                        blocks.push(b.ok_or("buddy_system_allocator: out of frames")?);
                    }
                    for b in blocks.drain(..) {
                        lock()?.dealloc(black_box(b), count);
                    }
                }
                Ok(())
            })
        }
    }
}

/// Runs `body` on `threads` threads released together by `barrier`; wall time from the
/// release to the last thread's end (measured on the first thread, which also joins).
fn run_threads<F>(threads: usize, barrier: &Arc<Barrier>, body: F) -> Result<Duration, String>
where
    F: FnMut(usize) -> Result<(), String> + Clone + Send + 'static,
{
    let helpers: Vec<_> = (1..threads)
        .map(|t| {
            let (b, mut f) = (barrier.clone(), body.clone());
            std::thread::spawn(move || {
                b.wait();
                f(t)
            })
        })
        .collect();
    let mut body = body;
    let (sample, result) = time_it(|| {
        barrier.wait();
        let mine = body(0);
        let others: Vec<_> = helpers.into_iter().map(|h| h.join()).collect();
        (mine, others)
    });
    result.0?;
    for r in result.1 {
        r.map_err(|_| "bench thread panicked".to_string())??;
    }
    Ok(sample.wall)
}

/// Per-case series: pairs/s of each allocator and the per-repetition ratio.
#[derive(Default)]
struct Series {
    ours: Vec<f64>,
    theirs: Vec<f64>,
    ratio: Vec<f64>,
}

/// Runs the benchmark.
pub fn run(args: &AllocArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let reps = if quick { 7 } else { 11 };
    // Pairs per thread per run: full runs last ~0.05-0.3 s per case and allocator.
    let pairs = if quick { 1 << 16 } else { 1 << 20 };
    let mut series: Vec<Series> = Case::ALL.iter().map(|_| Series::default()).collect();
    for rep in 0..reps {
        for (case, s) in Case::ALL.iter().zip(series.iter_mut()) {
            let iters = (pairs / case.batch()).max(1);
            let total = (iters * case.batch() * case.threads) as f64;
            let order = if rep % 2 == 0 {
                [Which::Zeronce, Which::BuddySystemAllocator]
            } else {
                [Which::BuddySystemAllocator, Which::Zeronce]
            };
            let mut rate = [0.0; 2];
            for which in order {
                let t = measure(which, *case, iters)?;
                rate[(which == Which::BuddySystemAllocator) as usize] = total / t.as_secs_f64();
            }
            s.ours.push(rate[0]);
            s.theirs.push(rate[1]);
            s.ratio.push(rate[0] / rate[1]);
        }
    }
    let summary = |v: &[f64]| Summary::of(v).ok_or("no samples");
    let mut out = Map::new();
    out.insert("bench".into(), json!("alloc"));
    out.insert("quick".into(), json!(quick));
    out.insert("repetitions".into(), json!(reps));
    out.insert("pages_managed".into(), json!(PAGES));
    out.insert("pairs_per_thread_per_run".into(), json!(pairs));
    out.insert(
        "method".into(),
        json!("alloc a batch of blocks then free them; pairs/s from wall time; ratio = median of per-repetition ours/theirs; buddy_system_allocator FrameAllocator<11> unlocked for 1 thread, in std Mutex for 2"),
    );
    let mut cases = Vec::new();
    let mut rows = Vec::new();
    for (case, s) in Case::ALL.iter().zip(&series) {
        let (ours, theirs, ratio) = (summary(&s.ours)?, summary(&s.theirs)?, summary(&s.ratio)?);
        out.insert(format!("ratio_vs_buddy_system_allocator_{}", case.key()), json!(ratio.median));
        if case.threads == 1 && case.order == 0 {
            out.insert("ratio_vs_buddy_system_allocator_order0".into(), json!(ratio.median));
        }
        cases.push(json!({
            "order": case.order, "threads": case.threads, "batch": case.batch(),
            "zeronce_pairs_per_s": ours.to_json(),
            "buddy_system_allocator_pairs_per_s": theirs.to_json(),
            "ratio": ratio.to_json(),
        }));
        rows.push((*case, ours.median, theirs.median, ratio));
    }
    out.insert("cases".into(), Value::Array(cases));
    if json {
        println!("{}", Value::Object(out));
        return Ok(());
    }
    if quick {
        println!("(--quick: {reps} repetitions of {pairs} pairs per thread; full runs use 2^20 pairs and 11 repetitions)");
    }
    println!("alloc+free pairs/s, medians of {reps} repetitions, {PAGES} pages managed");
    println!(
        "{:>5} {:>7} {:>5} {:>14} {:>14} {:>7} {:>13}",
        "order", "threads", "batch", "zeronce M/s", "bsa M/s", "ratio", "ratio min-max"
    );
    for (case, ours, theirs, ratio) in rows {
        println!(
            "{:>5} {:>7} {:>5} {:>14.2} {:>14.2} {:>7.2} {:>6.2}-{:<6.2}",
            case.order,
            case.threads,
            case.batch(),
            ours / 1e6,
            theirs / 1e6,
            ratio.median,
            ratio.min,
            ratio.max
        );
    }
    Ok(())
}
