//! `zeronce bench <name>`: the benchmarks' subcommands and their dispatch; the benchmarks
//! themselves are the `zeronce-bench` crate.

use clap::Subcommand;
use zeronce_bench::common::BenchResult;
use zeronce_bench::{
    alloc, alloc_once, churn, malloc, peers, prezero, report_path, rss_follow, upstream, vm_start,
    zero,
};

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
    /// libzeronce.so vs glibc, jemalloc, mimalloc and tcmalloc under LD_PRELOAD: one C workload compiled with cc, a fresh process per sample (missing peers are skipped with their apt package).
    Malloc(malloc::MallocArgs),
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
        Which::Malloc(args) => malloc::run(&args),
        Which::Upstream(args) => upstream::run(&args),
    }
}
