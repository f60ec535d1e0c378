//! Benchmarks. Each one measures zeronce against a baseline *in the same run* and reports
//! medians; absolute figures on a shared VM move several-fold, ratios much less.

pub mod stats;

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
pub enum Which {}

/// Error type of the benchmarks: a message for the user.
pub type BenchResult = Result<(), Box<dyn std::error::Error>>;

/// Runs one benchmark.
pub fn run(which: Which) -> BenchResult {
    match which {}
}
