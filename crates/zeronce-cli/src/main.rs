//! `zeronce`: the command-line program. It parses the command line and dispatches:
//!
//! - `demo` (module `demo`): process or VM mode end to end, step by step;
//! - `bench <name>` (module `bench`): the benchmarks of the `zeronce-bench` crate; every
//!   one takes `--quick` (smaller default sizes; explicit flags still win) and `--json`
//!   (one JSON object on stdout);
//! - `serve`, `balloon`: the vhost-user device and its control verbs (`zeronce-vhost`);
//! - `pool ...` (module `pool`): the pre-zeroed huge-page file pool (`zeronce-pool`);
//! - module `exit`: the exit codes, and each failure as one line on stderr.
//!
//! How the system fits together: the repository's `docs/ARCHITECTURE.md`.
#![forbid(unsafe_code)]

/// The benchmarks' `println!` (`zeronce_bench::stdout`): a closed stdout (`zeronce … |
/// head`) ends the program quietly instead of panicking. Defined before the modules, so
/// it is the `println!` every module of this crate uses.
macro_rules! println {
    ($($arg:tt)*) => {
        zeronce_bench::println!($($arg)*)
    };
}

mod bench;
mod demo;
mod exec;
mod exit;
mod pool;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// zeronce: an allocator that gives free memory back to the host (free page reporting)
/// and never zeroes a page twice (host-zeroed page hints, pre-zeroed huge pages).
///
/// This program shows it working (`demo`) and measures it against baselines in the same
/// run (`bench`). Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=zeronce=debug) for more.
#[derive(Parser)]
#[command(version)]
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
    /// Serve the balloon device as a vhost-user back-end (for a VMM or User Mode Linux)
    /// until SIGINT / SIGTERM.
    Serve(zeronce_vhost::cli::ServeArgs),
    /// Control a running `serve` through its control socket: set the target, read the
    /// status and the guest's statistics.
    Balloon(zeronce_vhost::cli::BalloonArgs),
    /// Pre-zeroed huge pages for VMMs: a daemon keeping hugetlbfs files ready, and its
    /// client verbs (docs/POOL_PROTOCOL.md).
    Pool {
        #[command(subcommand)]
        cmd: pool::PoolCmd,
    },
    /// Run a program with libzeronce.so preloaded (`zeronce exec -- PROGRAM ARGS…`): its
    /// large allocations come from zeronce's process mode, the rest from mimalloc.
    Exec(exec::ExecArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return exit::parse_error(e),
    };
    logging(&cli.command);
    exit::of(match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Bench { which } => bench::run(which),
        Command::Serve(args) => zeronce_vhost::cli::serve(&args).map_err(Into::into),
        Command::Balloon(args) => zeronce_vhost::cli::balloon(&args).map_err(Into::into),
        Command::Pool { cmd } => pool::run(cmd),
        Command::Exec(args) => exec::run(&args),
    })
}

/// Log lines on stderr, `RUST_LOG` choosing which: by default a daemon logs its
/// progress, the other commands only what went wrong.
fn logging(command: &Command) {
    let default_level = match command {
        Command::Pool {
            cmd: pool::PoolCmd::Serve(_),
        } => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, never into a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
