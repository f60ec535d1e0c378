//! `zeronce bench rss-follow`: how fast the process's memory follows its working set once
//! a big buffer is freed. Write 4 GiB (2 MiB blocks), keep a 256 MiB working set, free the
//! rest, then sample every 100 ms until the resident size stops falling; once with
//! Linux's budget (1/16 of each free list per 2 s pass) and once with the adaptive budget
//! (everything in one pass when nothing of reportable order was allocated during the delay).

use crate::common::{BenchResult, Common};
use crate::plot;
use crate::progress::Progress;
use clap::Args;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};
use zeronce::zeronce_mem::ProcessRss;
use zeronce::{BudgetPolicy, Order, ProcessMemory, ReportingConfig, ReportingSetup};

/// Arguments of `zeronce bench rss-follow`.
#[derive(Args, Debug)]
pub struct RssFollowArgs {
    /// `--quick` and `--json`.
    #[command(flatten)]
    pub common: Common,
    /// Draw resident memory over time for both budgets into this SVG file.
    #[arg(long, value_name = "FILE.svg", value_parser = crate::plot::writable_path)]
    pub plot: Option<std::path::PathBuf>,
}

/// Sizes and times of one run.
#[derive(Clone, Copy, Debug)]
struct Plan {
    written: usize,
    working_set: usize,
    delay: Duration,
    sample: Duration,
    /// Settled when nothing fell for this long.
    flat_for: Duration,
    timeout: Duration,
}

/// What one policy achieved.
struct Outcome {
    rss_after: u64,
    process_rss_anon_after: u64,
    seconds_to_settle: f64,
    passes: u64,
    samples: Vec<(f64, u64)>,
}

fn follow(plan: Plan, budget: BudgetPolicy) -> Result<Outcome, zeronce::Error> {
    let pm = ProcessMemory::builder()
        .size(plan.written + (256 << 20))
        .reporting(ReportingSetup {
            config: ReportingConfig {
                delay: plan.delay,
                budget,
                ..ReportingConfig::default()
            },
            ..ReportingSetup::default()
        })
        .build()?;
    let order = Order::new(9).expect("order 9");
    let mut blocks = Vec::new();
    for _ in 0..plan.written / (2 << 20) {
        let mut b = pm.alloc(order)?;
        b.as_mut_slice().fill(0x77);
        blocks.push(b);
    }
    blocks.truncate(plan.working_set / (2 << 20));
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut last = pm.resident_bytes();
    let (mut last_drop, mut last_change) = (Duration::ZERO, Duration::ZERO);
    samples.push((0.0, last));
    loop {
        std::thread::sleep(plan.sample);
        let now = t0.elapsed();
        let rss = pm.resident_bytes();
        samples.push((now.as_secs_f64(), rss));
        if rss < last {
            last_drop = now;
        }
        if rss != last {
            last_change = now;
        }
        last = rss;
        if now - last_change >= plan.flat_for || now >= plan.timeout {
            break;
        }
    }
    let passes = pm.stats().reporting.map_or(0, |r| r.passes);
    let out = Outcome {
        rss_after: last,
        process_rss_anon_after: ProcessRss::read().map_or(0, |r| r.anon),
        seconds_to_settle: last_drop.as_secs_f64(),
        passes,
        samples,
    };
    drop(blocks);
    Ok(out)
}

/// Runs the benchmark.
pub fn run(args: &RssFollowArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let plan = if quick {
        Plan {
            written: 1 << 30,
            working_set: 64 << 20,
            delay: Duration::from_millis(500),
            sample: Duration::from_millis(100),
            flat_for: Duration::from_millis(1500),
            timeout: Duration::from_secs(7),
        }
    } else {
        Plan {
            written: 4 << 30,
            working_set: 256 << 20,
            delay: ReportingConfig::default().delay,
            sample: Duration::from_millis(100),
            flat_for: Duration::from_secs(4),
            timeout: Duration::from_secs(120),
        }
    };
    let target_s = plan.delay.as_secs_f64() + 1.0;
    let target_bytes = plan.working_set as u64 + (64 << 20);
    if !json {
        println!(
            "bench rss-follow{}: write {} MiB in 2 MiB blocks, keep {} MiB, free the rest; \
             reporting delay {} ms; target (adaptive budget): resident ≤ {} MiB within \
             {target_s:.1} s",
            if quick { " (--quick)" } else { "" },
            plan.written >> 20,
            plan.working_set >> 20,
            plan.delay.as_millis(),
            target_bytes >> 20
        );
    }
    let mut lines = Vec::new();
    let mut policies = Map::new();
    let mut settle = [0.0; 2];
    let mut met = [false; 2];
    // The target is the adaptive budget's; Linux's budget is the comparison (it reports
    // 1/16 per pass by design) and gets no verdict.
    for (i, (name, budget, has_target)) in [
        ("linux", BudgetPolicy::Linux, false),
        ("adaptive", BudgetPolicy::Adaptive, true),
    ]
    .into_iter()
    .enumerate()
    {
        let progress = Progress::new(args.common, &format!("bench rss-follow ({name})"), 1);
        let o = follow(plan, budget);
        progress.finish();
        let o = o?;
        lines.push(plot::Series {
            name: format!("{name} budget"),
            points: o
                .samples
                .iter()
                .map(|&(t, b)| (t, (b >> 20) as f64))
                .collect(),
        });
        settle[i] = o.seconds_to_settle;
        met[i] = o.rss_after <= target_bytes && o.seconds_to_settle <= target_s;
        if !json {
            println!(
                "  {name:<8}: resident {:>5} MiB after {:>5.1} s ({} passes); whole process \
                 RssAnon {} MiB; {}",
                o.rss_after >> 20,
                o.seconds_to_settle,
                o.passes,
                o.process_rss_anon_after >> 20,
                match (has_target, met[i]) {
                    (false, _) => "comparison, no target",
                    (true, true) => "target met",
                    (true, false) => "target NOT MET",
                },
            );
        }
        policies.insert(
            name.into(),
            json!({
                "working_set_bytes": plan.working_set,
                "rss_after_bytes": o.rss_after,
                "process_rss_anon_after_bytes": o.process_rss_anon_after,
                "seconds_to_settle": o.seconds_to_settle,
                "passes": o.passes,
                "target_met": if has_target { json!(met[i]) } else { Value::Null },
                "samples_s_bytes": o.samples,
            }),
        );
    }
    if let Some(path) = &args.plot {
        let marks = [
            plot::Mark {
                at: 0.0,
                what: "freed".into(),
            },
            plot::Mark {
                at: plan.delay.as_secs_f64(),
                what: "first report due".into(),
            },
        ];
        plot::resident_over_time(path, "resident memory after a free", &lines, &marks)?;
        if !json {
            println!("plot: {}", path.display());
        }
    }
    if json {
        let mut out = Map::new();
        out.insert("bench".into(), json!("rss-follow"));
        out.insert("quick".into(), json!(quick));
        out.insert("written_bytes".into(), json!(plan.written));
        out.insert("delay_s".into(), json!(plan.delay.as_secs_f64()));
        out.insert("adaptive_seconds_to_settle".into(), json!(settle[1]));
        out.insert("linux_seconds_to_settle".into(), json!(settle[0]));
        out.insert("adaptive_target_met".into(), json!(met[1]));
        out.insert("policies".into(), Value::Object(policies));
        out.insert(
            "method".into(),
            json!("rss_after_bytes = resident bytes of the arena (mincore); seconds_to_settle = time of the last drop after the free; sampled every 100 ms until flat for flat_for or timeout"),
        );
        println!("{}", Value::Object(out));
    } else {
        println!(
            "adaptive settles in {:.1} s, linux in {:.1} s",
            settle[1], settle[0]
        );
    }
    Ok(())
}
