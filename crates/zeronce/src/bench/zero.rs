//! `zeronce bench zero` (being built).

use super::{BenchResult, Common};
use clap::Args;

/// Arguments of `zeronce bench zero`.
#[derive(Args, Debug)]
pub struct ZeroArgs {
    #[command(flatten)]
    pub common: Common,
}

/// Runs the benchmark.
pub fn run(_args: &ZeroArgs) -> BenchResult {
    Err("bench zero is being built".into())
}
