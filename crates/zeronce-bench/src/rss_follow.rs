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

/// The two budgets, in the order they run. The target is the adaptive budget's; Linux's
/// budget is the comparison (it reports 1/16 per pass by design) and gets no verdict.
const POLICIES: [Policy; 2] = [
    Policy {
        name: "linux",
        budget: BudgetPolicy::Linux,
        has_target: false,
    },
    Policy {
        name: "adaptive",
        budget: BudgetPolicy::Adaptive,
        has_target: true,
    },
];

/// One budget the benchmark follows.
#[derive(Clone, Copy)]
struct Policy {
    name: &'static str,
    budget: BudgetPolicy,
    has_target: bool,
}

/// What one budget achieved, and whether that meets the target.
struct Followed {
    policy: Policy,
    outcome: Outcome,
    met: bool,
}

impl Plan {
    /// The sizes and times of a full run, or of a `--quick` one.
    fn new(quick: bool) -> Plan {
        if quick {
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
        }
    }

    /// The target: settled within this many seconds of the free...
    fn target_s(&self) -> f64 {
        self.delay.as_secs_f64() + 1.0
    }

    /// ... at no more than this many resident bytes.
    fn target_bytes(&self) -> u64 {
        self.working_set as u64 + (64 << 20)
    }
}

/// Runs the benchmark.
pub fn run(args: &RssFollowArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let plan = Plan::new(quick);
    if !json {
        println!(
            "bench rss-follow{}: write {} MiB in 2 MiB blocks, keep {} MiB, free the rest; \
             reporting delay {} ms; target (adaptive budget): resident ≤ {} MiB within \
             {:.1} s",
            if quick { " (--quick)" } else { "" },
            plan.written >> 20,
            plan.working_set >> 20,
            plan.delay.as_millis(),
            plan.target_bytes() >> 20,
            plan.target_s()
        );
    }
    let mut results = Vec::new();
    for policy in POLICIES {
        let name = policy.name;
        let progress = Progress::new(args.common, &format!("bench rss-follow ({name})"), 1);
        let o = follow(plan, policy.budget);
        progress.finish();
        let outcome = o?;
        let met = outcome.rss_after <= plan.target_bytes()
            && outcome.seconds_to_settle <= plan.target_s();
        let followed = Followed {
            policy,
            outcome,
            met,
        };
        if !json {
            print_line(&followed);
        }
        results.push(followed);
    }
    if let Some(path) = &args.plot {
        draw(path, &plan, &results)?;
        if !json {
            println!("plot: {}", path.display());
        }
    }
    let settle = |i: usize| results[i].outcome.seconds_to_settle;
    if json {
        print_json(quick, &plan, &results);
    } else {
        println!(
            "adaptive settles in {:.1} s, linux in {:.1} s",
            settle(1),
            settle(0)
        );
    }
    Ok(())
}

fn print_line(f: &Followed) {
    let o = &f.outcome;
    println!(
        "  {:<8}: resident {:>5} MiB after {:>5.1} s ({} passes); whole process \
         RssAnon {} MiB; {}",
        f.policy.name,
        o.rss_after >> 20,
        o.seconds_to_settle,
        o.passes,
        o.process_rss_anon_after >> 20,
        match (f.policy.has_target, f.met) {
            (false, _) => "comparison, no target",
            (true, true) => "target met",
            (true, false) => "target NOT MET",
        },
    );
}

/// Resident memory over time of both budgets, the free and the first report marked.
fn draw(path: &std::path::Path, plan: &Plan, results: &[Followed]) -> BenchResult {
    let lines: Vec<plot::Series> = results
        .iter()
        .map(|f| plot::Series {
            name: format!("{} budget", f.policy.name),
            points: f
                .outcome
                .samples
                .iter()
                .map(|&(t, b)| (t, (b >> 20) as f64))
                .collect(),
        })
        .collect();
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
    plot::resident_over_time(path, "resident memory after a free", &lines, &marks)
}

fn print_json(quick: bool, plan: &Plan, results: &[Followed]) {
    let policies: Map<String, Value> = results
        .iter()
        .map(|f| {
            let o = &f.outcome;
            let value = json!({
                "working_set_bytes": plan.working_set,
                "rss_after_bytes": o.rss_after,
                "process_rss_anon_after_bytes": o.process_rss_anon_after,
                "seconds_to_settle": o.seconds_to_settle,
                "passes": o.passes,
                "target_met": if f.policy.has_target { json!(f.met) } else { Value::Null },
                "samples_s_bytes": o.samples,
            });
            (f.policy.name.to_string(), value)
        })
        .collect();
    let (linux, adaptive) = (&results[0], &results[1]);
    let mut out = Map::new();
    out.insert("bench".into(), json!("rss-follow"));
    out.insert("quick".into(), json!(quick));
    out.insert("written_bytes".into(), json!(plan.written));
    out.insert("delay_s".into(), json!(plan.delay.as_secs_f64()));
    out.insert(
        "adaptive_seconds_to_settle".into(),
        json!(adaptive.outcome.seconds_to_settle),
    );
    out.insert(
        "linux_seconds_to_settle".into(),
        json!(linux.outcome.seconds_to_settle),
    );
    out.insert("adaptive_target_met".into(), json!(adaptive.met));
    out.insert("policies".into(), Value::Object(policies));
    out.insert(
        "method".into(),
        json!("rss_after_bytes = resident bytes of the arena (mincore); seconds_to_settle = time of the last drop after the free; sampled every 100 ms until flat for flat_for or timeout"),
    );
    println!("{}", Value::Object(out));
}
