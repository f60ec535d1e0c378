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

use crate::common::{BenchResult, Common};
use crate::progress::Progress;
use crate::stats::{time_it, Summary};
use crate::target::{verdict, Target};
use buddy_system_allocator::FrameAllocator;
use clap::Args;
use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;
use zeronce::ProcessMemory;
use zeronce_mm::{
    AllocRequest, FreeHint, MemoryManager, MmConfig, NoopZeroer, Order, PageRange, PcpCache, Pfn,
    PAGE_SIZE,
};

/// Arguments of `zeronce bench alloc`.
#[derive(Args, Debug)]
pub struct AllocArgs {
    /// `--quick` and `--json`.
    #[command(flatten)]
    pub common: Common,
    /// Repetitions of every case [default: 11; --quick: 7].
    #[arg(long, value_parser = crate::common::at_least_one)]
    pub repetitions: Option<usize>,
    /// Alloc+free pairs per thread per case and repetition [default: 1048576; --quick: 131072].
    #[arg(long, value_parser = crate::common::at_least_one)]
    pub pairs: Option<usize>,
    /// Blocks each thread allocates before freeing them, every case [default: 64 for
    /// orders 0 and 3, 8 for order 9]. A batch larger than a slot keeps (see the output)
    /// sends most frees and allocations past the kept blocks.
    #[arg(long, value_parser = crate::common::at_least_one)]
    pub batch: Option<usize>,
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
    /// Blocks allocated per iteration before freeing them.
    batch: usize,
}

impl Case {
    /// Orders 0, 3 and 9 on 1 and 2 threads, with `batch` blocks per iteration (default:
    /// 64 for orders 0 and 3, 8 for order 9); an error when the batches do not fit in the
    /// managed pages.
    fn all(batch: Option<usize>) -> Result<Vec<Case>, String> {
        let mut cases = Vec::new();
        for threads in [1, 2] {
            for order in [0u8, 3, 9] {
                let batch = batch.unwrap_or(if order <= 3 { 64 } else { 8 });
                let pages = (batch as u64)
                    .checked_mul(threads as u64)
                    .and_then(|n| n.checked_shl(u32::from(order)));
                if pages.is_none_or(|p| p > PAGES) {
                    return Err(format!(
                        "--batch {batch}: {threads} thread(s) of {batch} blocks of order {order} \
                         do not fit in the {PAGES} pages managed"
                    ));
                }
                cases.push(Case {
                    order,
                    threads,
                    batch,
                });
            }
        }
        Ok(cases)
    }

    fn key(self) -> String {
        format!("order{}_threads{}", self.order, self.threads)
    }
}

/// The allocators under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    /// What a user of the library gets: `ProcessMemory::alloc`, the block dropped to free
    /// it (the headline).
    FrontDoor,
    /// The bare manager behind a per-thread [`PcpCache`] the bench owns (no byte claims,
    /// no process-mode bookkeeping): the allocator's own speed.
    CacheOnly,
    /// The bare manager, every call under the zone lock.
    Manager,
    BuddySystemAllocator,
}

impl Which {
    const ALL: [Which; 4] = [
        Which::FrontDoor,
        Which::BuddySystemAllocator,
        Which::CacheOnly,
        Which::Manager,
    ];
}
/// Runs `iters` iterations of `case` on a fresh allocator; returns wall time.
fn measure(which: Which, case: Case, iters: usize) -> Result<Duration, String> {
    let order = Order::new(case.order).map_err(|e| e.to_string())?;
    let batch = case.batch;
    let barrier = Arc::new(Barrier::new(case.threads));
    let count = order.pages() as usize;
    let out_of_frames = || "buddy_system_allocator: out of frames".to_string();
    match which {
        Which::FrontDoor => {
            let pm = ProcessMemory::builder()
                .size((PAGES * PAGE_SIZE) as usize)
                .no_reporting()
                .build()
                .map_err(|e| e.to_string())?;
            run_threads(case.threads, &barrier, move |_| {
                churn(
                    &mut &pm,
                    iters,
                    batch,
                    |pm| pm.alloc(order),
                    |_, b| b.free(),
                )
            })
        }
        Which::CacheOnly => {
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
        Which::Manager => {
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

/// Per-case series, indexed like [`Which::ALL`]: pairs/s of each allocator and, for ours,
/// the per-repetition ratios against `buddy_system_allocator`.
#[derive(Default)]
struct Series {
    rate: [Vec<f64>; 4],
    ratio: [Vec<f64>; 4],
}

const BSA: usize = 1;

/// The target of a case's front-door ratio.
fn target(case: Case) -> Option<Target> {
    match case.order {
        0 => Some(Target::AtLeast(2.0)),
        9 => Some(Target::AtLeast(1.0)),
        _ => None,
    }
}

/// Runs every case `reps` times, the allocators of a case back to back (rotating start).
fn measure_all(
    cases: &[Case],
    reps: usize,
    pairs: usize,
    progress: &Progress,
) -> Result<Vec<Series>, String> {
    let mut series: Vec<Series> = cases.iter().map(|_| Series::default()).collect();
    for rep in 0..reps {
        for (case, s) in cases.iter().zip(series.iter_mut()) {
            let iters = (pairs / case.batch).max(1);
            let total = (iters * case.batch * case.threads) as f64;
            let mut rate = [0.0; 4];
            for k in 0..rate.len() {
                let i = (k + rep) % rate.len();
                rate[i] = total / measure(Which::ALL[i], *case, iters)?.as_secs_f64();
            }
            for i in 0..rate.len() {
                s.rate[i].push(rate[i]);
                s.ratio[i].push(rate[i] / rate[BSA]);
            }
        }
        progress.inc();
    }
    Ok(series)
}

/// Runs the benchmark.
pub fn run(args: &AllocArgs) -> BenchResult {
    let c = args.common;
    let reps = c.pick(args.repetitions, 7, 11);
    // Pairs per thread per run: full runs last ~0.05-0.3 s per case and allocator.
    let pairs = c.pick(args.pairs, 1 << 17, 1 << 20);
    let all = Case::all(args.batch)?;
    if !c.json {
        println!(
            "bench alloc{}: alloc+free pairs/s, {reps} repetitions of {pairs} pairs per thread \
             per case and allocator, {PAGES} pages managed; ratios are medians of the \
             per-repetition ratios against buddy_system_allocator",
            if c.quick { " (--quick)" } else { "" }
        );
    }
    let progress = Progress::new(c, "bench alloc", reps as u64);
    let series = measure_all(&all, reps, pairs, &progress)?;
    progress.finish();
    if c.json {
        print_json(c.quick, reps, pairs, &all, &series)
    } else {
        print_table(&all, &series)
    }
}

fn summary(v: &[f64]) -> Result<Summary, &'static str> {
    Summary::of(v).ok_or("no samples")
}

fn print_json(
    quick: bool,
    reps: usize,
    pairs: usize,
    all: &[Case],
    series: &[Series],
) -> BenchResult {
    let mut out = Map::new();
    out.insert("bench".into(), json!("alloc"));
    out.insert("quick".into(), json!(quick));
    out.insert("repetitions".into(), json!(reps));
    out.insert("pages_managed".into(), json!(PAGES));
    out.insert("pairs_per_thread_per_run".into(), json!(pairs));
    out.insert(
        "method".into(),
        json!(format!("alloc a batch of blocks then free them; pairs/s from wall time, all threads together; ratio = median of per-repetition ours/theirs. front_door: ProcessMemory::alloc + PageBlock::free (what a library user gets: {KEPT_NOTE}); cache_only: MemoryManager behind a PcpCache the bench owns; manager: MemoryManager directly; buddy_system_allocator FrameAllocator<11> unlocked for 1 thread, in a std Mutex for 2")),
    );
    let mut cases = Vec::new();
    for (case, s) in all.iter().zip(series) {
        let ratio = summary(&s.ratio[0])?;
        if case.threads == 1 && case.order == 0 {
            out.insert(
                "ratio_vs_buddy_system_allocator_order0".into(),
                json!(ratio.median),
            );
        }
        out.insert(
            format!("ratio_vs_buddy_system_allocator_{}", case.key()),
            json!(ratio.median),
        );
        let mut row = json!({
            "order": case.order, "threads": case.threads, "batch": case.batch,
            "front_door_pairs_per_s": summary(&s.rate[0])?.to_json(),
            "buddy_system_allocator_pairs_per_s": summary(&s.rate[BSA])?.to_json(),
            "cache_only_pairs_per_s": summary(&s.rate[2])?.to_json(),
            "manager_pairs_per_s": summary(&s.rate[3])?.to_json(),
            "ratio_front_door": ratio.to_json(),
            "ratio_cache_only": summary(&s.ratio[2])?.to_json(),
            "ratio_manager": summary(&s.ratio[3])?.to_json(),
        });
        if let Some(t) = target(*case) {
            row["target"] = t.to_json(ratio.median);
        }
        cases.push(row);
    }
    out.insert("cases".into(), Value::Array(cases));
    println!("{}", Value::Object(out));
    Ok(())
}

fn print_table(all: &[Case], series: &[Series]) -> BenchResult {
    let mut table = Vec::new();
    for (case, s) in all.iter().zip(series) {
        let ratio = summary(&s.ratio[0])?;
        table.push(format!(
            "{:>5} {:>7} {:>5} {:>11.2} {:>8.2} {:>6.2} {:>5.2}-{:<5.2} {:<22} {:>10.2} {:>8.2}",
            case.order,
            case.threads,
            case.batch,
            summary(&s.rate[0])?.median / 1e6,
            summary(&s.rate[BSA])?.median / 1e6,
            ratio.median,
            ratio.min,
            ratio.max,
            verdict(target(*case), ratio.median),
            summary(&s.ratio[2])?.median,
            summary(&s.ratio[3])?.median,
        ));
    }
    println!(
        "{:>5} {:>7} {:>5} {:>11} {:>8} {:>6} {:>11} {:<22} {:>10} {:>8}",
        "order",
        "threads",
        "batch",
        "ours M/s",
        "bsa M/s",
        "ratio",
        "min-max",
        "",
        "cache-only",
        "manager"
    );
    for line in table {
        println!("{line}");
    }
    println!(
        "ours = ProcessMemory::alloc + free, what a library user gets ({KEPT_NOTE}); \
         cache-only and manager: the bare allocator (behind a per-thread cache the bench owns, \
         or every call under the zone lock); M/s = million alloc+free pairs a second, all \
         threads together; ratios against buddy_system_allocator in the same repetitions"
    );
    Ok(())
}

/// What the front door's figures go through, for the output.
const KEPT_NOTE: &str = "a block freed dirty is kept for the next allocation of its order on \
     the thread's slot, up to one cache batch of pages per order up to 3 (here 128 order-0 or \
     16 order-3 blocks) and 16 MiB of 2 MiB blocks (8), growing while allocations find none \
     kept up to an eighth of the memory over the slots (here 1 GiB / 8 / CPUs: 32 blocks on \
     2 CPUs), so a batch within that never reaches the allocator and order 3's batch of 64 \
     mostly does; --batch changes the batch";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allocator_runs_every_case() {
        for case in Case::all(None).unwrap() {
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
