//! `zeronce bench peers`: zeronce as a global allocator against glibc, jemalloc and
//! mimalloc. The workload binaries (crate `zeronce-peers`) run the same code and differ
//! only in `#[global_allocator]`; every sample is a fresh process, contenders interleaved
//! (the order rotates by one each round, [`contest::rotation`], and is printed), medians per
//! contender and step.
//!
//! Memory idle for seconds may be reclaimed by the machine's own host and faulted back
//! slowly. A sample is *cold* by its own figures ([`contest::cold`]: CPU time its minor
//! faults do not explain, per touched page): for reuse the timed allocation and touch, for
//! churn its two threads' CPU time and faults over every page they touched, for app the
//! allocation and first touch of each buffer, timed apart from the work on it. A sample
//! without those figures (an old workload binary) is judged by distance (time over twice
//! the median of its contender and step, throughput under half). Every step records the idle time
//! before it (`idle_ms`); cold samples are counted and shown, never dropped; the `*_warm`
//! figures leave them out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use serde_json::{json, Map, Value};

use crate::common::{at_least_one, BenchResult, Common};
use crate::contest::{self, cold_sample, median, ratio, warm_median, Results};

/// Options of `zeronce bench peers`.
#[derive(Args, Clone, Debug)]
pub struct PeersArgs {
    /// `--quick` (2 samples, 2 s of churn, 4 app rounds) and `--json`.
    #[command(flatten)]
    pub common: Common,
    /// Samples (fresh processes) per contender and step [default: 7, quick 2].
    #[arg(long, value_parser = at_least_one)]
    pub samples: Option<usize>,
    /// Seconds of the churn workload [default: 10, quick 2].
    #[arg(long, value_parser = at_least_one)]
    pub churn_secs: Option<usize>,
    /// Buffers of 64 MiB of the application-like workload [default: 16, quick 4].
    #[arg(long, value_parser = at_least_one)]
    pub app_rounds: Option<usize>,
    /// Where the `peer-*` binaries are (default: beside this program; build them there with
    /// `cargo build --release --manifest-path crates/zeronce-peers/Cargo.toml --target-dir
    /// target`).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
}

/// Contenders: binary name → name in the results. glibc first: it also measures the floor.
const CONTENDERS: [(&str, &str); 7] = [
    ("peer-system", "glibc"),
    ("peer-jemalloc", "jemalloc"),
    ("peer-mimalloc", "mimalloc"),
    ("peer-zeronce-zero-then-report", "zeronce-zero-then-report"),
    ("peer-zeronce-immediate", "zeronce-immediate"),
    ("peer-zeronce-hold", "zeronce-hold"),
    ("peer-zeronce-lazy", "zeronce-lazy"),
];
/// Peers that are not zeronce.
const PEERS: [&str; 3] = ["glibc", "jemalloc", "mimalloc"];
/// The contender the targets are about (the default policy of `ProcessBackend`).
const ZERONCE: &str = "zeronce-zero-then-report";
/// The reuse delays, in milliseconds.
const DELAYS: [u64; 3] = [0, 100, 3000];

/// The field a step's samples are judged cold on.
#[derive(Clone, Copy, Debug)]
enum Figure {
    /// A time: cold when over twice the median.
    Time(&'static str),
    /// A throughput: cold when under half the median.
    Rate(&'static str),
}

impl Figure {
    fn field(self) -> &'static str {
        match self {
            Figure::Time(f) | Figure::Rate(f) => f,
        }
    }

    /// Whether `value` is warm against the `median` of its group.
    fn warm(self, value: f64, median: f64) -> bool {
        match self {
            Figure::Time(_) => value <= 2.0 * median,
            Figure::Rate(_) => value >= median / 2.0,
        }
    }

    /// Whether `s` is warm: by its own fault figures when it carries them, else by its
    /// distance from the median of `all` (its contender and step).
    fn warm_sample(self, s: &Value, all: &[Value]) -> bool {
        if let Some(cold) = cold_sample(s) {
            return !cold;
        }
        let m = median(all, self.field());
        match (s[self.field()].as_f64(), m) {
            (Some(v), Some(m)) => self.warm(v, m),
            _ => false,
        }
    }

    /// How a step's samples were judged.
    fn cold_by(self, all: &[Value]) -> &'static str {
        if all.iter().all(|s| cold_sample(s).is_some()) {
            "own minor faults and CPU time"
        } else {
            "distance from the median"
        }
    }
}

/// The sizing of a run: the flags, else their `--quick` or full defaults.
#[derive(Clone, Copy, Debug)]
struct Sizing {
    samples: usize,
    churn_secs: usize,
    app_rounds: usize,
}

impl Sizing {
    fn of(a: &PeersArgs) -> Self {
        Sizing {
            samples: a.common.pick(a.samples, 2, 7),
            churn_secs: a.common.pick(a.churn_secs, 2, 10),
            app_rounds: a.common.pick(a.app_rounds, 4, 16),
        }
    }
}

/// A step: workload arguments and the figure its samples are judged on.
struct Step {
    name: String,
    args: Vec<String>,
    figure: Figure,
    /// Only glibc runs it (the floor).
    glibc_only: bool,
}

fn steps(a: Sizing) -> Vec<Step> {
    let mut v = vec![Step {
        name: "floor".into(),
        args: vec!["floor".into()],
        figure: Figure::Time("cpu_ms"),
        glibc_only: true,
    }];
    for d in DELAYS {
        v.push(Step {
            name: format!("reuse_{d}ms"),
            // RSS 5 s after the free is read once, after the reuse at once.
            args: vec![
                "reuse".into(),
                d.to_string(),
                if d == 0 { "5" } else { "0" }.into(),
            ],
            figure: Figure::Time("cpu_ms"),
            glibc_only: false,
        });
    }
    v.push(Step {
        name: "churn".into(),
        args: vec!["churn".into(), a.churn_secs.to_string()],
        figure: Figure::Rate("throughput_mib_s"),
        glibc_only: false,
    });
    v.push(Step {
        name: "app".into(),
        args: vec!["app".into(), a.app_rounds.to_string()],
        figure: Figure::Time("wall_ms"),
        glibc_only: false,
    });
    v
}

fn bin_dir(a: &PeersArgs) -> Result<PathBuf, Box<dyn std::error::Error>> {
    if let Some(d) = &a.bin_dir {
        return Ok(d.clone());
    }
    let exe = std::env::current_exe()?;
    Ok(exe.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// The command that builds the workload binaries into `dir`, when `dir` is a cargo
/// profile directory (`TARGET/release`, `TARGET/debug`).
fn build_command(dir: &Path) -> String {
    let manifest = "--manifest-path crates/zeronce-peers/Cargo.toml";
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => "--release ",
        Some("debug") => "",
        _ => return format!("cargo build --release {manifest}, then pass --bin-dir"),
    };
    let target = dir.parent().unwrap_or(Path::new("target")).display();
    format!("cargo build {profile}{manifest} --target-dir {target}")
}

/// The contenders' binaries in `dir`, or an error naming the missing ones and the command
/// that builds them.
fn contenders(dir: &Path) -> Result<Vec<(PathBuf, &'static str)>, Box<dyn std::error::Error>> {
    let all: Vec<(PathBuf, &'static str)> = CONTENDERS
        .iter()
        .map(|(bin, name)| (dir.join(bin), *name))
        .collect();
    let missing: Vec<&str> = CONTENDERS
        .iter()
        .zip(&all)
        .filter(|(_, (path, _))| !path.is_file())
        .map(|((bin, _), _)| *bin)
        .collect();
    if missing.is_empty() {
        return Ok(all);
    }
    Err(format!(
        "the peer workload binaries are not built ({} missing in {}): they are a cargo \
         workspace of their own (jemalloc and mimalloc are C code, not built with zeronce); \
         from the repository root run `{}`",
        missing.join(", "),
        dir.display(),
        build_command(dir)
    )
    .into())
}

/// Warm median of `field` by `figure`'s judgement, and the cold count.
fn warm_of(samples: &[Value], field: &str, figure: Figure) -> (Option<f64>, usize) {
    warm_median(samples, field, |s| figure.warm_sample(s, samples))
}

fn summarise(results: &Results, steps: &[Step]) -> Value {
    let mut out = Map::new();
    for step in steps {
        let mut per = Map::new();
        for (contender, samples) in &results[&step.name] {
            let f = step.figure;
            let mut fields = contest::summary(
                samples,
                f.field(),
                |s| f.warm_sample(s, samples),
                &["idle_ms", "minor_faults"],
            );
            fields.insert("cold_by".into(), json!(f.cold_by(samples)));
            per.insert((*contender).into(), Value::Object(fields));
        }
        out.insert(step.name.clone(), Value::Object(per));
    }
    Value::Object(out)
}

/// Medians of `field` in `step` for each contender.
fn medians(results: &Results, step: &str, field: &str) -> BTreeMap<&'static str, f64> {
    results[step]
        .iter()
        .filter_map(|(c, s)| median(s, field).map(|m| (*c, m)))
        .collect()
}

fn best(m: &BTreeMap<&'static str, f64>, who: &[&str], lowest: bool) -> Option<f64> {
    let v = who.iter().filter_map(|c| m.get(c).copied());
    if lowest {
        v.reduce(f64::min)
    } else {
        v.reduce(f64::max)
    }
}

/// The targets of the issue, as ratios measured in this run.
fn targets(results: &Results) -> Value {
    let floor = median(&results["floor"]["glibc"], "cpu_ms");
    let r0 = medians(results, "reuse_0ms", "cpu_ms");
    let r100 = medians(results, "reuse_100ms", "cpu_ms");
    let z = |m: &BTreeMap<&str, f64>| m.get(ZERONCE).copied();
    // Reused after 3 s: warm medians; peers that returned the memory while idle.
    let warm3: BTreeMap<&str, f64> = results["reuse_3000ms"]
        .iter()
        .filter_map(|(c, s)| {
            warm_of(s, "cpu_ms", Figure::Time("cpu_ms"))
                .0
                .map(|m| (*c, m))
        })
        .collect();
    // Every sample, cold ones too: where zeronce's are cold every time (its given-back
    // blocks refaulting slowly from a host that took them), the warm ratio has no figure
    // and this one is the cost a user pays.
    let all3 = medians(results, "reuse_3000ms", "cpu_ms");
    let idle3 = medians(results, "reuse_3000ms", "rss_idle_mib");
    let returning: Vec<&str> = PEERS
        .iter()
        .copied()
        .filter(|p| idle3.get(p).is_some_and(|&r| r < 64.0))
        .collect();
    let idle5 = medians(results, "reuse_0ms", "rss_idle_after_free_mib");
    let tput = medians(results, "churn", "throughput_mib_s");
    let peak = medians(results, "churn", "peak_rss_mib");
    let app = medians(results, "app", "wall_ms");
    json!({
        "floor_cpu_ms": floor,
        "ratio_zeronce_over_floor_reuse_0ms": ratio(z(&r0), floor),
        "ratio_zeronce_over_floor_reuse_100ms": ratio(z(&r100), floor),
        "ratio_zeronce_over_glibc_reuse_100ms": ratio(z(&r100), r100.get("glibc").copied()),
        "ratio_zeronce_over_jemalloc_reuse_100ms": ratio(z(&r100), r100.get("jemalloc").copied()),
        "ratio_zeronce_over_best_peer_reuse_100ms": ratio(z(&r100), best(&r100, &PEERS, true)),
        "zeronce_idle_rss_mib": idle5.get(ZERONCE),
        "returning_peers_3s": returning,
        "ratio_zeronce_over_best_returning_peer_reuse_3s": ratio(z(&warm3), best(&warm3, &returning, true)),
        "ratio_zeronce_over_best_returning_peer_reuse_3s_all_samples": ratio(z(&all3), best(&all3, &returning, true)),
        "ratio_zeronce_over_best_peer_churn_throughput": ratio(tput.get(ZERONCE).copied(), best(&tput, &PEERS, false)),
        "zeronce_churn_peak_rss_mib": peak.get(ZERONCE),
        "best_peer_churn_peak_rss_mib": PEERS.iter().copied().max_by(|a, b| tput.get(a).unwrap_or(&0.0).total_cmp(tput.get(b).unwrap_or(&0.0))).and_then(|p| peak.get(p)),
        "ratio_zeronce_over_best_peer_app_wall": ratio(app.get(ZERONCE).copied(), best(&app, &PEERS, true)),
    })
}

/// Runs the benchmark; prints one JSON object.
pub fn run(a: &PeersArgs) -> BenchResult {
    let contenders = contenders(&bin_dir(a)?)?;
    let z = Sizing::of(a);
    let steps = steps(z);
    let names: Vec<&'static str> = contenders.iter().map(|c| c.1).collect();
    let step_names: Vec<String> = steps.iter().map(|s| s.name.clone()).collect();
    let results = contest::interleave(z.samples, &names, &step_names, |k, i| {
        let (step, (bin, name)) = (&steps[k], &contenders[i]);
        if step.glibc_only && *name != "glibc" {
            return Ok(None);
        }
        let mut cmd = Command::new(bin);
        cmd.args(&step.args);
        contest::sample(cmd).map(Some)
    })?;
    let cpu = contest::cpu();
    let summary = summarise(&results, &steps);
    let report = json!({
        "bench": "peers",
        "samples": z.samples,
        "churn_secs": z.churn_secs,
        "app_rounds": z.app_rounds,
        "cpu": cpu["model"],
        "cpu_family": cpu["family"],
        "order": "rotated by one each round (round r starts with contender r mod n)",
        "targets": targets(&results),
        "steps": summary,
    });
    if a.common.json {
        println!("{report}");
    } else {
        let figures: Vec<(&str, &str)> = steps
            .iter()
            .map(|s| (s.name.as_str(), s.figure.field()))
            .collect();
        contest::print_table(&report["steps"], &figures);
        println!("targets: {:#}", report["targets"]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Sizing {
        Sizing {
            samples: 3,
            churn_secs: 1,
            app_rounds: 1,
        }
    }

    /// zeronce's reuse after 3 s cold in every sample (65 536 pages touched in 800 ms
    /// with 128 faults) and glibc's warm (65 536 faults in 110 ms): the warm ratio has no
    /// figure, the all-samples ratio says what the reuse costs.
    #[test]
    fn reuse_3s_cold_in_every_zeronce_sample_still_has_an_all_samples_ratio() {
        let sample = |cpu: f64, faults: f64| {
            json!({ "cpu_ms": cpu, "minor_faults": faults, "pages_touched": 65536.0,
                    "rss_idle_mib": 3.0, "rss_idle_after_free_mib": 3.0,
                    "throughput_mib_s": 1.0, "peak_rss_mib": 1.0, "wall_ms": 1.0 })
        };
        let per = |z: &[f64], g: &[f64]| {
            BTreeMap::from([
                (
                    ZERONCE,
                    z.iter().map(|&c| sample(c, 128.0)).collect::<Vec<_>>(),
                ),
                ("glibc", g.iter().map(|&c| sample(c, 65536.0)).collect()),
            ])
        };
        let results: Results = ["floor", "reuse_0ms", "reuse_100ms", "churn", "app"]
            .iter()
            .map(|s| (s.to_string(), per(&[1.0], &[1.0])))
            .chain([(
                "reuse_3000ms".to_string(),
                per(&[800.0, 900.0, 700.0], &[110.0, 100.0, 120.0]),
            )])
            .collect();
        let t = targets(&results);
        assert_eq!(t["returning_peers_3s"], json!(["glibc"]), "{t}");
        assert_eq!(
            t["ratio_zeronce_over_best_returning_peer_reuse_3s"],
            Value::Null,
            "{t}"
        );
        let all = t["ratio_zeronce_over_best_returning_peer_reuse_3s_all_samples"]
            .as_f64()
            .unwrap_or(0.0);
        assert!((all - 800.0 / 110.0).abs() < 1e-9, "{t}");
    }

    /// Samples of `step` for glibc, one JSON object per (figure value, idle ms).
    fn results(step: &str, field: &str, samples: &[(f64, f64)]) -> Results {
        let v = samples
            .iter()
            .map(|&(x, idle)| json!({ field: x, "idle_ms": idle }))
            .collect();
        BTreeMap::from([(step.to_string(), BTreeMap::from([("glibc", v)]))])
    }

    fn summary_of(step: &str, field: &str, samples: &[(f64, f64)]) -> Value {
        let steps: Vec<Step> = steps(args())
            .into_iter()
            .filter(|s| s.name == step)
            .collect();
        summarise(&results(step, field, samples), &steps)[step]["glibc"].clone()
    }

    #[test]
    fn churn_counts_a_slow_throughput_cold_and_keeps_every_idle_time() {
        let s = summary_of(
            "churn",
            "throughput_mib_s",
            &[(1000.0, 3.0), (900.0, 4.0), (300.0, 5000.0)],
        );
        assert_eq!(s["cold_samples"], json!(1), "{s}");
        assert_eq!(s["throughput_mib_s_warm_median"], json!(950.0), "{s}");
        assert_eq!(s["throughput_mib_s_samples"], json!([1000.0, 900.0, 300.0]));
        assert_eq!(s["idle_ms_samples"], json!([3.0, 4.0, 5000.0]));
        assert_eq!(s["idle_ms_median"], json!(4.0));
    }

    #[test]
    fn app_counts_a_slow_wall_time_cold_and_keeps_every_idle_time() {
        let s = summary_of(
            "app",
            "wall_ms",
            &[(100.0, 2.0), (110.0, 2.5), (500.0, 3.0)],
        );
        assert_eq!(s["cold_samples"], json!(1), "{s}");
        assert_eq!(s["wall_ms_warm_median"], json!(105.0), "{s}");
        assert_eq!(s["wall_ms_samples"], json!([100.0, 110.0, 500.0]));
        assert_eq!(s["idle_ms_samples"], json!([2.0, 2.5, 3.0]));
    }

    #[test]
    fn churn_and_app_samples_with_fault_figures_are_judged_by_their_own() {
        for (step, field) in [("churn", "throughput_mib_s"), ("app", "wall_ms")] {
            let steps: Vec<Step> = steps(args())
                .into_iter()
                .filter(|s| s.name == step)
                .collect();
            // Same figure; the second spent 5 µs per page its faults do not explain.
            let sample = |cpu_ms: f64| {
                json!({ field: 100.0, "idle_ms": 1.0, "cpu_ms": cpu_ms,
                        "minor_faults": 0, "pages_touched": 16384 })
            };
            let results = BTreeMap::from([(
                step.to_string(),
                BTreeMap::from([("glibc", vec![sample(1.0), sample(82.0)])]),
            )]);
            let s = summarise(&results, &steps)[step]["glibc"].clone();
            assert_eq!(s["cold_samples"], json!(1), "{step}: {s}");
            assert_eq!(
                s["cold_by"],
                json!("own minor faults and CPU time"),
                "{step}: {s}"
            );
        }
    }

    #[test]
    fn reuse_keeps_its_cold_count_on_cpu_time() {
        let s = summary_of(
            "reuse_3000ms",
            "cpu_ms",
            &[(10.0, 3000.0), (12.0, 3001.0), (300.0, 3002.0)],
        );
        assert_eq!(s["cold_samples"], json!(1), "{s}");
        assert_eq!(s["cpu_ms_warm_median"], json!(11.0), "{s}");
        assert_eq!(s["idle_ms_samples"], json!([3000.0, 3001.0, 3002.0]));
    }
}
