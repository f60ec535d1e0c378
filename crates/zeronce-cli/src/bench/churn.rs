//! `zeronce bench churn`: the free page reporting series' page_fault1 (THP) / page_fault2 tests in spirit.
//! 1 and 2 threads repeatedly allocate a *zeroed* block (page faults hand out zeroed pages
//! too), touch every 4 KiB page, and free it, at order 0 and order 9, for a fixed time;
//! reporting disabled, enabled with the Linux budget, and enabled with the adaptive budget
//! (default delay, 2 s). Every round builds fresh process memories in rotating order
//! (placement effects must not stick to a mode), warms them up, and runs one trial per mode
//! back to back; a trial outlasts the delay, so background passes and the faults they
//! cause land in it. A configuration's ratio is the median over rounds of enabled /
//! disabled of the same round. Throughput is iterations per wall-clock second.

use super::stats::Summary;
use super::{BenchResult, Common};
use clap::Args;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use zeronce::{BudgetPolicy, Order, ProcessMemory, ReportingConfig, ReportingSetup};

/// Arguments of `zeronce bench churn`.
#[derive(Args, Debug)]
pub struct ChurnArgs {
    #[command(flatten)]
    pub common: Common,
    /// Rounds (each runs every mode once) [default: 11; --quick: 4].
    #[arg(long, value_parser = super::at_least_one)]
    pub rounds: Option<usize>,
    /// Seconds per trial [default: 2.5; --quick: 0.25].
    #[arg(long, value_parser = super::seconds, allow_negative_numbers = true)]
    pub trial_s: Option<f64>,
}

/// Reporting off, on with Linux's budget, on with the adaptive budget.
const MODES: [(&str, Option<BudgetPolicy>); 3] = [
    ("disabled", None),
    ("linux", Some(BudgetPolicy::Linux)),
    ("adaptive", Some(BudgetPolicy::Adaptive)),
];

fn build(budget: Option<BudgetPolicy>, delay: Duration) -> Result<ProcessMemory, zeronce::Error> {
    let b = ProcessMemory::builder().size(1 << 30);
    match budget {
        None => b.no_reporting(),
        Some(budget) => b.reporting(ReportingSetup {
            config: ReportingConfig {
                delay,
                budget,
                ..ReportingConfig::default()
            },
            ..ReportingSetup::default()
        }),
    }
    .build()
}

/// Alloc-zeroed / touch / free loops on `threads` threads for `dur`; iterations per second.
fn trial(
    pm: &ProcessMemory,
    order: Order,
    threads: usize,
    dur: Duration,
) -> Result<f64, zeronce::Error> {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let counts = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let mut b = pm.alloc_zeroed(order)?;
                        b.touch(4096);
                        drop(b);
                        n += 1;
                    }
                    Ok::<u64, zeronce::Error>(n)
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let total: Result<u64, zeronce::Error> = workers
            .into_iter()
            .map(|w| w.join().expect("churn thread"))
            .sum();
        total.map(|n| n as f64 / t0.elapsed().as_secs_f64())
    })?;
    Ok(counts)
}

/// Throughputs per mode of one (order, threads) configuration.
fn configuration(
    order: u8,
    threads: usize,
    rounds: usize,
    dur: Duration,
    delay: Duration,
) -> Result<[Vec<f64>; 3], zeronce::Error> {
    let order = Order::new(order).expect("order");
    let mut out: [Vec<f64>; 3] = Default::default();
    for r in 0..rounds {
        // Fresh process memories every round, built in rotating order: where a mapping
        // lands (huge pages, cache placement) moves throughput by 5-10% (measured with all
        // three modes disabled), which must not stick to one mode.
        let mut pms: Vec<(usize, ProcessMemory)> = Vec::with_capacity(3);
        for k in 0..3 {
            let m = (r + k) % 3;
            pms.push((m, build(MODES[m].1, delay)?));
        }
        // Warm-up: consume never-touched memory so every mode starts from its steady state
        // (and the enabled ones have a request pending: the first pass lands in the trial).
        for (_, pm) in &pms {
            trial(pm, order, threads, dur / 5)?;
        }
        for (m, pm) in &pms {
            out[*m].push(trial(pm, order, threads, dur)?);
        }
    }
    Ok(out)
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).map_or(0.0, |s| s.median)
}

/// Runs the benchmark.
pub fn run(args: &ChurnArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let c = args.common;
    let rounds = c.pick(args.rounds, 4, 11);
    let dur = Duration::from_secs_f64(c.pick(args.trial_s, 0.25, 2.5));
    let delay = c.pick(
        None,
        Duration::from_millis(100),
        ReportingConfig::default().delay,
    );
    let mut configs = Vec::new();
    let (mut min_linux, mut min_adaptive) = (f64::INFINITY, f64::INFINITY);
    for (order, threads) in [(0u8, 1usize), (0, 2), (9, 1), (9, 2)] {
        let t = configuration(order, threads, rounds, dur, delay)?;
        // Per-round ratios: each enabled trial against the disabled trial of its round.
        let paired =
            |m: usize| -> Vec<f64> { t[m].iter().zip(&t[0]).map(|(e, d)| e / d).collect() };
        let (linux, adaptive) = (median(&paired(1)), median(&paired(2)));
        min_linux = min_linux.min(linux);
        min_adaptive = min_adaptive.min(adaptive);
        configs.push(json!({
            "order": order,
            "threads": threads,
            "disabled_per_s": Summary::of(&t[0]).map(|s| s.to_json()),
            "linux_per_s": Summary::of(&t[1]).map(|s| s.to_json()),
            "adaptive_per_s": Summary::of(&t[2]).map(|s| s.to_json()),
            "ratio_linux_over_disabled": linux,
            "ratio_adaptive_over_disabled": adaptive,
            "ratio_of_medians_linux": median(&t[1]) / median(&t[0]),
            "ratio_of_medians_adaptive": median(&t[2]) / median(&t[0]),
        }));
    }
    if json {
        let mut out = Map::new();
        out.insert("bench".into(), json!("churn"));
        out.insert("quick".into(), json!(quick));
        out.insert("rounds".into(), json!(rounds));
        out.insert("trial_s".into(), json!(dur.as_secs_f64()));
        out.insert("delay_s".into(), json!(delay.as_secs_f64()));
        out.insert("min_ratio_enabled_over_disabled".into(), json!(min_linux));
        out.insert(
            "min_ratio_adaptive_over_disabled".into(),
            json!(min_adaptive),
        );
        out.insert("configurations".into(), Value::Array(configs));
        out.insert(
            "method".into(),
            json!("alloc_zeroed + touch every 4 KiB + free per iteration, fresh 1 GiB THP arena per mode and round (built in rotating order); iterations per wall second; trials back to back per round; ratio = median over rounds of enabled/disabled in the same round"),
        );
        println!("{}", Value::Object(out));
        return Ok(());
    }
    if quick {
        println!(
            "(--quick: {rounds} rounds of {} ms, delay {} ms; full: 11 rounds of 2.5 s, delay 2 s)",
            dur.as_millis(),
            delay.as_millis()
        );
    }
    println!("churn: alloc_zeroed + touch + free, iterations/s (medians)");
    for c in &configs {
        println!(
            "  order {} threads {}: disabled {:>10.0}  linux {:>10.0} ({:.3})  adaptive {:>10.0} ({:.3})",
            c["order"], c["threads"],
            c["disabled_per_s"]["median"].as_f64().unwrap_or(0.0),
            c["linux_per_s"]["median"].as_f64().unwrap_or(0.0),
            c["ratio_linux_over_disabled"].as_f64().unwrap_or(0.0),
            c["adaptive_per_s"]["median"].as_f64().unwrap_or(0.0),
            c["ratio_adaptive_over_disabled"].as_f64().unwrap_or(0.0),
        );
    }
    println!("min ratio enabled / disabled: linux {min_linux:.3}, adaptive {min_adaptive:.3} (target ≥ 0.97; seed: within ~1%)");
    Ok(())
}
