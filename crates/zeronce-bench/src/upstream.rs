//! `zeronce bench upstream` (also `bench seeds`): the headline tables of the three upstream series zeronce builds
//! on, with our figures from this run beside the published ones:
//!
//! * Linux free page reporting (Duyck, v16.1; merged as `mm/page_reporting.c`):
//!   will-it-scale page_fault1 (THP) / page_fault2 with reporting on and off;
//! * the 2026 "skip redundant zeroing of host-zeroed pages" series (Tsirkin, v7): 256 MB
//!   allocated zeroed, task-clock without and with the host's zero hints;
//! * the 2026 "hugetlb pre-zeroing" series (Li Zhe): a VM backed by 64 × 1 GiB hugetlb
//!   pages starts in ~16 s when the kernel zeroes at fault, in negligible time pre-zeroed.
//!
//! Every figure comes from the benchmark that measures it (`churn`, `alloc-once`,
//! `prezero`, `vm-start`), run here with smaller sizes so the whole finishes in under
//! two minutes; each row says how the measurement differs from the published one and
//! whether the two are like for like. A verdict is printed only where a target applies.
//! Hugetlb rows run only when 2 MiB huge pages are reserved (and, for `vm-start`, a
//! hugetlbfs mount is given); otherwise they say "skipped: ...".

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use crate::common::{BenchResult, Common};
use crate::plot::{self, RatioRow};
use crate::target::Target;
use crate::{alloc_once, churn, prezero, vm_start};

/// Arguments of `zeronce bench upstream`.
#[derive(Args, Debug)]
pub struct UpstreamArgs {
    /// `--quick` and `--json`.
    #[command(flatten)]
    pub common: Common,
    /// Also draw our ratios beside the published ones as an SVG bar chart.
    #[arg(long, value_name = "FILE.svg", value_parser = crate::plot::writable_path)]
    pub plot: Option<PathBuf>,
    /// A hugetlbfs mount of 2 MiB pages for the VM-start rows (default:
    /// $ZERONCE_HUGETLBFS_2M).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// How our measurement relates to the published one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Comparison {
    /// The same quantity measured the same way (same ratio, same kind of workload).
    LikeForLike,
    /// The same ratio, but the workload or the clock differs (said in the row).
    SameKind,
    /// Only the direction compares (different quantity, machine or scale).
    NotComparable,
    /// The series publishes no such figure.
    OursOnly,
}

impl Comparison {
    fn label(self) -> &'static str {
        match self {
            Comparison::LikeForLike => "like for like",
            Comparison::SameKind => "same ratio, different setup",
            Comparison::NotComparable => "not like for like",
            Comparison::OursOnly => "no published figure",
        }
    }
}

/// One row of a design's table.
struct Row {
    figure: &'static str,
    /// Our value, or why it was not measured ("skipped: ...").
    ours: Result<f64, String>,
    unit: &'static str,
    /// Extra figures behind ours (absolute times, rates).
    detail: String,
    published: Option<f64>,
    published_text: &'static str,
    comparison: Comparison,
    differences: &'static str,
    target: Option<Target>,
    /// Needs reserved 2 MiB huge pages (skipped without them).
    hugetlb: bool,
}

/// One upstream series and its rows.
struct Design {
    name: &'static str,
    upstream: &'static str,
    published_setup: &'static str,
    rows: Vec<Row>,
}

fn num(v: &Value) -> Result<f64, String> {
    v.as_f64()
        .filter(|x| x.is_finite())
        .ok_or_else(|| match v["skipped"].as_str() {
            Some(s) => s.to_string(),
            None => "skipped: not measured".to_string(),
        })
}

/// `sec[key]`, or the section's own "skipped" reason.
fn field(sec: &Value, key: &str) -> Result<f64, String> {
    match sec["skipped"].as_str() {
        Some(why) => Err(why.to_string()),
        None => num(&sec[key]),
    }
}

/// Free page reporting: `churn` at order 9 (page_fault1 with THP) and order 0
/// (page_fault2), one thread, a 100 ms delay so passes run inside every trial.
fn free_page_reporting(c: Common) -> Result<Design, Box<dyn std::error::Error>> {
    let plan = churn::Plan {
        rounds: c.pick(None, 2, 5),
        trial: Duration::from_secs_f64(c.pick(None, 0.2, 0.5)),
        delays: vec![Duration::from_millis(100)],
        configs: vec![(9, 1), (0, 1)],
    };
    let out = churn::measure(&plan, c, false)?;
    let configs = &out["delays"][0]["configurations"];
    let row = |k: usize, figure, published: f64, published_text, differences| {
        let cfg = &configs[k];
        Row {
            figure,
            ours: num(&cfg["ratio_linux_over_disabled"]),
            unit: "ratio",
            detail: format!(
                "{:.0} vs {:.0} iterations/s; adaptive budget {:.3}; passes per trial {}",
                cfg["linux_per_s"]["median"].as_f64().unwrap_or(f64::NAN),
                cfg["disabled_per_s"]["median"].as_f64().unwrap_or(f64::NAN),
                cfg["ratio_adaptive_over_disabled"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                cfg["linux_passes_per_trial"]
            ),
            published: Some(published),
            published_text,
            comparison: Comparison::SameKind,
            differences,
            target: Some(churn::TARGET),
            hugetlb: false,
        }
    };
    Ok(Design {
        name: "free page reporting",
        upstream: "Linux free page reporting (Duyck, v16.1; merged as mm/page_reporting.c)",
        published_setup: "will-it-scale, 1 task, guest with 32 GiB on one node of an E5-2630 v3, \
                          reporting enabled vs baseline",
        rows: vec![
            row(
                0,
                "page_fault1 (THP): throughput, reporting on / off",
                1_010_227.5 / 1_012_402.5,
                "1010227.5 vs 1012402.5 iterations = 0.998",
                "process mode: reports go to this process's kernel (MADV_DONTNEED), not to a \
                 hypervisor; zeronce's allocate-zeroed / touch / free loop on 2 MiB blocks, not \
                 will-it-scale's faults; 100 ms reporting delay (Linux: 2 s) so passes land in \
                 every trial; ratio of medians over rounds",
            ),
            row(
                1,
                "page_fault2: throughput, reporting on / off",
                359_749.25 / 361_855.25,
                "359749.25 vs 361855.25 iterations = 0.994",
                "as above, with 4 KiB blocks (order 0) for page_fault2's small pages",
            ),
        ],
    })
}

/// Skip redundant zeroing: `alloc-once`, (b) allocate + touch is the series' test.
fn skip_redundant_zeroing(c: Common) -> Result<Design, Box<dyn std::error::Error>> {
    let plan = alloc_once::Plan {
        arena: c.pick(None, 512 << 20, 2 << 30),
        size: c.pick(None, 64 << 20, 256 << 20),
        runs: c.pick(None, 3, 4),
        gap: Duration::from_millis(c.pick(None, 50, 200)),
    };
    let out = alloc_once::measure(&plan, c)?;
    let detail = |sec: &Value| {
        let ms = |m: &str| sec[m]["cpu_ms"]["median"].as_f64().unwrap_or(f64::NAN);
        if sec.is_null() {
            String::new()
        } else {
            format!(
                "optimized {:.2} ms vs baseline {:.2} ms CPU ({} MiB)",
                ms("optimized"),
                ms("baseline"),
                plan.size >> 20
            )
        }
    };
    let clocks = "process mode (the kernel discards and zeroes, not a host); thread CPU time of \
                  the allocation step, not whole-process perf task-clock in a 1-vCPU VM; the touch \
                  refaults the discarded memory, so the kernel's fault zeroing stays on our clock \
                  (in the series it was the host's, outside the guest)";
    let row = |backing: &str,
               variant: &str,
               figure,
               (published, published_text),
               comparison,
               differences,
               target| {
        let sec = &out[backing];
        Row {
            figure,
            ours: field(sec, "arena_bytes")
                .and_then(|_| num(&sec[variant]["ratio_cpu_optimized_over_baseline"])),
            unit: "ratio",
            detail: detail(&sec[variant]),
            published: Some(published),
            published_text,
            comparison,
            differences,
            target,
            hugetlb: backing == "hugetlb",
        }
    };
    Ok(Design {
        name: "skip redundant zeroing (host-zeroed page hints)",
        upstream: "the 2026 \"skip redundant zeroing of host-zeroed pages\" series (Tsirkin, v7)",
        published_setup:
            "2 GiB VM, 1 vCPU, 256 MB of anonymous memory allocated and touched, perf \
                          task-clock, baseline vs optimized",
        rows: vec![
            row(
                "thp",
                "b_alloc_touch",
                "THP: allocate zeroed + touch, CPU optimized / baseline",
                (51.0 / 232.0, "51 ± 26 ms vs 232 ± 20 ms = 0.22"),
                Comparison::SameKind,
                clocks,
                None,
            ),
            row(
                "thp",
                "a_alloc_only",
                "THP: allocate zeroed only (no touch), CPU optimized / baseline",
                (51.0 / 232.0, "0.22 (their test touches every page)"),
                Comparison::NotComparable,
                "what skipping the memset saves alone: the series' test always touches, so its \
                 figure includes the refault this row leaves out",
                Some(Target::AtMost(0.1)),
            ),
            row(
                "hugetlb",
                "b_alloc_touch",
                "hugetlb 2 MiB: allocate zeroed + touch, CPU optimized / baseline",
                (
                    65.0 / 219.0,
                    "hugetlb surplus pages: 65 ± 34 ms vs 219 ± 23 ms = 0.30",
                ),
                Comparison::SameKind,
                clocks,
                None,
            ),
        ],
    })
}

/// Hugetlb pre-zeroing: `vm-start` (hugetlbfs files, the VMM's view) and `prezero` (the
/// in-process pool).
fn hugetlb_prezeroing(
    c: Common,
    dir: Option<&std::path::Path>,
) -> Result<Design, Box<dyn std::error::Error>> {
    let mut rows = vm_start_rows(c, dir);
    rows.extend(pool_rows(c)?);
    Ok(Design {
        name: "hugetlb pre-zeroing",
        upstream: "the 2026 \"hugetlb pre-zeroing\" series (Li Zhe; zeroable_hugepages)",
        published_setup: "Skylake, v6.19-rc2, a VM backed by 64 × 1 GiB hugetlb pages faulted in: \
                          ~16 s (~250 ms per page) without pre-zeroing, negligible with",
        rows,
    })
}

/// The VM-start rows of the hugetlb pre-zeroing table (`bench vm-start`'s figures).
fn vm_start_rows(c: Common, dir: Option<&std::path::Path>) -> Vec<Row> {
    let vm = vm_start_or_skip(c, dir);
    let vm_field = |k: &str| vm.as_ref().map_err(Clone::clone).and_then(|v| num(&v[k]));
    let vm_ms = |mode: &str| {
        vm.as_ref()
            .ok()
            .and_then(|v| v["modes"][mode]["ready_wall_ms"]["median"].as_f64())
            .unwrap_or(f64::NAN)
    };
    let size_gib = vm
        .as_ref()
        .ok()
        .and_then(|v| v["size_bytes"].as_f64())
        .unwrap_or(f64::NAN)
        / f64::from(1u32 << 30);
    vec![
        Row {
            figure: "VM start: time to ready, pre-zeroed pool file / kernel fault-in",
            ours: vm_field("ratio_prezeroed_over_fault_in"),
            unit: "ratio",
            detail: format!(
                "{:.2} ms vs {:.2} ms for {size_gib:.2} GiB",
                vm_ms("pool_prezeroed"),
                vm_ms("fault_in_1t")
            ),
            published: None,
            published_text: "16 s → negligible (≈ 0)",
            comparison: Comparison::SameKind,
            differences: "hugetlbfs files of 2 MiB pages, not 1 GiB, and far less memory \
                          than 64 GiB; pre-zeroed by zeronce's pool daemon in \
                          user space (not the kernel's zeroable_hugepages), map + \
                          MADV_POPULATE_WRITE instead of a VM's faults",
            target: Some(vm_start::RATIO_TARGET),
            hugetlb: true,
        },
        Row {
            figure: "kernel fault-in (zeroing at fault), ms per GiB",
            ours: vm_field("ratio_prezeroed_over_fault_in")
                .map(|_| vm_ms("fault_in_1t") / size_gib),
            unit: "ms/GiB",
            detail: String::new(),
            published: Some(250.0),
            published_text: "~250 ms per 1 GiB page",
            comparison: Comparison::NotComparable,
            differences: "absolute time on another CPU (Skylake vs this VM's EPYC), 2 MiB pages \
                          instead of 1 GiB: only the order of magnitude compares",
            target: None,
            hugetlb: true,
        },
        Row {
            figure: "background zeroing rate / streaming-zero bandwidth",
            ours: vm_field("prezero_rate_over_stream_bandwidth"),
            unit: "ratio",
            detail: vm
                .as_ref()
                .map(|v| {
                    format!(
                        "{:.1} vs {:.1} GB/s",
                        v["prezero_gb_per_s"].as_f64().unwrap_or(f64::NAN),
                        v["stream_zero_gb_per_s"].as_f64().unwrap_or(f64::NAN)
                    )
                })
                .unwrap_or_default(),
            published: None,
            published_text: "—",
            comparison: Comparison::OursOnly,
            differences: "the pool's zeroer page by page against one streaming pass over \
                          populated hugetlb memory, paired per run",
            target: Some(vm_start::RATE_TARGET),
            hugetlb: true,
        },
    ]
}

/// The in-process pool rows of the hugetlb pre-zeroing table (`bench prezero`'s figures).
fn pool_rows(c: Common) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let plan = prezero::Plan {
        pages: c.pick(None, 64, 256),
        runs: c.pick(None, 3, 5),
        gap: Duration::from_millis(c.pick(None, 20, 200)),
    };
    let pz = prezero::measure(&plan, c)?;
    let pz_row = |backing: &str, figure| {
        let sec = &pz[backing];
        let ours = field(sec, "ratio_alloc_prezeroed_over_inline").and_then(|_| {
            field(&sec["kernel_fault"], "pages_zeroed_by_allocation")
                .map_err(|why| format!("skipped: kernel_fault {why}"))
                .and_then(|_| num(&sec["ratio_alloc_prezeroed_over_kernel_fault"]))
        });
        Row {
            figure,
            ours,
            unit: "ratio",
            detail: format!(
                "like for like (same populated pool, zeroed inline instead): {:.3}; {} x 2 MiB",
                sec["ratio_alloc_prezeroed_over_inline"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                plan.pages
            ),
            published: None,
            published_text: "16 s → negligible (≈ 0)",
            comparison: Comparison::NotComparable,
            differences: "a pool inside one process (zeronce::HugePagePool), CPU time of allocate \
                          zeroed + touch; 2 MiB pages, far less memory than 64 GiB; no VM",
            target: None,
            hugetlb: backing == "hugetlb",
        }
    };
    Ok(vec![
        pz_row(
            "thp",
            "in-process pool (THP): pre-zeroed / kernel fault, allocate + touch",
        ),
        pz_row(
            "hugetlb",
            "in-process pool (hugetlb 2 MiB): pre-zeroed / kernel fault, allocate + touch",
        ),
    ])
}

/// `vm-start` with this run's sizes, or why it could not run ("skipped: ...").
fn vm_start_or_skip(c: Common, dir: Option<&std::path::Path>) -> Result<Value, String> {
    let size: u64 = c.pick(None, 64 << 20, 256 << 20);
    if let Some(why) = crate::common::hugetlb_skip(2 * size / (2 << 20)) {
        return Err(why);
    }
    let dir = vm_start::mount(dir).map_err(|e| format!("skipped: no hugetlbfs mount: {e}"))?;
    let plan = vm_start::Plan {
        size,
        runs: c.pick(None, 2, 5),
        gap: Duration::from_millis(c.pick(None, 50, 300)),
        dir,
    };
    vm_start::measure(&plan, c.quick).map_err(|e| format!("skipped: {e}"))
}

fn row_json(r: &Row) -> Value {
    let mut v = json!({
        "figure": r.figure,
        "unit": r.unit,
        "detail": r.detail,
        "published": r.published,
        "published_text": r.published_text,
        "comparison": r.comparison.label(),
        "like_for_like": r.comparison == Comparison::LikeForLike,
        "differences": r.differences,
        "needs_hugetlb": r.hugetlb,
    });
    match &r.ours {
        Ok(x) => v["ours"] = json!(x),
        Err(why) => {
            v["ours"] = Value::Null;
            v["skipped"] = json!(why);
        }
    }
    if let (Some(t), Ok(x)) = (r.target, &r.ours) {
        v["target"] = t.to_json(*x);
    }
    v
}

/// `cpu family`, `model name` and the load average: which machine, how busy.
fn machine() -> Value {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let get = |key: &str| {
        info.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    json!({
        "cpu_family": get("cpu family"),
        "model_name": get("model name"),
        "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "load_average": std::fs::read_to_string("/proc/loadavg").ok()
            .and_then(|l| l.split_whitespace().next().and_then(|x| x.parse::<f64>().ok())),
    })
}

fn print(designs: &[Design]) {
    for d in designs {
        println!("\n== {} — {}", d.name, d.upstream);
        println!("   published: {}", d.published_setup);
        for r in &d.rows {
            let ours = match &r.ours {
                Ok(x) if r.unit == "ratio" => format!("{x:.3}"),
                Ok(x) => format!("{x:.1} {}", r.unit),
                Err(why) => why.clone(),
            };
            let verdict = match (r.target, &r.ours) {
                (Some(t), Ok(x)) => format!(" — {}", t.verdict(*x)),
                _ => String::new(),
            };
            println!("  * {}", r.figure);
            println!(
                "      ours {ours}{}{verdict}",
                if r.detail.is_empty() || r.ours.is_err() {
                    String::new()
                } else {
                    format!(" ({})", r.detail)
                }
            );
            println!(
                "      published {} [{}]",
                r.published_text,
                r.comparison.label()
            );
            println!("      differs: {}", r.differences);
        }
    }
}

/// Runs the benchmark.
pub fn run(args: &UpstreamArgs) -> BenchResult {
    let c = args.common;
    let started = Instant::now();
    let before = machine();
    if !c.json {
        println!(
            "bench upstream{}: the three upstream series' headline figures beside ours, measured now \
             (machine: cpu family {}, {}, load average {})",
            if c.quick { " (--quick)" } else { "" },
            before["cpu_family"].as_str().unwrap_or("?"),
            before["model_name"].as_str().unwrap_or("?"),
            before["load_average"]
        );
    }
    let designs = [
        free_page_reporting(c)?,
        skip_redundant_zeroing(c)?,
        hugetlb_prezeroing(c, args.dir.as_deref())?,
    ];
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(path) = &args.plot {
        let rows: Vec<RatioRow> = designs
            .iter()
            .flat_map(|d| d.rows.iter())
            .filter(|r| r.unit == "ratio")
            .map(|r| RatioRow {
                label: r.figure.to_string(),
                ours: r.ours.as_ref().ok().copied(),
                reference: r.published,
                reference_text: r.published_text.to_string(),
            })
            .collect();
        plot::ratio_bars(
            path,
            "zeronce vs the upstream series (ratios, this run)",
            &plot::Legend {
                ours: "ours (this run)",
                reference: "published",
            },
            &rows,
        )?;
    }
    if c.json {
        let out = json!({
            "bench": "upstream",
            "quick": c.quick,
            "elapsed_s": elapsed,
            "machine": before,
            "load_average_after": machine()["load_average"],
            "designs": designs.iter().map(|d| json!({
                "design": d.name,
                "upstream": d.upstream,
                "published_setup": d.published_setup,
                "rows": d.rows.iter().map(row_json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{out}");
        return Ok(());
    }
    print(&designs);
    println!(
        "\n{elapsed:.0} s; load average at the end {} (ratios are from the same run; absolute \
         figures on a shared machine move several-fold)",
        machine()["load_average"]
    );
    Ok(())
}
