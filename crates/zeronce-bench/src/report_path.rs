//! `zeronce bench report-path`: the same memory reported through three paths in the same
//! run, all on a memfd discarded by punch hole — (a) process mode (the process discards its
//! own memory), (b) VM mode with the
//! device in a thread (driver → virtqueue in guest RAM → device → punch hole in the
//! memfd), (c) VM mode with the device in a `zeronce serve` process, reached over
//! vhost-user (rust-vmm `vhost`'s front-end: eventfd kicks, call eventfds, the memfd
//! shared with `SET_MEM_TABLE`). Each run writes SIZE in 2 MiB blocks, frees them and
//! times one `flush` (every free block reported now); paths are interleaved per run.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Map, Value};
use zeronce::zeronce_mem::BackingKind;
use zeronce::zeronce_mm::reporting::PassReport;
use zeronce::{
    DeviceHost, Order, PageBlock, ProcessMemory, ReportingConfig, ReportingSetup, VmMemory,
};

use crate::common::{at_least_one, BenchResult, Common};
use crate::served::ServedDevice;
use crate::stats::Summary;

/// Arguments of `zeronce bench report-path`.
#[derive(Args, Debug)]
pub struct ReportPathArgs {
    /// `--quick` and `--json`.
    #[command(flatten)]
    pub common: Common,
    /// MiB written, freed and reported per run (default 1024; --quick 128).
    #[arg(long, value_parser = at_least_one)]
    pub size_mib: Option<usize>,
    /// Runs per path (default 5; --quick 2).
    #[arg(long, value_parser = at_least_one)]
    pub runs: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Process,
    VmThread,
    VmVhostUser,
}

impl Path {
    const ALL: [Path; 3] = [Path::Process, Path::VmThread, Path::VmVhostUser];

    fn name(self) -> &'static str {
        match self {
            Path::Process => "process",
            Path::VmThread => "vm_thread",
            Path::VmVhostUser => "vm_vhost_user",
        }
    }
}

/// One flush: seconds and bytes reported.
#[derive(Clone, Copy, Debug)]
struct Sample {
    secs: f64,
    bytes: u64,
}

/// Room beyond the reported memory (rings, the watermark gate's share).
const HEADROOM: usize = 64 << 20;

fn reporting() -> ReportingConfig {
    ReportingConfig {
        // Only the timed flush reports.
        delay: Duration::from_secs(3600),
        ..ReportingConfig::default()
    }
}

/// Writes `n` 2 MiB blocks, frees them, times the flush that reports them.
fn dirty_then_flush(
    alloc: impl Fn(Order) -> Result<PageBlock, zeronce::BlockError>,
    flush: impl FnOnce() -> PassReport,
    n: usize,
) -> Result<Sample, Box<dyn std::error::Error>> {
    let order = Order::new(9)?;
    let mut blocks = Vec::with_capacity(n);
    for _ in 0..n {
        let mut b = alloc(order)?;
        b.as_mut_slice().fill(0x5A);
        blocks.push(b);
    }
    drop(blocks);
    let t0 = Instant::now();
    let r = flush();
    let secs = t0.elapsed().as_secs_f64();
    if let Some(e) = r.error {
        return Err(format!("the reporting pass failed: {e}").into());
    }
    Ok(Sample {
        secs,
        bytes: r.stats.pages * 4096,
    })
}

fn one_run(
    path: Path,
    size: usize,
    vhost: &DeviceHost,
) -> Result<Sample, Box<dyn std::error::Error>> {
    let n = size >> 21;
    let arena = size + HEADROOM;
    match path {
        Path::Process => {
            // The same backing as VM mode (a memfd, discarded by punch hole), so that the
            // paths differ only in how a report travels.
            let pm = ProcessMemory::builder()
                .size(arena)
                .backing(BackingKind::Memfd)
                .fresh_is_zero(true)
                .reporting(ReportingSetup {
                    config: reporting(),
                    ..ReportingSetup::default()
                })
                .build()?;
            dirty_then_flush(|o| pm.alloc(o), || pm.flush(u64::MAX), n)
        }
        Path::VmThread | Path::VmVhostUser => {
            let host = if path == Path::VmThread {
                DeviceHost::Thread
            } else {
                vhost.clone()
            };
            let vm = VmMemory::builder()
                .size(arena)
                .reporting(reporting())
                .device(host)
                .build()?;
            dirty_then_flush(|o| vm.alloc(o), || vm.flush(u64::MAX), n)
        }
    }
}

/// Runs the benchmark.
pub fn run(args: &ReportPathArgs) -> BenchResult {
    let c = args.common;
    let size = c.pick(args.size_mib, 128, 1024) << 20;
    let runs = c.pick(args.runs, 2, 5);
    if size < 2 << 20 || !size.is_multiple_of(2 << 20) {
        return Err("--size-mib must be a positive multiple of 2".into());
    }
    let daemon = ServedDevice::start("report-path", true)?;
    let vhost = daemon.host();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); Path::ALL.len()];
    for _ in 0..runs {
        for (i, p) in Path::ALL.iter().enumerate() {
            samples[i].push(one_run(*p, size, &vhost)?);
        }
    }
    drop(daemon);

    let secs = |i: usize| Summary::of(&samples[i].iter().map(|s| s.secs).collect::<Vec<_>>());
    let med = |i: usize| secs(i).map_or(f64::NAN, |s| s.median);
    let mib_s = |i: usize| {
        let bytes = samples[i].iter().map(|s| s.bytes).max().unwrap_or(0) as f64;
        bytes / (1 << 20) as f64 / med(i)
    };
    let ratio_vhost = med(2) / med(0);
    let ratio_thread = med(1) / med(0);
    if c.json {
        let mut paths = Map::new();
        for (i, p) in Path::ALL.iter().enumerate() {
            paths.insert(
                p.name().into(),
                json!({
                    "flush_secs": secs(i).map(Summary::to_json),
                    "bytes_reported": samples[i].iter().map(|s| s.bytes).max(),
                    "mib_per_s": mib_s(i),
                }),
            );
        }
        println!(
            "{}",
            json!({
                "bench": "report-path",
                "quick": c.quick,
                "size_bytes": size,
                "runs": runs,
                "paths": Value::Object(paths),
                "ratio_vhost_user_over_process": ratio_vhost,
                "ratio_thread_over_process": ratio_thread,
                "target_ratio_vhost_user_over_process": 1.5,
                "method": "per run and path: write size_bytes in 2 MiB blocks, free, time one flush (all free blocks reported: every path on a memfd discarded by punch hole; process mode discards directly, VM modes through the driver and the virtqueue); paths interleaved per run; medians",
            })
        );
        return Ok(());
    }
    if c.quick {
        println!(
            "(--quick: {} MiB, {runs} runs; full: 1024 MiB, 5 runs)",
            size >> 20
        );
    }
    println!(
        "report-path: {} MiB written, freed and reported in one flush, {runs} runs, medians",
        size >> 20
    );
    for (i, p) in Path::ALL.iter().enumerate() {
        println!(
            "  {:<14} flush {:>8.1} ms   {:>8.0} MiB/s   ({} MiB reported)",
            p.name(),
            med(i) * 1e3,
            mib_s(i),
            samples[i].iter().map(|s| s.bytes).max().unwrap_or(0) >> 20
        );
    }
    println!("  ratio vhost-user / process = {ratio_vhost:.2} (target <= 1.5); thread / process = {ratio_thread:.2}");
    Ok(())
}
