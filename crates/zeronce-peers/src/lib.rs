//! The workloads of `zeronce bench peers`, shared by one binary per contender; the
//! binaries differ only in their `#[global_allocator]`. Each run is one sample in a fresh
//! process: `BIN WORKLOAD [ARG]` prints one JSON object on stdout.
//!
//! - `reuse DELAY_MS [IDLE_S]`: write 256 MiB (`vec![0u8; n]`, a byte every 4 KiB), free
//!   it, stay idle `DELAY_MS`, then time `vec![0u8; n]` and its touch; RSS idle, after, and
//!   `IDLE_S` seconds after the second free.
//! - `floor`: the memset-of-resident floor: 256 MiB written, then timed `fill(0)` + touch.
//! - `churn SECS`: 2 threads allocate zeroed buffers of random sizes 1–64 MiB and touch
//!   them for `SECS`; throughput, peak RSS, RSS 5 s after.
//! - `app ROUNDS`: "read" files of 64 MiB into fresh zeroed buffers and hash them.
//!
//! Every timed step reports `idle_ms`, the time its memory sat unused before the clocks
//! started (since the free for `reuse`, the write for `floor`, the process start for
//! `churn` and `app`).
//!
//! What zeronce is and how its crates fit together: the repository's
//! `docs/ARCHITECTURE.md`; the figures: `BENCHMARKS.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod measure;
mod workloads;

pub use measure::{rss_anon_mib, thread_cpu, Timer};

use serde_json::json;

/// Runs the workload named on the command line for `contender`; prints its JSON line.
/// Exits with status 2 on a usage error.
pub fn main(contender: &str) {
    let started = std::time::Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let mut out = match args.first().map(String::as_str) {
        Some("reuse") => workloads::reuse(arg(1, 0), arg(2, 0)),
        Some("floor") => workloads::floor(),
        Some("churn") => workloads::churn(arg(1, 10), started),
        Some("app") => workloads::app(arg(1, 16), started),
        _ => {
            eprintln!(
                "usage: {contender} reuse DELAY_MS [IDLE_S] | floor | churn SECS | app ROUNDS"
            );
            std::process::exit(2);
        }
    };
    out["contender"] = json!(contender);
    println!("{out}");
}
