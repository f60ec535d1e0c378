//! `zeronce bench alloc` (being built).

use super::{BenchResult, Common};
use clap::Args;

/// Arguments of `zeronce bench alloc`.
#[derive(Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub common: Common,
}

/// Runs the benchmark.
pub fn run(_args: &AllocArgs) -> BenchResult {
    Err("bench alloc is being built".into())
}
