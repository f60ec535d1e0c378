//! `zeronce`: the command-line program.
//!
//! How the system fits together: the repository's `docs/ARCHITECTURE.md`.
//!
//! `zeronce bench <name>` runs one benchmark; every benchmark takes `--quick` (finishes in
//! under 20 s, and says when it shrank sizes) and `--json` (one JSON object on stdout).
#![forbid(unsafe_code)]

mod bench;
mod demo;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// zeronce: return free memory to the host and never zero a page twice.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Process mode end to end: write, free, background reporting, zeroed allocation
    /// served from host-zeroed memory, beside a baseline that zeroes (`--mode vm`: the
    /// same through a virtio-balloon driver and a device thread).
    Demo(demo::DemoArgs),
    /// Run a benchmark.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Bench { which } => bench::run(which),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zeronce: {e}");
            ExitCode::FAILURE
        }
    }
}
