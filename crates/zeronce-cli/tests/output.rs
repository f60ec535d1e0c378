//! What the `zeronce` program prints for people and for tools: `demo --json` is one JSON
//! object with every step, `--plot` writes a well-formed SVG, `--help` says what the
//! program is.

mod common;

use common::{zeronce, zeronce_json};

/// Minimal well-formedness: one root `<svg>` element, every opened element closed.
fn assert_well_formed_svg(svg: &str) {
    let body = svg.trim();
    let body = body
        .strip_prefix("<?xml")
        .map_or(body, |rest| {
            &rest[rest.find("?>").expect("xml declaration") + 2..]
        })
        .trim();
    assert!(
        body.starts_with("<svg") && body.ends_with("</svg>"),
        "{body:.100}"
    );
    let mut open = Vec::new();
    let mut rest = body;
    while let Some(lt) = rest.find('<') {
        let gt = rest[lt..].find('>').expect("unterminated tag") + lt;
        let tag = &rest[lt + 1..gt];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop(),
                Some(name.trim().to_string()),
                "mismatched </{name}>"
            );
        } else if !tag.ends_with('/') && !tag.starts_with('!') && !tag.starts_with('?') {
            open.push(tag.split_whitespace().next().unwrap_or("").to_string());
        }
        rest = &rest[gt + 1..];
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
}

#[test]
fn demo_json_has_every_step_and_plot_is_an_svg() {
    let dir = common::fresh_dir("out");
    let svg = dir.join("demo.svg");
    let v = zeronce_json(&[&SMALL_DEMO[..], &["--plot", svg.to_str().unwrap()]].concat());
    let steps = v["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 5, "{v}");
    assert_eq!(step4(&v)["blocks_known_zero"], 4, "{v}");
    assert!(
        v["reporting"]["pages_reported"].as_u64() >= Some(2048),
        "{v}"
    );
    assert!(!v.to_string().contains("seed"));
    let text = std::fs::read_to_string(&svg).expect("the plot was written");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_well_formed_svg(&text);
    assert!(text.contains("freed") && text.contains("reported"));
}

#[test]
fn vm_demo_json_counts_each_device_apart_and_what_went_beyond_the_working_set() {
    let v = zeronce_json(&[
        "demo",
        "--json",
        "--mode",
        "vm",
        "--size-mib",
        "256",
        "--working-set-mib",
        "32",
        // Long enough that no reporting pass runs while a device's working set is being
        // written on a loaded machine (a pass then would report a block written after it).
        "--delay-ms",
        "1000",
    ]);
    // Steps 0 (start) to 5: step 4 is the fifth.
    assert_eq!(v["steps"][4]["blocks_known_zero_from_host"], 16, "{v}");
    // Each device reported the working set and one 2 MiB block more: the first the
    // never-written half of the block the last write split (merged with it when freed),
    // the second the never-written rest of its smaller RAM (dirty without a zero promise).
    for key in ["device", "baseline_device"] {
        assert_eq!(v[key]["device"]["pages_reported"], 8704, "{key}: {v}");
        assert_eq!(
            v[key]["reported_beyond_working_set_bytes"],
            2 << 20,
            "{key}: {v}"
        );
    }
    assert!(
        v["device"]["device"]["zero_promises"].as_u64() > Some(0),
        "{v}"
    );
    assert_eq!(v["baseline_device"]["device"]["zero_promises"], 0, "{v}");
}

#[test]
fn demo_text_says_when_the_reporting_pass_is_due_and_when_it_came() {
    let out = zeronce(
        &SMALL_DEMO[..]
            .iter()
            .filter(|a| **a != "--json")
            .copied()
            .collect::<Vec<_>>(),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = |n: &str| {
        text.lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("no step {n}: {text}"))
    };
    // Step 3 may come sooner than the delay after the free (an earlier request started
    // the wait): step 2 promises no more than that.
    assert!(
        line("2. freed it").contains(
            "the next reporting pass is due within about 0.1 s, as a pass comes 0.1 s after \
             the first request since the last pass, which may predate this free"
        ),
        "{text}"
    );
    // Step 3 says in how many passes (at least the one that reported the free).
    let step3 = line("3. background reporter ran");
    let passes = step3
        .split(" s after the free, in ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(passes.is_some_and(|n| n >= 1), "{text}");
}

#[test]
fn debug_log_shows_each_reporting_pass_and_each_batch_the_host_discards() {
    // README: `RUST_LOG=zeronce=debug zeronce demo` shows these.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(SMALL_DEMO)
        .env("RUST_LOG", "zeronce=debug")
        .output()
        .expect("run the zeronce binary");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("report pass"), "{log}");
    let batch = log
        .lines()
        .find(|l| l.contains("host: report batch"))
        .unwrap_or_else(|| panic!("no report batch line: {log}"));
    for field in [
        "blocks=",
        "discarded_bytes=",
        "answered_zero_bytes=",
        "MADV_DONTNEED",
    ] {
        assert!(batch.contains(field), "{field}: {batch}");
    }
}

#[test]
fn help_says_what_the_program_is_without_jargon() {
    let out = zeronce(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("gives free memory back to the host"),
        "{help}"
    );
    for sub in [&["bench", "--help"][..], &["demo", "--help"]] {
        let h = String::from_utf8_lossy(&zeronce(sub).stdout).to_lowercase();
        assert!(!h.contains("seed"), "{h}");
    }
}

/// `HugePages_Free` of /proc/meminfo (0 when absent).
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn bench_seeds_quick_json_has_the_three_tables_and_an_svg() {
    let dir = std::env::temp_dir().join(format!("zeronce-upstream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("upstream.svg");
    let none_reserved = free_huge_pages() == 0;
    let v = zeronce_json(&[
        "bench",
        "seeds",
        "--quick",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(!v.to_string().contains("seed"), "{v}");
    assert_eq!(v["bench"], "upstream");
    assert!(v["machine"]["cpus"].as_u64() >= Some(1), "{v}");
    let designs = v["designs"].as_array().expect("designs");
    let names: Vec<&str> = designs
        .iter()
        .filter_map(|d| d["design"].as_str())
        .collect();
    assert_eq!(names.len(), 3, "{v}");
    for (name, want) in names.iter().zip([
        "free page reporting",
        "skip redundant zeroing",
        "hugetlb pre-zeroing",
    ]) {
        assert!(name.starts_with(want), "{name}");
    }
    for d in designs {
        assert!(d["upstream"].as_str().is_some_and(|u| !u.is_empty()), "{d}");
        let rows = d["rows"].as_array().expect("rows");
        assert!(!rows.is_empty(), "{d}");
        for r in rows {
            assert!(
                r["figure"].is_string() && r["like_for_like"].is_boolean(),
                "{r}"
            );
            assert!(
                r["differences"].as_str().is_some_and(|t| t.len() > 20),
                "{r}"
            );
            assert!(r["published_text"].is_string(), "{r}");
            let hugetlb = r["needs_hugetlb"].as_bool().expect("needs_hugetlb");
            match r["ours"].as_f64() {
                Some(x) => {
                    assert!(x.is_finite() && x >= 0.0, "{r}");
                    assert!(
                        !(hugetlb && none_reserved),
                        "measured without huge pages: {r}"
                    );
                    if let Some(t) = r.get("target") {
                        assert!(t["met"].is_boolean() && t["target"].is_string(), "{r}");
                    }
                }
                None => {
                    let why = r["skipped"]
                        .as_str()
                        .expect("a number or why it is missing");
                    assert!(hugetlb, "only hugetlb rows may be skipped: {r}");
                    assert!(why.starts_with("skipped: "), "{r}");
                    if none_reserved {
                        assert!(why.starts_with("skipped: no huge pages reserved"), "{r}");
                    }
                    assert!(
                        r.get("target").is_none(),
                        "no verdict without a figure: {r}"
                    );
                }
            }
        }
    }
    // The published figures carried over: page_fault1 (THP) 0.998, alloc-once 0.22.
    let published = |d: usize, r: usize| designs[d]["rows"][r]["published"].as_f64().unwrap();
    assert!((published(0, 0) - 0.998).abs() < 0.001, "{v}");
    assert!((published(1, 0) - 0.22).abs() < 0.001, "{v}");
    let text = std::fs::read_to_string(&svg).expect("the plot was written");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_well_formed_svg(&text);
    assert!(text.contains("published") && text.contains("page_fault1"));
}

/// Step 4's blocks are each counted once, by where they came from.
fn step4(v: &serde_json::Value) -> &serde_json::Value {
    let s = &v["steps"][3];
    let parts = ["blocks_known_zero_from_host", "blocks_never_written"]
        .iter()
        .chain(&["blocks_zeroed_ahead_of_time", "blocks_zeroed_by_allocator"])
        .map(|k| s[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}")))
        .sum::<u64>();
    assert_eq!(Some(parts), s["blocks"].as_u64(), "{v}");
    s
}

const SMALL_DEMO: [&str; 8] = [
    "demo",
    "--json",
    "--size-mib",
    "128",
    "--working-set-mib",
    "8",
    "--delay-ms",
    "100",
];

#[test]
fn a_held_block_is_not_counted_as_known_zero_nor_reported_twice() {
    let v = zeronce_json(&[&SMALL_DEMO[..], &["--host", "hold", "--hold-ms", "600000"]].concat());
    let s = step4(&v);
    // Held for ten minutes: nothing discarded, so nothing the host zeroed.
    assert_eq!(s["blocks_known_zero_from_host"], 0, "{v}");
    let r = &v["reporting"];
    assert!(r["pages_reported"].as_u64() >= Some(2048), "{v}");
    // Everything reported is held once, not discarded, and not offered again yet.
    let reported_bytes = r["pages_reported"].as_u64().unwrap() * 4096;
    assert_eq!(v["host"]["held_bytes"], reported_bytes, "{v}");
    assert_eq!(v["host"]["discarded_bytes"], 0, "{v}");
    assert_eq!(r["pages_promised_zero"], 0, "{v}");
    assert_eq!(r["pages_settled"], 0, "{v}");
}

#[test]
fn without_zero_hints_nothing_is_known_zero_from_the_host() {
    let v = zeronce_json(&[&SMALL_DEMO[..], &["--no-zero-hints"]].concat());
    let s = step4(&v);
    assert_eq!(s["blocks_known_zero_from_host"], 0, "{v}");
    assert_eq!(v["reporting"]["pages_promised_zero"], 0, "{v}");
    assert_eq!(v["host"]["answered_zero_bytes"], 0, "{v}");
}

#[test]
fn rss_follow_gives_a_verdict_only_on_the_row_with_a_target() {
    let v = zeronce_json(&["bench", "rss-follow", "--quick", "--json"]);
    let p = &v["policies"];
    assert!(p["linux"]["target_met"].is_null(), "{v}");
    assert!(p["adaptive"]["target_met"].is_boolean(), "{v}");
    assert_eq!(p["adaptive"]["target_met"], v["adaptive_target_met"], "{v}");
}
