//! `zeronce`: the command-line program.
//!
//! How the system fits together: the repository's `docs/ARCHITECTURE.md`.
//!
//! `zeronce bench <name>` runs one benchmark; every benchmark takes `--quick` (smaller
//! default sizes; explicit flags still win) and `--json` (one JSON object on stdout).
#![forbid(unsafe_code)]

/// std's `println!` with one difference: a closed stdout (`zeronce … | head`) ends the
/// program quietly instead of panicking ([`stdout::write`]). Defined before the modules,
/// so it is the `println!` every module of this crate uses.
macro_rules! println {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// std's `print!`, through [`stdout::write`] like this crate's `println!`.
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}

mod bench;
mod demo;
mod exec;
mod plot;
mod pool;
mod stdout;
mod vhost;

use clap::error::ErrorKind;
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
        Err(e) => return usage_error(e),
    };
    // A daemon logs its progress; the other commands only what went wrong.
    let default_level = match cli.command {
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
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Bench { which } => bench::run(which),
        Command::Serve(args) => zeronce_vhost::cli::serve(&args).map_err(Into::into),
        Command::Balloon(args) => zeronce_vhost::cli::balloon(&args).map_err(Into::into),
        Command::Pool { cmd } => pool::run(cmd),
        Command::Exec(args) => exec::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zeronce: {e}");
            if e.is::<UsageError>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Arguments that parse but cannot work together (found before anything runs): exit
/// code 2, like a parse error.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Help and version go to stdout as clap renders them; a usage error becomes one line on
/// stderr and exit code 2.
fn usage_error(e: clap::Error) -> ExitCode {
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.exit_code() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        };
    }
    // clap's first paragraph, on one line: it may continue on indented lines (the
    // missing arguments, the possible values).
    let text = e.render().to_string();
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let line = first.join(" ");
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    eprintln!(
        "zeronce: {} (see --help)",
        if line.is_empty() {
            "invalid arguments"
        } else {
            line
        }
    );
    ExitCode::from(2)
}
