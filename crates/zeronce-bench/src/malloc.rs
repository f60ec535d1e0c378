//! `zeronce bench malloc`: `libzeronce.so` against glibc, jemalloc, mimalloc and tcmalloc
//! under `LD_PRELOAD`. One C workload binary (`workloads/malloc_work.c`, compiled with `cc`
//! at run time) runs under every allocator; every sample is a fresh process, the
//! contenders interleaved in rotating order ([`contest::interleave`]), medians per
//! contender and step. Reuse samples are judged cold by their own minor faults and CPU
//! time ([`contest::cold`]); the others are not judged.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use clap::Args;
use serde_json::{json, Map, Value};

use crate::common::{at_least_one, BenchResult, Common};
use crate::contest::{self, cold_sample, Results};
use crate::plot::{self, Legend, RatioRow};

mod targets;

/// Options of `zeronce bench malloc`.
#[derive(Args, Clone, Debug)]
pub struct MallocArgs {
    /// `--quick` (1 sample, one 256 MiB reuse round, fewer small objects: < 1 min) and
    /// `--json`.
    #[command(flatten)]
    pub common: Common,
    /// Rounds: samples (fresh processes) per contender and step [default: 5, quick 1];
    /// the short steps (small objects, sqlite3) take three samples a round.
    #[arg(long, value_parser = at_least_one)]
    pub samples: Option<usize>,
    /// `libzeronce.so` [default: beside this program, where `cargo build --release`
    /// leaves it].
    #[arg(long)]
    pub lib: Option<PathBuf>,
    /// Also draw zeronce's ratio to the best peer per step, beside its target, into this
    /// SVG file.
    #[arg(long, value_name = "FILE.svg", value_parser = crate::plot::writable_path)]
    pub plot: Option<PathBuf>,
}

/// The shared libraries of the peers (Debian's paths).
const LIBS: &str = "/usr/lib/x86_64-linux-gnu";

/// A contender: its name, its preloaded library (none: glibc), the Debian package that
/// installs it, and what it does underneath.
struct Contender {
    name: &'static str,
    lib: Option<PathBuf>,
    install: &'static str,
    underneath: &'static str,
}

fn contenders(a: &MallocArgs) -> (Vec<Contender>, Vec<String>) {
    let peer = |name, file: &str, package, underneath| Contender {
        name,
        lib: Some(Path::new(LIBS).join(file)),
        install: package,
        underneath,
    };
    let zeronce = a.lib.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().unwrap_or_default();
        exe.with_file_name("libzeronce.so")
    });
    let all = [
        Contender {
            name: "glibc",
            lib: None,
            install: "",
            underneath: "ptmalloc2: per-thread arenas and tcache; blocks over the mmap \
                         threshold (128 KiB, rising to 32 MiB) mmap'd and munmap'd at free",
        },
        peer(
            "jemalloc",
            "libjemalloc.so.2",
            "apt-get install libjemalloc2",
            "5.3: extents in size classes, per-thread caches; freed pages purged with \
             madvise after the dirty decay (10 s)",
        ),
        peer(
            "mimalloc",
            "libmimalloc.so.2",
            "apt-get install libmimalloc2.0",
            "2.0: sharded free lists in pages of segments; freed memory reset \
             (madvise) after a delay",
        ),
        peer(
            "tcmalloc",
            "libtcmalloc_minimal.so.4",
            "apt-get install libtcmalloc-minimal4",
            "gperftools: thread caches, central lists, a page heap that returns spans \
             to the OS gradually",
        ),
        Contender {
            name: "zeronce",
            lib: Some(zeronce),
            install: "cargo build --release -p zeronce-malloc, or pass --lib",
            underneath: "small objects from mimalloc compiled in, those one thread frees \
                         for another passed in batches through thread caches; large blocks \
                         from process mode: known-zero reuse without memset, freed blocks \
                         zeroed in the background and reported after the hold",
        },
    ];
    let (mut kept, mut skipped) = (Vec::new(), Vec::new());
    for c in all {
        match &c.lib {
            Some(lib) if !lib.is_file() => skipped.push(format!(
                "skipped: {} not installed ({})",
                lib.display(),
                c.install
            )),
            _ => kept.push(c),
        }
    }
    (kept, skipped)
}

/// Compiles the workload into a fresh temporary directory; the binary's path.
fn compile() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("zeronce-bench-malloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("malloc_work.c");
    std::fs::write(&src, include_str!("../workloads/malloc_work.c"))?;
    let bin = dir.join("malloc_work");
    let out = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .map_err(|e| {
            format!(
                "cc not found ({e}): the workload is C compiled at run time; apt-get install gcc"
            )
        })?;
    if !out.status.success() {
        return Err(format!("cc failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(bin)
}

/// A step: its name, the workload's arguments (empty: the sqlite program), the figure
/// it is judged on (lower is better) and whether samples are judged cold.
struct Step {
    name: String,
    args: Vec<String>,
    figure: &'static str,
    judged: bool,
    /// Samples of this step per contender and round: more for the steps that take well
    /// under a second and swing most between samples (small objects, sqlite3), so their
    /// medians are of more samples at little cost.
    per_round: usize,
}

/// 200k rows inserted in one transaction, then an index and a count. No journal and no
/// `fsync` at the commit: the step times the program and its allocator, not the disk.
const SQL: &str =
    "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; BEGIN; CREATE TABLE t(a INTEGER, b TEXT);\n\
    WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<200000)\n\
    INSERT INTO t SELECT x, hex(randomblob(24)) FROM c;\n\
    CREATE INDEX tb ON t(b); COMMIT; SELECT count(*) FROM t;\n";

fn steps(a: &MallocArgs, sqlite: bool) -> Vec<Step> {
    let rounds = a.common.pick(None, 1, 3).to_string();
    let ops = a.common.pick(None, 200_000, 1_000_000).to_string();
    let step = |name: &str, args: &[&str], figure, judged| Step {
        name: name.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        figure,
        judged,
        per_round: 1,
    };
    // The short, noisy steps: three samples a round (one with --quick).
    let short = a.common.pick(None, 1, 3);
    let mut v: Vec<Step> = [0, 100, 3000]
        .iter()
        .map(|d| {
            step(
                &format!("reuse_{d}ms"),
                &["reuse", &d.to_string(), &rounds],
                "cpu_ms",
                true,
            )
        })
        .collect();
    v.push(step("idle_768mib", &["idle", "768"], "rss_5s_mib", false));
    v.push(Step {
        per_round: short,
        ..step("small_2x2", &["small", "2", &ops], "wall_ms", false)
    });
    // One thread's churn of small blocks, alone and once another thread has allocated:
    // what the small-object layer costs a program that does not pass blocks between
    // threads (the locality of its blocks, a few instructions a call).
    let churn_ops = a.common.pick(None, 2_000_000, 10_000_000).to_string();
    for (threaded, name) in [("0", "churn_1t"), ("1", "churn_threaded")] {
        v.push(Step {
            per_round: short,
            ..step(name, &["churn", &churn_ops, threaded], "wall_ms", false)
        });
    }
    // Cache-hot buffers at and above the default threshold, reused at once: what the
    // default threshold is chosen on (below it zeronce is mimalloc).
    // 1 GiB (quick) or 2 GiB written per sample. The figure is the reuse rounds' CPU: the
    // first round's (fresh memory: its faults, on a virtual machine the host's, and for a
    // huge-page arena 2 MiB faults) is reported apart, as `first_round_cpu_ms`.
    let hot_mib = a.common.pick(None, 1024, 2048);
    for (mib, name) in [
        (2, "hot_2mib"),
        (4, "hot_4mib"),
        (8, "hot_8mib"),
        (32, "hot_32mib"),
    ] {
        let rounds = (hot_mib / mib).max(20).to_string();
        v.push(step(
            name,
            &["hot", &mib.to_string(), &rounds],
            "cpu_ms",
            false,
        ));
    }
    // The malloc-large pattern: every size past the kept blocks, most not powers of two.
    let iters = a.common.pick(None, 150, 500).to_string();
    v.push(step("large_5_25mib", &["large", &iters], "wall_ms", false));
    if sqlite {
        v.push(Step {
            per_round: short,
            ..step("sqlite_200k", &[], "wall_ms", false)
        });
    }
    v
}

fn has_sqlite3() -> bool {
    Command::new("sqlite3")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `sqlite3` on a fresh database in `dir` with `SQL`; its wall time.
fn sqlite(dir: &Path, preload: Option<&Path>) -> Result<Value, Box<dyn std::error::Error>> {
    let db = dir.join("bench.db");
    let _ = std::fs::remove_file(&db);
    let mut cmd = Command::new("sqlite3");
    cmd.arg(&db).stdin(Stdio::piped()).stdout(Stdio::piped());
    preloaded(&mut cmd, preload);
    let t = Instant::now();
    let mut child = cmd.spawn()?;
    std::io::Write::write_all(&mut child.stdin.take().ok_or("no stdin")?, SQL.as_bytes())?;
    let out = child.wait_with_output()?;
    let wall = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows = stdout.lines().last().unwrap_or("").trim().to_owned();
    if !out.status.success() || rows != "200000" {
        return Err(format!("sqlite3 failed ({}): {rows}", out.status).into());
    }
    Ok(json!({ "workload": "sqlite", "rows": 200_000, "wall_ms": wall.as_secs_f64() * 1e3 }))
}

fn preloaded(cmd: &mut Command, lib: Option<&Path>) {
    match lib {
        Some(l) => cmd.env("LD_PRELOAD", l),
        None => cmd.env_remove("LD_PRELOAD"),
    };
}

/// Per step and contender: the [`contest::summary`]; per step: zeronce's figure over the
/// best peer's and over the best peer that gives memory back (warm medians where samples
/// are judged); the peers that keep freed memory resident.
fn summarise(results: &Results, steps: &[Step]) -> (Value, Value, Vec<String>) {
    let mut out = Map::new();
    // Per step measured: the step, its samples per contender, and each one's figure.
    let mut figures = Vec::new();
    for step in steps {
        let Some(per) = results.get(&step.name) else {
            continue;
        };
        let mut m = Map::new();
        let mut mine: targets::Figures = Vec::new();
        for (contender, samples) in per {
            let mut fields =
                contest::summary(samples, step.figure, warm_in(step), &["minor_faults"]);
            let by = if step.judged {
                "own minor faults and CPU time"
            } else {
                "not judged"
            };
            fields.insert("cold_by".into(), json!(by));
            mine.push((
                *contender,
                fields[&format!("{}_warm_median", step.figure)].as_f64(),
            ));
            m.insert((*contender).into(), Value::Object(fields));
        }
        out.insert(step.name.clone(), Value::Object(m));
        figures.push((step, per, mine));
    }
    let keepers = figures
        .iter()
        .find(|(step, ..)| step.name == "idle_768mib")
        .map(|(.., f)| targets::keepers(f))
        .unwrap_or_default();
    let ratios: Map<String, Value> = figures
        .iter()
        .map(|(step, per, f)| {
            let mut r = targets::over_best(f, &keepers);
            // Beside the ratio of the medians: the same peer, round by round.
            let paired = r["best_peer"].as_str().and_then(|best| {
                let (z, p) = (per.get("zeronce")?, per.get(best)?);
                targets::paired_over(z, p, step.per_round, step.figure, warm_in(step))
            });
            r["paired_ratio_zeronce_over_best_peer"] = json!(paired);
            (step.name.clone(), r)
        })
        .collect();
    (Value::Object(out), Value::Object(ratios), keepers)
}

/// Which samples of `step` count: all of an unjudged step, the warm ones of a judged one.
fn warm_in(step: &Step) -> impl Fn(&Value) -> bool + '_ {
    move |s: &Value| !step.judged || cold_sample(s) != Some(true)
}

/// zeronce's ratio per target beside the target, as an SVG chart.
fn draw(path: &Path, judged: &[Value]) -> BenchResult {
    let rows: Vec<RatioRow> = judged
        .iter()
        .map(|j| {
            let (value, limit) = (j["value"].as_f64(), j["limit"].as_f64());
            // The idle step is in MiB: drawn as a fraction of its allowance.
            let scale = if j["unit"] == "MiB" { limit } else { None };
            let per = |v: Option<f64>| v.map(|v| scale.map_or(v, |s| v / s));
            RatioRow {
                label: j["step"].as_str().unwrap_or("?").to_string(),
                ours: per(value),
                reference: per(limit),
                reference_text: "none".into(),
            }
        })
        .collect();
    let legend = Legend {
        ours: "zeronce / best peer (idle: / allowance)",
        reference: "target",
    };
    plot::ratio_bars(
        path,
        "zeronce bench malloc: ratios (lower is better)",
        &legend,
        &rows,
    )
}

/// Runs the benchmark.
pub fn run(a: &MallocArgs) -> BenchResult {
    let (contenders, mut skipped) = contenders(a);
    let sqlite3 = has_sqlite3();
    if !sqlite3 {
        skipped.push(
            "skipped: sqlite3 not installed (apt-get install sqlite3): no real-program step".into(),
        );
    }
    // On stderr now, and in the report (JSON `skipped`, the table's header lines).
    for s in &skipped {
        eprintln!("{s}");
    }
    let bin = compile()?;
    let dir = bin.parent().unwrap_or(Path::new(".")).to_path_buf();
    let steps = steps(a, sqlite3);
    let samples = a.common.pick(a.samples, 1, 5);
    let names: Vec<&'static str> = contenders.iter().map(|c| c.name).collect();
    // A step sampled more than once a round appears that many times in the schedule, its
    // samples gathered under its one name.
    let schedule: Vec<usize> = (0..steps.len())
        .flat_map(|k| std::iter::repeat_n(k, steps[k].per_round))
        .collect();
    let step_names: Vec<String> = schedule.iter().map(|&k| steps[k].name.clone()).collect();
    let results = contest::interleave(samples, &names, &step_names, |slot, i| {
        let (step, lib) = (&steps[schedule[slot]], contenders[i].lib.as_deref());
        if step.args.is_empty() {
            return sqlite(&dir, lib).map(Some);
        }
        let mut cmd = Command::new(&bin);
        cmd.args(&step.args);
        preloaded(&mut cmd, lib);
        contest::sample(cmd).map(Some)
    });
    let _ = std::fs::remove_dir_all(&dir);
    let (summary, ratios, keepers) = summarise(&results?, &steps);
    let judged = targets::judge(&ratios);
    if let Some(path) = &a.plot {
        draw(path, &judged)?;
    }
    let underneath: Map<String, Value> = contenders
        .iter()
        .map(|c| (c.name.to_string(), json!(c.underneath)))
        .collect();
    let cpu = contest::cpu();
    let report = json!({
        "bench": "malloc", "samples": samples, "quick": a.common.quick,
        "samples_per_round": steps.iter().map(|s| (s.name.clone(), json!(s.per_round))).collect::<Map<_, _>>(),
        "cpu": cpu["model"], "cpu_family": cpu["family"],
        "order": "rotated by one each round (round r starts with contender r mod n)",
        "skipped": skipped, "underneath": underneath,
        "keep_freed_memory": keepers, "targets": judged,
        "ratios": ratios, "steps": summary,
    });
    if a.common.json {
        crate::println!("{report}");
        return Ok(());
    }
    let per_round: Vec<String> = steps
        .iter()
        .map(|s| format!("{} {}", s.name, s.per_round))
        .collect();
    crate::println!(
        "bench malloc{}: {samples} round(s), contenders rotated each round; samples a round: {}",
        if a.common.quick { " (--quick)" } else { "" },
        per_round.join(", ")
    );
    for c in &contenders {
        crate::println!("{:<9} {}", c.name, c.underneath);
    }
    for s in &skipped {
        crate::println!("{s}");
    }
    let figures: Vec<(&str, &str)> = steps.iter().map(|s| (s.name.as_str(), s.figure)).collect();
    contest::print_table(&report["steps"], &figures);
    let f2 = |v: &Value| v.as_f64().map_or("-".into(), |v| format!("{v:.2}"));
    for (step, r) in ratios.as_object().into_iter().flatten() {
        crate::println!(
            "{step:<14} zeronce / best peer ({}) = {} (round by round: {}); / best returning peer ({}) = {}",
            r["best_peer"].as_str().unwrap_or("-"),
            f2(&r["ratio_zeronce_over_best_peer"]),
            f2(&r["paired_ratio_zeronce_over_best_peer"]),
            r["best_returning_peer"].as_str().unwrap_or("-"),
            f2(&r["ratio_zeronce_over_best_returning_peer"]),
        );
    }
    crate::println!(
        "keep more than {} MiB resident 5 s after freeing 768 MiB: {}",
        targets::IDLE_ALLOWANCE_MIB,
        if keepers.is_empty() {
            "none".into()
        } else {
            keepers.join(", ")
        }
    );
    for j in &judged {
        let met = match j["met"].as_bool() {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        crate::println!(
            "target {met:<12} {} = {}",
            j["target"].as_str().unwrap_or("?"),
            f2(&j["value"])
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_skipped_with_how_to_install_it() {
        let a = MallocArgs {
            common: Common {
                quick: true,
                json: false,
            },
            samples: None,
            lib: Some("/nonexistent/libzeronce.so".into()),
            plot: None,
        };
        let (kept, skipped) = contenders(&a);
        assert!(kept.iter().any(|c| c.name == "glibc"));
        assert!(!kept.iter().any(|c| c.name == "zeronce"));
        let line = skipped
            .iter()
            .find(|s| s.contains("libzeronce.so"))
            .unwrap();
        assert!(
            line.starts_with("skipped: ") && line.contains("cargo build"),
            "{line}"
        );
    }

    #[test]
    fn reuse_steps_are_judged_and_the_others_not() {
        let a = MallocArgs {
            common: Common {
                quick: true,
                json: false,
            },
            samples: None,
            lib: None,
            plot: None,
        };
        let s = steps(&a, true);
        let judged: Vec<&str> = s
            .iter()
            .filter(|s| s.judged)
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(judged, ["reuse_0ms", "reuse_100ms", "reuse_3000ms"]);
        assert!(s
            .iter()
            .any(|s| s.name == "sqlite_200k" && s.args.is_empty()));
        assert!(!steps(&a, false).iter().any(|s| s.name == "sqlite_200k"));
    }

    #[test]
    fn the_short_steps_take_three_samples_a_round_and_one_when_quick() {
        let args = |quick| MallocArgs {
            common: Common { quick, json: false },
            samples: None,
            lib: None,
            plot: None,
        };
        const SHORT: [&str; 4] = ["small_2x2", "churn_1t", "churn_threaded", "sqlite_200k"];
        for (quick, short) in [(false, 3), (true, 1)] {
            let steps = steps(&args(quick), true);
            for name in SHORT {
                assert!(steps.iter().any(|s| s.name == name), "{name} missing");
            }
            for s in steps {
                let want = if SHORT.contains(&s.name.as_str()) {
                    short
                } else {
                    1
                };
                assert_eq!(s.per_round, want, "{} (quick: {quick})", s.name);
            }
        }
    }
}
