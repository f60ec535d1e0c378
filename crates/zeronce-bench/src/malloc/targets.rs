//! What `zeronce bench malloc` is judged on: zeronce's figure over the best peer's per
//! step (and over the best peer that gives memory back, where keeping it is what makes
//! a peer fast), the targets, and the peers that keep freed memory resident.

use serde_json::{json, Value};

use crate::contest;

/// Each contender's figure in one step (its warm median; `None`: not measured).
pub type Figures<'a> = Vec<(&'a str, Option<f64>)>;

/// Idle RSS a contender may keep 5 s after freeing 768 MiB (the workload keeps nothing
/// live: its working set is the process's few MiB of code and data).
pub const IDLE_ALLOWANCE_MIB: f64 = 64.0;

/// One target: a step, the most zeronce's figure may be (over the best peer's, or in
/// MiB for the idle step), and what it stands for.
pub struct Target {
    /// The step judged.
    pub step: &'static str,
    /// The most zeronce's figure may be.
    pub limit: f64,
    /// The target in words.
    pub what: &'static str,
    /// `limit` is zeronce's own figure (MiB), not a ratio to the best peer.
    pub absolute: bool,
}

/// The targets, in the order they are printed.
pub const TARGETS: &[Target] = &[
    Target {
        step: "reuse_100ms",
        limit: 0.5,
        what: "large zeroed buffers reused after 100 ms: CPU <= 0.5x the best peer",
        absolute: false,
    },
    Target {
        step: "reuse_0ms",
        limit: 1.05,
        what: "large zeroed buffers reused at once: CPU <= 1.05x the best peer",
        absolute: false,
    },
    Target {
        step: "idle_768mib",
        limit: IDLE_ALLOWANCE_MIB,
        what: "RSS 5 s after freeing 768 MiB <= working set + 64 MiB",
        absolute: true,
    },
    Target {
        step: "small_2x2",
        limit: 1.15,
        what: "small objects, 2 producer/consumer pairs: wall <= 1.15x the best peer",
        absolute: false,
    },
    Target {
        step: "sqlite_200k",
        limit: 1.05,
        what: "a real program (sqlite3 bulk insert): wall <= 1.05x the best peer",
        absolute: false,
    },
    Target {
        step: "hot_2mib",
        limit: 1.05,
        what: "a cache-hot 2 MiB buffer (the default threshold) reused: CPU <= 1.05x the best peer",
        absolute: false,
    },
    Target {
        step: "hot_4mib",
        limit: 1.05,
        what: "a cache-hot 4 MiB buffer reused: CPU <= 1.05x the best peer",
        absolute: false,
    },
    Target {
        step: "hot_8mib",
        limit: 1.05,
        what: "a cache-hot 8 MiB buffer reused: CPU <= 1.05x the best peer",
        absolute: false,
    },
];

/// Contenders whose idle RSS 5 s after the free is over the allowance (`figures`: the
/// idle step's contender → warm median, MiB).
pub fn keepers(figures: &[(&str, Option<f64>)]) -> Vec<String> {
    figures
        .iter()
        .filter(|(_, v)| v.is_some_and(|v| v > IDLE_ALLOWANCE_MIB))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// zeronce's figure over the lowest of the other contenders', and over the lowest of
/// those not in `keepers`.
pub fn over_best(figures: &[(&str, Option<f64>)], keepers: &[String]) -> Value {
    let z = figures.iter().find(|f| f.0 == "zeronce").and_then(|f| f.1);
    let best = |keep: &dyn Fn(&str) -> bool| {
        figures
            .iter()
            .filter(|f| f.0 != "zeronce" && keep(f.0))
            .filter_map(|f| f.1.map(|v| (f.0, v)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    let any = best(&|_| true);
    let returning = best(&|name| !keepers.iter().any(|k| k == name));
    json!({
        "zeronce": z,
        "ratio_zeronce_over_best_peer": contest::ratio(z, any.map(|b| b.1)),
        "best_peer": any.map(|b| b.0),
        "ratio_zeronce_over_best_returning_peer": contest::ratio(z, returning.map(|b| b.1)),
        "best_returning_peer": returning.map(|b| b.0),
    })
}

/// zeronce's figure over a peer's round by round (each round's median of its `per_round`
/// samples, warm ones only), then the median over the rounds: drift of the machine's speed
/// between rounds cancels out of each ratio. `None` without a round where both have a
/// warm sample.
pub fn paired_over(
    zeronce: &[Value],
    peer: &[Value],
    per_round: usize,
    figure: &str,
    warm: impl Fn(&Value) -> bool,
) -> Option<f64> {
    let per_round = per_round.max(1);
    let rounds = zeronce.chunks(per_round).zip(peer.chunks(per_round));
    let ratios: Vec<f64> = rounds
        .filter_map(|(z, p)| {
            let z = contest::warm_median(z, figure, &warm).0?;
            let p = contest::warm_median(p, figure, &warm).0?;
            (p > 0.0).then(|| z / p)
        })
        .collect();
    crate::stats::Summary::of(&ratios).map(|s| s.median)
}

/// Each target against `ratios` (step → [`over_best`]): value, limit, met.
pub fn judge(ratios: &Value) -> Vec<Value> {
    TARGETS
        .iter()
        .filter(|t| ratios.get(t.step).is_some())
        .map(|t| {
            let r = &ratios[t.step];
            let value = if t.absolute {
                r["zeronce"].as_f64()
            } else {
                r["ratio_zeronce_over_best_peer"].as_f64()
            };
            json!({
                "target": t.what, "step": t.step, "value": value, "limit": t.limit,
                "unit": if t.absolute { "MiB" } else { "ratio" },
                "met": value.map(|v| v <= t.limit),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paired_ratio_is_the_median_of_the_rounds_own_ratios() {
        let f = |v: &[f64]| -> Vec<Value> { v.iter().map(|x| json!({ "wall_ms": x })).collect() };
        // Round speeds drift 1x, 2x, 3x; zeronce is 1.1x the peer in each round, and the
        // ratio of the medians (220 / 200) says the same only by luck of the drift.
        let z = f(&[
            110.0, 112.0, 108.0, 220.0, 222.0, 218.0, 330.0, 331.0, 329.0,
        ]);
        let p = f(&[100.0, 99.0, 101.0, 200.0, 201.0, 199.0, 300.0, 302.0, 298.0]);
        let r = paired_over(&z, &p, 3, "wall_ms", |_| true).unwrap();
        assert!((r - 1.1).abs() < 0.002, "{r}");
        // A round without a warm sample of either is left out; none at all: no figure.
        let warm = |s: &Value| s["wall_ms"].as_f64() != Some(300.0);
        let z1 = f(&[110.0, 300.0]);
        let p1 = f(&[100.0, 250.0]);
        assert_eq!(paired_over(&z1, &p1, 1, "wall_ms", warm), Some(1.1));
        assert_eq!(paired_over(&z1[1..], &p1[1..], 1, "wall_ms", warm), None);
    }

    #[test]
    fn the_ratio_is_over_the_best_other_contender_and_the_best_returning_one() {
        let figures = [
            ("glibc", Some(200.0)),
            ("tcmalloc", Some(10.0)),
            ("jemalloc", Some(100.0)),
            ("zeronce", Some(50.0)),
        ];
        let r = over_best(&figures, &["tcmalloc".to_string()]);
        assert_eq!(r["ratio_zeronce_over_best_peer"], json!(5.0));
        assert_eq!(r["best_peer"], json!("tcmalloc"));
        assert_eq!(r["ratio_zeronce_over_best_returning_peer"], json!(0.5));
        assert_eq!(r["best_returning_peer"], json!("jemalloc"));
        let r = over_best(&[("glibc", Some(200.0))], &[]);
        assert_eq!(r["ratio_zeronce_over_best_peer"], Value::Null);
    }

    #[test]
    fn keepers_are_the_contenders_over_the_idle_allowance() {
        let idle = [
            ("glibc", Some(3.0)),
            ("tcmalloc", Some(774.9)),
            ("zeronce", Some(9.1)),
            ("mimalloc", None),
        ];
        assert_eq!(keepers(&idle), ["tcmalloc"]);
    }

    #[test]
    fn targets_are_met_or_not_by_their_own_unit() {
        let ratios = json!({
            "reuse_100ms": { "zeronce": 1.0, "ratio_zeronce_over_best_peer": 0.16 },
            "reuse_0ms": { "zeronce": 7.0, "ratio_zeronce_over_best_peer": 1.2 },
            "idle_768mib": { "zeronce": 9.1, "ratio_zeronce_over_best_peer": 3.0 },
        });
        let judged = judge(&ratios);
        let met: Vec<(&str, Option<bool>)> = judged
            .iter()
            .map(|j| (j["step"].as_str().unwrap(), j["met"].as_bool()))
            .collect();
        assert_eq!(
            met,
            [
                ("reuse_100ms", Some(true)),
                ("reuse_0ms", Some(false)),
                ("idle_768mib", Some(true)),
            ]
        );
    }
}
