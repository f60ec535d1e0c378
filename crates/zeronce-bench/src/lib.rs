//! The benchmarks of the `zeronce` program (`zeronce bench <name>`). Each one measures
//! zeronce against a baseline *in the same run* and reports medians; absolute figures on
//! a shared VM move several-fold, ratios much less.
//!
//! Every benchmark is a module with its command-line arguments (a clap `Args` type) and a
//! `run` that measures and prints (a table, or one JSON object with `--json`); the
//! `zeronce` program parses the command line and calls `run`. How the system fits
//! together: the repository's `docs/ARCHITECTURE.md`.
//!
//! Also here, because the demo shares them with the benchmarks: [`plot`] (`--plot
//! FILE.svg`), [`served`] (the device in a `zeronce serve` child process) and [`stdout`]
//! (printing that ends quietly when its reader has gone).

/// std's `println!` with one difference: a closed stdout (`zeronce … | head`) ends the
/// program quietly instead of panicking ([`stdout::write`]). Defined before the modules,
/// so it is the `println!` every module of this crate uses; the `zeronce` program's
/// `println!` calls it too.
#[macro_export]
macro_rules! println {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// std's `print!`, through [`stdout::write`] like this crate's `println!`.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}

pub mod common;
pub mod contest;
pub mod plot;
pub mod served;
pub mod stdout;

mod progress;
mod stats;
mod target;

pub mod alloc;
pub mod alloc_once;
pub mod churn;
pub mod malloc;
pub mod peers;
pub mod prezero;
pub mod report_path;
pub mod rss_follow;
pub mod upstream;
pub mod vm_start;
pub mod zero;
