//! Benchmarks. Each one measures zeronce against a baseline *in the same run* and reports
//! medians; absolute figures on a shared VM move several-fold, ratios much less.

pub mod alloc;
pub mod alloc_once;
pub mod churn;
pub mod peers;
pub mod prezero;
pub mod progress;
pub mod report_path;
pub mod rss_follow;
pub mod stats;
pub mod target;
pub mod upstream;
pub mod vm_start;
pub mod zero;

use clap::{Args, Subcommand};

/// Options every benchmark takes.
#[derive(Args, Clone, Copy, Debug)]
pub struct Common {
    /// Smaller default sizes and fewer runs: finishes in under 20 s. Flags given
    /// explicitly still win; the banner says what was used.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Common {
    /// The value of a sizing flag: what the user gave, else the `--quick` default, else
    /// the full default.
    pub fn pick<T>(self, given: Option<T>, quick: T, full: T) -> T {
        given.unwrap_or(if self.quick { quick } else { full })
    }
}

/// Parses a count that must be at least 1 (runs, rounds, repetitions, pages).
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number: {e}")),
    }
}

/// Parses a time in seconds: a finite number greater than 0 and at most an hour.
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("not a number: {e}"))?;
    if v.is_finite() && v > 0.0 && v <= 3600.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds greater than 0 and at most 3600".into())
    }
}

/// Parses a time in milliseconds, at most a minute.
pub fn millis(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if v <= 60_000 => Ok(v),
        Ok(_) => Err("must be at most 60000 (one minute)".into()),
        Err(e) => Err(format!("not a whole number of milliseconds: {e}")),
    }
}

/// Why a hugetlb measurement needing `needed` free 2 MiB huge pages cannot run now, or
/// `None` when enough are free. Benchmarks never reserve pages themselves. The text
/// starts with "skipped: " (tools match on it).
pub fn hugetlb_skip(needed: u64) -> Option<String> {
    let available =
        zeronce::zeronce_mem::HugetlbPoolCounters::read(2 << 20).map_or(0, |p| p.available());
    let how = format!("needs {needed} free 2 MiB huge pages: echo N > /proc/sys/vm/nr_hugepages");
    match available {
        0 => Some(format!("skipped: no huge pages reserved ({how})")),
        n if n < needed => Some(format!("skipped: only {n} huge pages free ({how})")),
        _ => None,
    }
}

/// The benchmarks.
#[derive(Subcommand)]
pub enum Which {
    /// GB/s of each zeroing kernel and of memset, 2 MiB chunks and 256 MiB, warm memory.
    Zero(zero::ZeroArgs),
    /// alloc+free pairs per second, orders 0/3/9, 1 and 2 threads, vs buddy_system_allocator.
    Alloc(alloc::AllocArgs),
    /// The "skip redundant zeroing" series' alloc-once test in process mode: 256 MiB zeroed after free + report.
    AllocOnce(alloc_once::AllocOnceArgs),
    /// The free page reporting series' page_fault1/2 in spirit: alloc/touch/free throughput, reporting off/on.
    Churn(churn::ChurnArgs),
    /// RSS after freeing 4 GiB: Linux budget vs adaptive budget.
    RssFollow(rss_follow::RssFollowArgs),
    /// zeronce as the global allocator vs glibc, jemalloc and mimalloc: a fresh process per sample (its workload binaries are built apart; it says how when they are missing).
    Peers(peers::PeersArgs),
    /// The hugetlb pre-zeroing series: allocate 1 GiB of huge pages zeroed, pool pre-zeroed or not.
    Prezero(prezero::PrezeroArgs),
    /// 1 GiB reported through process mode, VM mode (device thread) and VM mode over vhost-user (device in `zeronce serve`).
    ReportPath(report_path::ReportPathArgs),
    /// Huge pages ready for a guest: kernel fault-in (1 / all threads) vs a pool file
    /// zeroed at take vs pre-zeroed (hugetlbfs mount: $ZERONCE_HUGETLBFS_2M or --dir).
    VmStart(vm_start::VmStartArgs),
    /// The three upstream series' headline tables (free page reporting, skip redundant
    /// zeroing, hugetlb pre-zeroing): our figures from this run beside the published ones.
    #[command(alias = "seeds")]
    Upstream(upstream::UpstreamArgs),
}

/// Error type of the benchmarks: a message for the user.
pub type BenchResult = Result<(), Box<dyn std::error::Error>>;

/// Runs one benchmark.
pub fn run(which: Which) -> BenchResult {
    match which {
        Which::Zero(args) => zero::run(&args),
        Which::Alloc(args) => alloc::run(&args),
        Which::AllocOnce(args) => alloc_once::run(&args),
        Which::Churn(args) => churn::run(&args),
        Which::RssFollow(args) => rss_follow::run(&args),
        Which::Prezero(args) => prezero::run(&args),
        Which::ReportPath(args) => report_path::run(&args),
        Which::VmStart(args) => vm_start::run(&args),
        Which::Peers(args) => peers::run(&args),
        Which::Upstream(args) => upstream::run(&args),
    }
}
