//! `zeronce bench prezero`: the 003 seed's scenario scaled to this machine. A pool of
//! 512 × 2 MiB pages (1 GiB) is written and freed (all dirty); then every page is
//! allocated *zeroed* and touched once per 4 KiB, like a VM faulting its RAM in:
//!
//! * `inline`: the pool was not pre-zeroed, the allocation path zeroes every page;
//! * `prezeroed`: `prezero(all)` ran beforehand on a background thread (its cost is
//!   measured too, as GB/s, so nothing is hidden), the allocation path zeroes nothing.
//!
//! Modes alternate per run (order rotates); each timed allocation starts the same
//! `--gap-ms` after its memory was last written (dirtied or pre-zeroed), so cache and
//! host-reclaim state is alike. Thread CPU time and wall time of the allocation step,
//! medians over the runs. Hugetlb 2 MiB pages too when enough are reserved.

use super::stats::{time_it, Sample, Summary};
use super::{BenchResult, Common};
use clap::Args;
use serde_json::{json, Map, Value};
use std::time::Duration;
use zeronce::zeronce_mem::{BackingKind, HugePagePool as KernelPool, HugePageSize};
use zeronce::{CancelToken, HugePagePool, PoolPage, PrezeroError};

/// Arguments of `zeronce bench prezero`.
#[derive(Args, Debug)]
pub struct PrezeroArgs {
    #[command(flatten)]
    pub common: Common,
    /// Runs per mode (medians; at least 7 for the record).
    #[arg(long, default_value_t = 9)]
    pub runs: usize,
    /// 2 MiB pages in the pool.
    #[arg(long, default_value_t = 512)]
    pub pages: u64,
    /// Time between the last write of the memory and the timed allocation, both modes.
    #[arg(long, default_value_t = 200)]
    pub gap_ms: u64,
}

/// The seed's figures: 64 × 1 GiB hugetlb pages faulted in ~16 s without pre-zeroing,
/// "negligible" with.
const SEED: &str = "003 seed (Skylake, 64 x 1 GiB hugetlb): ~16 s (~250 ms/page) without pre-zeroing, negligible with";

/// One run of both modes.
#[derive(Default)]
struct Series {
    /// `[inline, prezeroed]`: allocation step (alloc + touch), allocation alone, touch alone.
    alloc_touch: [Vec<Sample>; 2],
    alloc_only: [Vec<Sample>; 2],
    /// The pre-zeroing pass of the `prezeroed` mode (background thread).
    prezero: Vec<Sample>,
    prezero_bytes: u64,
    /// Pages the allocation path had to zero, per mode (should be all / none).
    zeroed_inline: [Vec<u64>; 2],
}

const MODES: [&str; 2] = ["inline", "prezeroed"];

/// Allocates every page, writes all of it, frees it: the pool is all dirty.
fn dirty_all(pool: &HugePagePool, pages: u64) -> Result<(), PrezeroError> {
    let all: Vec<PoolPage> = (0..pages)
        .map(|_| pool.alloc(false))
        .collect::<Result<_, _>>()?;
    for mut page in all {
        page.as_mut_slice().fill(0x5A);
        page.free()?;
    }
    Ok(())
}

/// The timed step: allocate every page zeroed, then touch one byte per 4 KiB.
fn alloc_step(
    pool: &HugePagePool,
    pages: u64,
    s: &mut Series,
    mode: usize,
) -> Result<(), PrezeroError> {
    let inline0 = pool.counters().allocs_zeroed_inline;
    let (t_alloc, all) = time_it(|| {
        (0..pages)
            .map(|_| pool.alloc(true))
            .collect::<Result<Vec<_>, _>>()
    });
    let mut all = all?;
    let (t_touch, ()) = time_it(|| all.iter_mut().for_each(|p| p.touch(4096)));
    s.alloc_only[mode].push(t_alloc);
    s.alloc_touch[mode].push(Sample {
        wall: t_alloc.wall + t_touch.wall,
        cpu: t_alloc.cpu + t_touch.cpu,
    });
    s.zeroed_inline[mode].push(pool.counters().allocs_zeroed_inline - inline0);
    drop(all);
    Ok(())
}

fn measure(
    pool: &HugePagePool,
    pages: u64,
    runs: usize,
    gap: Duration,
) -> Result<Series, PrezeroError> {
    let mut s = Series::default();
    for run in 0..runs {
        for k in 0..2 {
            let mode = (run + k) % 2;
            dirty_all(pool, pages)?;
            if mode == 1 {
                // The background pre-zeroer: another thread, timed on its own clock.
                let (t, report) = std::thread::scope(|sc| {
                    sc.spawn(|| time_it(|| pool.prezero(u64::MAX, &CancelToken::new())))
                        .join()
                        .expect("prezero thread")
                });
                s.prezero.push(t);
                s.prezero_bytes = report.bytes;
            }
            std::thread::sleep(gap);
            alloc_step(pool, pages, &mut s, mode)?;
        }
    }
    Ok(s)
}

fn ms(samples: &[Sample], cpu: bool) -> Summary {
    let v: Vec<f64> = samples
        .iter()
        .map(|x| if cpu { x.cpu } else { x.wall }.as_secs_f64() * 1e3)
        .collect();
    Summary::of(&v).expect("at least one run")
}

/// JSON of one backing: per mode, the prezero pass, the ratios.
fn report(s: &Series) -> (Value, f64) {
    let mut out = Map::new();
    for (m, name) in MODES.iter().enumerate() {
        out.insert(
            (*name).into(),
            json!({
                "alloc_touch_cpu_ms": ms(&s.alloc_touch[m], true).to_json(),
                "alloc_touch_wall_ms": ms(&s.alloc_touch[m], false).to_json(),
                "alloc_only_cpu_ms": ms(&s.alloc_only[m], true).to_json(),
                "pages_zeroed_by_allocation": s.zeroed_inline[m].iter().max(),
            }),
        );
    }
    let med = |v: &[Vec<Sample>; 2], m: usize, cpu: bool| ms(&v[m], cpu).median;
    let ratio = med(&s.alloc_touch, 1, true) / med(&s.alloc_touch, 0, true);
    out.insert("ratio_alloc_prezeroed_over_inline".into(), json!(ratio));
    out.insert(
        "ratio_alloc_prezeroed_over_inline_wall".into(),
        json!(med(&s.alloc_touch, 1, false) / med(&s.alloc_touch, 0, false)),
    );
    out.insert(
        "ratio_alloc_only_prezeroed_over_inline".into(),
        json!(med(&s.alloc_only, 1, true) / med(&s.alloc_only, 0, true)),
    );
    let wall = ms(&s.prezero, false);
    out.insert(
        "prezero".into(),
        json!({
            "bytes": s.prezero_bytes,
            "cpu_ms": ms(&s.prezero, true).to_json(),
            "wall_ms": wall.to_json(),
            "gb_per_s": s.prezero_bytes as f64 / (wall.median / 1e3) / 1e9,
        }),
    );
    (Value::Object(out), ratio)
}

fn print_table(title: &str, s: &Series) {
    println!("{title}");
    for (m, name) in MODES.iter().enumerate() {
        let cpu = ms(&s.alloc_touch[m], true);
        println!(
            "  {name:<9} alloc+touch cpu {:>8.2} ± {:>6.2} ms (median {:>8.2})  wall median {:>8.2} ms  alloc alone {:>7.2} ms  pages zeroed on this path {}",
            cpu.mean,
            cpu.sd,
            cpu.median,
            ms(&s.alloc_touch[m], false).median,
            ms(&s.alloc_only[m], true).median,
            s.zeroed_inline[m].iter().max().unwrap_or(&0),
        );
    }
    let (_, ratio) = report(s);
    let wall = ms(&s.prezero, false).median;
    println!(
        "  prezero pass (background thread): cpu {:.2} ms, wall {wall:.2} ms = {:.1} GB/s",
        ms(&s.prezero, true).median,
        s.prezero_bytes as f64 / (wall / 1e3) / 1e9
    );
    println!("  ratio alloc+touch cpu prezeroed / inline = {ratio:.3} (target <= 0.1)");
}

/// Runs one backing; the inner `Err` says why its memory was not available.
fn run_backing(
    kind: BackingKind,
    pages: u64,
    runs: usize,
    gap: Duration,
) -> Result<Result<Series, String>, PrezeroError> {
    match HugePagePool::builder().pages(pages).backing(kind).build() {
        Ok(pool) => measure(&pool, pages, runs, gap).map(Ok),
        // Hugetlb pages taken by someone else between the check and the mapping.
        Err(PrezeroError::Ram(e)) if matches!(kind, BackingKind::Hugetlb(_)) => {
            Ok(Err(e.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// Runs the benchmark.
pub fn run(args: &PrezeroArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let (pages, runs, gap) = if quick {
        (
            args.pages.min(64),
            args.runs.min(5),
            Duration::from_millis(args.gap_ms.min(20)),
        )
    } else {
        (args.pages, args.runs, Duration::from_millis(args.gap_ms))
    };
    let thp = run_backing(BackingKind::Anonymous { thp: true }, pages, runs, gap)?
        .map_err(|e| format!("THP pool: {e}"))?;
    let available = KernelPool::read(2 << 20).map_or(0, |p| p.available());
    let hugetlb = if available >= pages {
        run_backing(BackingKind::Hugetlb(HugePageSize::Size2M), pages, runs, gap)?
    } else {
        Err(format!(
            "hugetlb skipped: needs {pages} free 2 MiB huge pages (vm.nr_hugepages), {available} available"
        ))
    };
    let (thp_json, ratio) = report(&thp);
    if json {
        let out = json!({
            "bench": "prezero",
            "quick": quick,
            "pages": pages,
            "page_bytes": 2 << 20,
            "runs": runs,
            "gap_ms": gap.as_millis() as u64,
            "ratio_alloc_prezeroed_over_inline": ratio,
            "prezero_gb_per_s": thp_json["prezero"]["gb_per_s"],
            "thp": thp_json,
            "hugetlb": match &hugetlb { Ok(h) => report(h).0, Err(why) => json!({ "skipped": why }) },
            "seed": SEED,
            "method": "pool all dirty (written, freed); timed: allocate every page zeroed + touch 1 byte per 4 KiB, thread CPU and wall; inline = allocation path zeroes, prezeroed = prezero(all) on a background thread first (its cost in prezero); modes alternate per run, same gap since the last write",
        });
        println!("{out}");
        return Ok(());
    }
    if quick {
        println!(
            "(--quick: {pages} pages ({} MiB), {runs} runs, gap {} ms; full: 512 pages (1 GiB), 9 runs, 200 ms)",
            pages * 2,
            gap.as_millis()
        );
    }
    print_table(&format!("prezero, THP, {pages} x 2 MiB, {runs} runs"), &thp);
    match &hugetlb {
        Ok(h) => print_table(&format!("prezero, hugetlb 2 MiB, {pages} pages"), h),
        Err(why) => println!("{why}"),
    }
    println!("{SEED}");
    Ok(())
}
