//! What `bench peers` and `bench malloc` share: a fresh process per sample, the
//! contenders' order rotated every round, and samples judged cold by what was measured in
//! them (their own minor faults and CPU time), never by their distance from the others.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::{json, Map, Value};

use crate::stats::Summary;

/// CPU time one warm minor fault is allowed (a 4 KiB anonymous fault with the kernel's
/// clear: 1.5–2 µs on this machine family, from `bench peers`' glibc reuse figures).
pub const FAULT_NS: f64 = 2000.0;
/// CPU time per touched 4 KiB page not explained by faults that a warm sample stays
/// under: touching a mapped page costs well under 1 µs; a page the machine's own host
/// took back while idle costs several (an exit to the host and its own fault).
pub const SPARE_NS_PER_PAGE: f64 = 1500.0;

/// The order of `n` contenders in round `round`: rotated by one each round, so each one
/// runs first (right after the previous round's idle pauses) equally often.
pub fn rotation(n: usize, round: usize) -> Vec<usize> {
    (0..n).map(|k| (k + round) % n).collect()
}

/// Whether a sample is cold by its own figures: `cpu_ms` of the timed step, its
/// `minor_faults` and the 4 KiB `pages` it touched. Cold when the CPU time its faults do
/// not explain ([`FAULT_NS`] each) exceeds [`SPARE_NS_PER_PAGE`] per touched page.
pub fn cold(cpu_ms: f64, minor_faults: f64, pages: f64) -> bool {
    if pages <= 0.0 {
        return false;
    }
    let unexplained = cpu_ms * 1e6 - minor_faults * FAULT_NS;
    unexplained / pages > SPARE_NS_PER_PAGE
}

/// [`cold`] of a sample's JSON object (`cpu_ms`, `minor_faults`, `pages_touched`), or
/// `None` when it does not carry them.
pub fn cold_sample(s: &Value) -> Option<bool> {
    let f = |k: &str| s[k].as_f64();
    Some(cold(f("cpu_ms")?, f("minor_faults")?, f("pages_touched")?))
}

/// Samples per step name and contender.
pub type Results = BTreeMap<String, BTreeMap<&'static str, Vec<Value>>>;

/// Runs `samples` rounds of every step for every contender of `names`, the contenders in
/// [`rotation`] order (printed on stderr each round). `run(step, contender)` gives a
/// sample, or `None` when that contender does not run that step.
pub fn interleave(
    samples: usize,
    names: &[&'static str],
    steps: &[String],
    mut run: impl FnMut(usize, usize) -> Result<Option<Value>, Box<dyn std::error::Error>>,
) -> Result<Results, Box<dyn std::error::Error>> {
    let mut results = Results::new();
    for round in 0..samples {
        let order = rotation(names.len(), round);
        let first: Vec<&str> = order.iter().map(|&i| names[i]).collect();
        eprintln!("round {round}: order {}", first.join(", "));
        for (k, step) in steps.iter().enumerate() {
            for &i in &order {
                eprintln!("round {round} {step} {}", names[i]);
                if let Some(s) = run(k, i)? {
                    let per = results.entry(step.clone()).or_default();
                    per.entry(names[i]).or_default().push(s);
                }
            }
        }
    }
    Ok(results)
}

/// Runs one sample; the JSON object on the last line of its stdout.
pub fn sample(mut cmd: Command) -> Result<Value, Box<dyn std::error::Error>> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().ok_or("no output")?;
    Ok(serde_json::from_str(line)?)
}

/// Median of `field` over `samples`.
pub fn median(samples: &[Value], field: &str) -> Option<f64> {
    let v: Vec<f64> = samples.iter().filter_map(|s| s[field].as_f64()).collect();
    Summary::of(&v).map(|s| s.median)
}

/// Median of `field` over the samples `warm` keeps, and the number it leaves out (cold).
pub fn warm_median(
    samples: &[Value],
    field: &str,
    warm: impl Fn(&Value) -> bool,
) -> (Option<f64>, usize) {
    let kept: Vec<Value> = samples.iter().filter(|s| warm(s)).cloned().collect();
    (median(&kept, field), samples.len() - kept.len())
}

/// One contender's summary of a step: `{field}_median` for every numeric field,
/// `{figure}_warm_median`, `cold_samples`, `samples`, and every sample's `figure` and
/// `extra` fields (`{f}_samples`).
pub fn summary(
    samples: &[Value],
    figure: &str,
    warm: impl Fn(&Value) -> bool,
    extra: &[&str],
) -> Map<String, Value> {
    let mut fields = Map::new();
    let keys: Vec<String> = samples
        .first()
        .and_then(Value::as_object)
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    for k in keys.iter().filter(|k| samples[0][k.as_str()].is_number()) {
        fields.insert(format!("{k}_median"), json!(median(samples, k)));
    }
    let (w, cold) = warm_median(samples, figure, warm);
    fields.insert(format!("{figure}_warm_median"), json!(w));
    fields.insert("cold_samples".into(), json!(cold));
    fields.insert("samples".into(), json!(samples.len()));
    for f in std::iter::once(figure).chain(extra.iter().copied()) {
        let each: Vec<Value> = samples.iter().map(|s| s[f].clone()).collect();
        fields.insert(format!("{f}_samples"), json!(each));
    }
    fields
}

/// `a / b`, or null.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    }
}

/// The CPU's model name and family, from `/proc/cpuinfo`.
pub fn cpu() -> Value {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let get = |key: &str| {
        info.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_owned())
    };
    json!({ "model": get("model name"), "family": get("cpu family") })
}

/// Prints `steps` (step → contender → [`summary`]) as a table: for each step and its
/// figure in `figures`, each contender's warm median, its cold count and every sample.
pub fn print_table(steps: &Value, figures: &[(&str, &str)]) {
    crate::println!(
        "(cold: samples that their own page faults and CPU time mark as cold refaults, out \
         of all, in the steps judged so; the warm median leaves them out)"
    );
    crate::println!(
        "{:<14} {:<26} {:>12} {:>6}  {}",
        "step",
        "contender",
        "warm median",
        "cold",
        "samples (figure)"
    );
    for &(step, figure) in figures {
        let Some(per) = steps[step].as_object() else {
            continue;
        };
        for (contender, m) in per {
            let warm = m[format!("{figure}_warm_median")]
                .as_f64()
                .map_or("-".into(), |v| format!("{v:.1}"));
            let each: Vec<String> = m[format!("{figure}_samples")]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_f64().map_or("?".into(), |v| format!("{v:.1}")))
                .collect();
            crate::println!(
                "{step:<14} {contender:<26} {warm:>12} {:>2}/{:<3}  {} ({figure})",
                m["cold_samples"],
                m["samples"],
                each.join(" ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_puts_each_contender_first_once_per_cycle() {
        assert_eq!(rotation(3, 0), [0, 1, 2]);
        assert_eq!(rotation(3, 1), [1, 2, 0]);
        assert_eq!(rotation(3, 2), [2, 0, 1]);
        assert_eq!(rotation(3, 3), [0, 1, 2]);
        let firsts: Vec<usize> = (0..5).map(|r| rotation(5, r)[0]).collect();
        assert_eq!(firsts, [0, 1, 2, 3, 4]);
        for r in 0..7 {
            let mut v = rotation(5, r);
            v.sort_unstable();
            assert_eq!(v, [0, 1, 2, 3, 4], "round {r} runs everyone once");
        }
    }

    /// 256 MiB touched: 65536 pages.
    const PAGES: f64 = 65536.0;

    #[test]
    fn faults_explain_a_warm_fault_in_and_not_a_cold_one() {
        // glibc's 256 MiB reuse: every page faulted, ~110 ms warm, ~300 ms cold.
        assert!(!cold(110.0, PAGES, PAGES));
        assert!(!cold(128.0, PAGES, PAGES));
        assert!(cold(300.0, PAGES, PAGES));
    }

    #[test]
    fn known_zero_reuse_without_faults_is_warm_fast_and_cold_slow() {
        // zeronce's reuse of resident known-zero memory: few faults, ~30 ms warm,
        // ~240 ms when the host took the idle pages back.
        assert!(!cold(30.0, 10.0, PAGES));
        assert!(!cold(37.0, 0.0, PAGES));
        assert!(cold(240.0, 0.0, PAGES));
    }

    #[test]
    fn a_sample_without_its_figures_is_not_judged() {
        assert_eq!(cold_sample(&json!({ "cpu_ms": 5.0 })), None);
        assert!(!cold(1e9, 0.0, 0.0), "no pages touched: nothing to judge");
        let s = json!({ "cpu_ms": 300.0, "minor_faults": 0, "pages_touched": 65536 });
        assert_eq!(cold_sample(&s), Some(true));
    }

    #[test]
    fn summary_counts_cold_samples_and_keeps_them_listed() {
        let s: Vec<Value> = [(30.0, 0), (32.0, 0), (240.0, 0)]
            .iter()
            .map(|&(c, f)| json!({ "cpu_ms": c, "minor_faults": f, "pages_touched": 65536 }))
            .collect();
        let m = summary(
            &s,
            "cpu_ms",
            |s| cold_sample(s) != Some(true),
            &["minor_faults"],
        );
        assert_eq!(m["cold_samples"], json!(1));
        assert_eq!(m["cpu_ms_warm_median"], json!(31.0));
        assert_eq!(m["cpu_ms_median"], json!(32.0));
        assert_eq!(m["cpu_ms_samples"], json!([30.0, 32.0, 240.0]));
        assert_eq!(m["minor_faults_samples"], json!([0, 0, 0]));
    }
}
