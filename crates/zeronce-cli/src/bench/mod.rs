//! Benchmarks. Each one measures zeronce against a baseline *in the same run* and reports
//! medians; absolute figures on a shared VM move several-fold, ratios much less.

pub mod alloc;
pub mod alloc_once;
pub mod churn;
pub mod prezero;
pub mod rss_follow;
pub mod stats;
pub mod zero;

use clap::{Args, Subcommand};

/// Options every benchmark takes.
#[derive(Args, Clone, Copy, Debug)]
pub struct Common {
    /// Smaller sizes and fewer runs: finishes in under 20 s (the output says so).
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
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
    /// The hugetlb pre-zeroing series: allocate 1 GiB of huge pages zeroed, pool pre-zeroed or not.
    Prezero(prezero::PrezeroArgs),
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
    }
}
