//! `zeronce bench prezero`: the hugetlb pre-zeroing series' scenario scaled to this machine. A pool of
//! 512 × 2 MiB pages (1 GiB) is written and freed (all dirty); then every page is
//! allocated *zeroed* and touched once per 4 KiB, like a VM faulting its RAM in:
//!
//! * `inline`: the pool was not pre-zeroed, the allocation path zeroes every page;
//! * `prezeroed`: `prezero(all)` ran beforehand on a background thread (its cost is
//!   measured too, as GB/s, so nothing is hidden), the allocation path zeroes nothing;
//! * `kernel_fault`: the published series' baseline — a fresh, never-touched pool of the same
//!   size: its pages are known zero and the kernel zeroes each one when the touch faults
//!   it in (for hugetlb only when twice the pages are reserved).
//!
//! Modes alternate per run (order rotates); each timed allocation starts the same
//! `--gap-ms` after its memory was last written (dirtied, pre-zeroed or mapped), so cache
//! and host-reclaim state is alike. Thread CPU time and wall time of the allocation step,
//! medians over the runs. Hugetlb 2 MiB pages too when enough are reserved.

use crate::common::{BenchResult, Common};
use crate::progress::Progress;
use crate::stats::{time_it, Sample, Summary};
use crate::target::Target;
use clap::Args;
use serde_json::{json, Map, Value};
use std::time::Duration;
use zeronce::zeronce_mem::{BackingKind, HugePageSize};
use zeronce::{CancelToken, HugePagePool, PoolPage, PrezeroError};

/// Arguments of `zeronce bench prezero`.
#[derive(Args, Debug)]
pub struct PrezeroArgs {
    /// `--quick` and `--json`.
    #[command(flatten)]
    pub common: Common,
    /// Runs per mode (medians; at least 7 for the record) [default: 9; --quick: 5].
    #[arg(long, value_parser = crate::common::at_least_one)]
    pub runs: Option<usize>,
    /// 2 MiB pages in the pool, at most 65536 (128 GiB) [default: 512; --quick: 64].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub pages: Option<u64>,
    /// Milliseconds between the last write of the memory and the timed allocation, all
    /// modes [default: 200; --quick: 20].
    #[arg(long, value_parser = crate::common::millis)]
    pub gap_ms: Option<u64>,
}

/// The published figures: 64 × 1 GiB hugetlb pages faulted in ~16 s without pre-zeroing,
/// "negligible" with.
const PUBLISHED: &str = "published (hugetlb pre-zeroing series, Skylake, 64 x 1 GiB hugetlb): ~16 s (~250 ms/page) without pre-zeroing, negligible with; its baseline is a pool the kernel zeroes at fault, our kernel_fault row";

/// The target of the headline, pre-zeroed / inline on the same populated pool.
const TARGET: Target = Target::AtMost(0.1);

const MODES: [&str; 3] = ["inline", "prezeroed", "kernel_fault"];
const INLINE: usize = 0;
const PREZEROED: usize = 1;
const FAULT: usize = 2;

/// Samples of every mode.
#[derive(Default)]
struct Series {
    /// Per mode ([`MODES`]): the allocation step (alloc + touch) and allocation alone.
    alloc_touch: [Vec<Sample>; 3],
    alloc_only: [Vec<Sample>; 3],
    /// The pre-zeroing pass of the `prezeroed` mode (background thread).
    prezero: Vec<Sample>,
    prezero_bytes: u64,
    /// Pages the allocation path had to zero, per mode (should be all / none / none).
    zeroed_inline: [Vec<u64>; 3],
}

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

/// Runs the modes the plan's `runs` times, interleaved (order rotates per run); `kernel_fault` only
/// with `fault`.
fn measure_backing(
    kind: BackingKind,
    plan: &Plan,
    fault: bool,
    progress: &Progress,
) -> Result<Series, zeronce::Error> {
    let Plan { pages, runs, gap } = *plan;
    let pool = HugePagePool::builder().pages(pages).backing(kind).build()?;
    let mut s = Series::default();
    let modes = if fault { 3 } else { 2 };
    for run in 0..runs {
        for k in 0..modes {
            let mode = (run + k) % modes;
            if mode == FAULT {
                let fresh = HugePagePool::builder()
                    .pages(pages)
                    .backing(kind)
                    .populate(false)
                    .build()?;
                std::thread::sleep(gap);
                alloc_step(&fresh, pages, &mut s, mode)?;
                continue;
            }
            dirty_all(&pool, pages)?;
            if mode == PREZEROED {
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
            alloc_step(&pool, pages, &mut s, mode)?;
        }
        progress.inc();
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

/// Median of `samples[over]` / median of `samples[under]` (CPU or wall).
fn ratio(samples: &[Vec<Sample>; 3], over: usize, under: usize, cpu: bool) -> f64 {
    ms(&samples[over], cpu).median / ms(&samples[under], cpu).median
}

/// JSON of one backing: per mode, the prezero pass, the ratios.
fn report(s: &Series) -> Value {
    let mut out = Map::new();
    for (m, name) in MODES.iter().enumerate() {
        if s.alloc_touch[m].is_empty() {
            out.insert(
                (*name).into(),
                json!({ "skipped": "needs twice the pages free" }),
            );
            continue;
        }
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
    let (t, a) = (&s.alloc_touch, &s.alloc_only);
    let mut ratios = vec![
        (
            "ratio_alloc_prezeroed_over_inline",
            ratio(t, PREZEROED, INLINE, true),
        ),
        (
            "ratio_alloc_prezeroed_over_inline_wall",
            ratio(t, PREZEROED, INLINE, false),
        ),
        (
            "ratio_alloc_only_prezeroed_over_inline",
            ratio(a, PREZEROED, INLINE, true),
        ),
    ];
    if !t[FAULT].is_empty() {
        ratios.push((
            "ratio_alloc_prezeroed_over_kernel_fault",
            ratio(t, PREZEROED, FAULT, true),
        ));
        ratios.push((
            "ratio_alloc_prezeroed_over_kernel_fault_wall",
            ratio(t, PREZEROED, FAULT, false),
        ));
    }
    for (name, r) in ratios {
        out.insert(name.into(), json!(r));
    }
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
    Value::Object(out)
}

fn print_table(title: &str, s: &Series) {
    println!("{title}");
    for (m, name) in MODES.iter().enumerate() {
        if s.alloc_touch[m].is_empty() {
            println!("  {name:<12} skipped (needs twice the pages free)");
            continue;
        }
        let cpu = ms(&s.alloc_touch[m], true);
        println!(
            "  {name:<12} alloc+touch cpu {:>8.2} ± {:>6.2} ms (median {:>8.2})  wall median {:>8.2} ms  alloc alone {:>7.2} ms  pages zeroed on this path {}",
            cpu.mean,
            cpu.sd,
            cpu.median,
            ms(&s.alloc_touch[m], false).median,
            ms(&s.alloc_only[m], true).median,
            s.zeroed_inline[m].iter().max().unwrap_or(&0),
        );
    }
    let r = report(s);
    let wall = ms(&s.prezero, false).median;
    println!(
        "  prezero pass (background thread): cpu {:.2} ms, wall {wall:.2} ms = {:.1} GB/s",
        ms(&s.prezero, true).median,
        s.prezero_bytes as f64 / (wall / 1e3) / 1e9
    );
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let headline = f("ratio_alloc_prezeroed_over_inline");
    println!(
        "  headline, like for like (the same populated pool, zeroed inline vs pre-zeroed): cpu \
         ratio alloc+touch {headline:.3} ({}); allocation alone {:.4}",
        TARGET.verdict(headline),
        f("ratio_alloc_only_prezeroed_over_inline")
    );
    if !s.alloc_touch[FAULT].is_empty() {
        println!(
            "  published scenario (pre-zeroed pool vs a fresh pool the kernel zeroes at fault): \
             {:.3} (no target: it also credits pre-zeroing with the page faults a populated pool \
             avoids)",
            f("ratio_alloc_prezeroed_over_kernel_fault")
        );
    }
}

/// Runs one backing; the inner `Err` says why its memory was not available.
fn run_backing(
    kind: BackingKind,
    plan: &Plan,
    fault: bool,
    progress: &Progress,
) -> Result<Result<Series, String>, zeronce::Error> {
    match measure_backing(kind, plan, fault, progress) {
        Ok(s) => Ok(Ok(s)),
        // Hugetlb pages taken by someone else between the check and the mapping.
        Err(zeronce::Error::Build(zeronce::BuildError::Ram(e)))
            if matches!(kind, BackingKind::Hugetlb(_)) =>
        {
            Ok(Err(format!("skipped: {e}")))
        }
        Err(e) => Err(e),
    }
}

/// Pool size, runs and idle gap of one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// 2 MiB pages in the pool.
    pub pages: u64,
    /// Runs per mode.
    pub runs: usize,
    /// Idle time between the last write of the memory and the timed allocation.
    pub gap: Duration,
}

/// Both backings' samples; hugetlb's may say why it was skipped.
struct Measured {
    thp: Series,
    hugetlb: Result<Series, String>,
}

fn collect(plan: &Plan, c: Common) -> Result<Measured, Box<dyn std::error::Error>> {
    let Plan { pages, runs, .. } = *plan;
    let progress = Progress::new(c, "bench prezero", runs as u64);
    let thp = run_backing(BackingKind::Anonymous { thp: true }, plan, true, &progress);
    progress.finish();
    let thp = thp?.map_err(|e| format!("THP pool: {e}"))?;
    let hugetlb = match crate::common::hugetlb_skip(pages) {
        Some(why) => Err(why),
        None => {
            let kind = BackingKind::Hugetlb(HugePageSize::Size2M);
            let fault = crate::common::hugetlb_skip(2 * pages).is_none();
            let progress = Progress::new(c, "bench prezero (hugetlb)", runs as u64);
            let r = run_backing(kind, plan, fault, &progress);
            progress.finish();
            r?
        }
    };
    Ok(Measured { thp, hugetlb })
}

fn to_json(plan: &Plan, quick: bool, m: &Measured) -> Value {
    let thp_json = report(&m.thp);
    json!({
        "bench": "prezero",
        "quick": quick,
        "pages": plan.pages,
        "page_bytes": 2 << 20,
        "runs": plan.runs,
        "gap_ms": plan.gap.as_millis() as u64,
        "ratio_alloc_prezeroed_over_inline": thp_json["ratio_alloc_prezeroed_over_inline"],
        "ratio_alloc_only_prezeroed_over_inline": thp_json["ratio_alloc_only_prezeroed_over_inline"],
        "ratio_alloc_prezeroed_over_kernel_fault": thp_json["ratio_alloc_prezeroed_over_kernel_fault"],
        "prezero_gb_per_s": thp_json["prezero"]["gb_per_s"],
        "target": TARGET.to_json(thp_json["ratio_alloc_prezeroed_over_inline"].as_f64().unwrap_or(f64::NAN)),
        "thp": thp_json,
        "hugetlb": match &m.hugetlb { Ok(h) => report(h), Err(why) => json!({ "skipped": why }) },
        "published": PUBLISHED,
        "headline": "ratio_alloc_prezeroed_over_inline (same populated pool); ratio_alloc_prezeroed_over_kernel_fault is the published scenario",
        "method": "pool all dirty (written, freed); timed: allocate every page zeroed + touch 1 byte per 4 KiB, thread CPU and wall; inline = the allocation path zeroes; prezeroed = prezero(all) on a background thread first (its cost under prezero); kernel_fault = a fresh never-touched pool, the kernel zeroes at fault (the published baseline); modes alternate per run, same gap since the memory was last written",
    })
}

/// Runs `plan` on THP and, when enough 2 MiB pages are free, hugetlb; returns the
/// benchmark's JSON object (what `--json` prints).
pub fn measure(plan: &Plan, c: Common) -> Result<Value, Box<dyn std::error::Error>> {
    Ok(to_json(plan, c.quick, &collect(plan, c)?))
}

/// Runs the benchmark.
pub fn run(args: &PrezeroArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let c = args.common;
    let plan = Plan {
        pages: c.pick(args.pages, 64, 512),
        runs: c.pick(args.runs, 5, 9),
        gap: Duration::from_millis(c.pick(args.gap_ms, 20, 200)),
    };
    let Plan { pages, runs, gap } = plan;
    if !json {
        println!(
            "bench prezero{}: {pages} x 2 MiB pages ({} MiB) allocated zeroed and touched, {runs} \
             runs per mode, modes interleaved, gap {} ms",
            if quick { " (--quick)" } else { "" },
            pages * 2,
            gap.as_millis()
        );
    }
    let m = collect(&plan, c)?;
    if json {
        println!("{}", to_json(&plan, quick, &m));
        return Ok(());
    }
    print_table(
        &format!("prezero, THP, {pages} x 2 MiB, {runs} runs"),
        &m.thp,
    );
    match &m.hugetlb {
        Ok(h) => print_table(&format!("prezero, hugetlb 2 MiB, {pages} pages"), h),
        Err(why) => println!("hugetlb {why}"),
    }
    println!("{PUBLISHED}");
    Ok(())
}
