//! `zeronce bench alloc`: alloc+free pairs per second of the zeronce buddy allocator
//! ([`zeronce_mm::MemoryManager`]) against `buddy_system_allocator`'s `FrameAllocator`
//! (same max order, 10), in the same run.
//!
//! Each case is (order, threads). One iteration of a thread allocates a batch of blocks of
//! that order, then frees them all (so every iteration splits big blocks and merges them
//! back). Requests are not zero-requests and the zeroer is a no-op: this measures the
//! allocator, not memset. Two threads share one allocator: ours as is (one zone behind a
//! mutex, each thread with its own [`PcpCache`], the per-thread fast path for orders <= 3,
//! as Linux's per-CPU lists), theirs in a `std::sync::Mutex` as a user would wrap it; one
//! thread uses theirs without any lock (what a single-threaded user would do). Ours is
//! also measured without the cache (every call takes the zone lock) for reference.
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
    AllocRequest, FreeHint, MemoryManager, MmConfig, NoopZeroer, Order, PageRange, PcpCache, Pfn,
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
        Case {
            order: 0,
            threads: 1,
        },
        Case {
            order: 3,
            threads: 1,
        },
        Case {
            order: 9,
            threads: 1,
        },
        Case {
            order: 0,
            threads: 2,
        },
        Case {
            order: 3,
            threads: 2,
        },
        Case {
            order: 9,
            threads: 2,
        },
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
    ZeronceNoCache,
    BuddySystemAllocator,
}

impl Which {
    const ALL: [Which; 3] = [
        Which::Zeronce,
        Which::BuddySystemAllocator,
        Which::ZeronceNoCache,
    ];
}

/// Runs `iters` iterations of `case` on a fresh allocator; returns wall time.
fn measure(which: Which, case: Case, iters: usize) -> Result<Duration, String> {
    let order = Order::new(case.order).map_err(|e| e.to_string())?;
    let batch = case.batch();
    let barrier = Arc::new(Barrier::new(case.threads));
    let count = order.pages() as usize;
    let out_of_frames = || "buddy_system_allocator: out of frames".to_string();
    match which {
        Which::Zeronce => {
            let mm = Arc::new(manager()?);
            run_threads(case.threads, &barrier, move |_| {
                let mut cache = PcpCache::new(mm.clone());
                churn(
                    &mut cache,
                    iters,
                    batch,
                    |c| c.alloc(order, AllocRequest::DIRTY).map(|a| a.block),
                    |c, b| c.free(b, FreeHint::Dirty),
                )
            })
        }
        Which::ZeronceNoCache => {
            let mm = Arc::new(manager()?);
            run_threads(case.threads, &barrier, move |_| {
                churn(
                    &mut &*mm,
                    iters,
                    batch,
                    |m| m.alloc(order, AllocRequest::DIRTY).map(|a| a.block),
                    |m, b| m.free(b, FreeHint::Dirty),
                )
            })
        }
        Which::BuddySystemAllocator if case.threads == 1 => {
            let mut fa = Theirs::new();
            fa.add_frame(0, PAGES as usize);
            let (sample, res) = time_it(|| {
                churn(
                    &mut fa,
                    iters,
                    batch,
                    |fa| fa.alloc(count).ok_or_else(out_of_frames),
                    |fa, b| {
                        fa.dealloc(b, count);
                        Ok::<(), String>(())
                    },
                )
            });
            res.map(|()| sample.wall)
        }
        Which::BuddySystemAllocator => {
            let mut fa = Theirs::new();
            fa.add_frame(0, PAGES as usize);
            let fa = Arc::new(Mutex::new(fa));
            run_threads(case.threads, &barrier, move |_| {
                let poisoned = |_| "poisoned".to_string();
                churn(
                    &mut &*fa,
                    iters,
                    batch,
                    |fa| {
                        fa.lock()
                            .map_err(poisoned)?
                            .alloc(count)
                            .ok_or_else(out_of_frames)
                    },
                    |fa, b| {
                        fa.lock().map_err(poisoned)?.dealloc(b, count);
                        Ok::<(), String>(())
                    },
                )
            })
        }
    }
}

/// The measured loop: `iters` times, allocate `batch` blocks from `s`, then free them all
/// (most recent last, like a batch of short-lived buffers).
fn churn<S, B, E: ToString, F: ToString>(
    s: &mut S,
    iters: usize,
    batch: usize,
    alloc: impl Fn(&mut S) -> Result<B, E>,
    free: impl Fn(&mut S, B) -> Result<(), F>,
) -> Result<(), String> {
    let mut blocks = Vec::with_capacity(batch);
    for _ in 0..iters {
        for _ in 0..batch {
            blocks.push(alloc(s).map_err(|e| e.to_string())?);
        }
        for b in blocks.drain(..) {
            free(s, black_box(b)).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Our allocator over [`PAGES`] pages, default configuration (max order 10).
fn manager() -> Result<MemoryManager, String> {
    let cfg = MmConfig::new(vec![PageRange::new(Pfn(0), PAGES)]);
    MemoryManager::new(cfg, Arc::new(NoopZeroer)).map_err(|e| e.to_string())
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

/// Per-case series: pairs/s of each allocator and the per-repetition ratios.
#[derive(Default)]
struct Series {
    ours: Vec<f64>,
    theirs: Vec<f64>,
    nocache: Vec<f64>,
    ratio: Vec<f64>,
    ratio_nocache: Vec<f64>,
}

/// Runs the benchmark.
pub fn run(args: &AllocArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let reps = if quick { 7 } else { 11 };
    // Pairs per thread per run: full runs last ~0.05-0.3 s per case and allocator.
    let pairs = if quick { 1 << 17 } else { 1 << 20 };
    let mut series: Vec<Series> = Case::ALL.iter().map(|_| Series::default()).collect();
    for rep in 0..reps {
        for (case, s) in Case::ALL.iter().zip(series.iter_mut()) {
            let iters = (pairs / case.batch()).max(1);
            let total = (iters * case.batch() * case.threads) as f64;
            // Rotate which allocator goes first.
            let mut rate = [0.0; 3];
            for k in 0..3 {
                let i = (k + rep) % 3;
                let t = measure(Which::ALL[i], *case, iters)?;
                rate[i] = total / t.as_secs_f64();
            }
            s.ours.push(rate[0]);
            s.theirs.push(rate[1]);
            s.nocache.push(rate[2]);
            s.ratio.push(rate[0] / rate[1]);
            s.ratio_nocache.push(rate[2] / rate[1]);
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
        json!("alloc a batch of blocks then free them; pairs/s from wall time; ratio = median of per-repetition ours/theirs; ours through a per-thread PcpCache (nocache: MemoryManager directly); buddy_system_allocator FrameAllocator<11> unlocked for 1 thread, in std Mutex for 2"),
    );
    let mut cases = Vec::new();
    let mut rows = Vec::new();
    for (case, s) in Case::ALL.iter().zip(&series) {
        let (ours, theirs, ratio) = (summary(&s.ours)?, summary(&s.theirs)?, summary(&s.ratio)?);
        let (nocache, ratio_nocache) = (summary(&s.nocache)?, summary(&s.ratio_nocache)?);
        out.insert(
            format!("ratio_vs_buddy_system_allocator_{}", case.key()),
            json!(ratio.median),
        );
        out.insert(
            format!("ratio_nocache_vs_buddy_system_allocator_{}", case.key()),
            json!(ratio_nocache.median),
        );
        if case.threads == 1 && case.order == 0 {
            out.insert(
                "ratio_vs_buddy_system_allocator_order0".into(),
                json!(ratio.median),
            );
        }
        cases.push(json!({
            "order": case.order, "threads": case.threads, "batch": case.batch(),
            "zeronce_pairs_per_s": ours.to_json(),
            "buddy_system_allocator_pairs_per_s": theirs.to_json(),
            "zeronce_nocache_pairs_per_s": nocache.to_json(),
            "ratio": ratio.to_json(),
            "ratio_nocache": ratio_nocache.to_json(),
        }));
        rows.push((
            *case,
            ours.median,
            theirs.median,
            ratio,
            ratio_nocache.median,
        ));
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
        "{:>5} {:>7} {:>5} {:>14} {:>14} {:>7} {:>13} {:>14}",
        "order",
        "threads",
        "batch",
        "zeronce M/s",
        "bsa M/s",
        "ratio",
        "ratio min-max",
        "no-cache ratio"
    );
    for (case, ours, theirs, ratio, nocache) in rows {
        println!(
            "{:>5} {:>7} {:>5} {:>14.2} {:>14.2} {:>7.2} {:>6.2}-{:<6.2} {:>14.2}",
            case.order,
            case.threads,
            case.batch(),
            ours / 1e6,
            theirs / 1e6,
            ratio.median,
            ratio.min,
            ratio.max,
            nocache
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allocator_runs_every_case() {
        for case in Case::ALL {
            for which in Which::ALL {
                let t = measure(which, case, 3);
                assert!(t.is_ok(), "{which:?} {case:?}: {t:?}");
            }
        }
    }

    #[test]
    fn churn_reports_the_first_error() {
        let mut n = 0;
        let r = churn(
            &mut n,
            10,
            4,
            |n| {
                *n += 1;
                if *n == 7 {
                    Err("full")
                } else {
                    Ok(*n)
                }
            },
            |_, _| Ok::<(), &str>(()),
        );
        assert_eq!(r, Err("full".to_string()));
        assert_eq!(n, 7);
    }
}
