//! What every benchmark shares: the options `--quick` and `--json`, the value parsers of
//! their sizing flags, the result type, and the check that skips a hugetlb measurement
//! when too few huge pages are free.

use clap::Args;

/// Options every benchmark takes.
#[derive(Args, Clone, Copy, Debug)]
pub struct Common {
    /// Smaller default sizes and fewer runs: a quick look, not a headline (the README says
    /// how long each bench takes with it). Flags given explicitly still win; the table's
    /// first line (or the JSON) says what was used.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Common {
    /// The value of a sizing flag: what the user gave, else the `--quick` default, else
    /// the full default.
    pub fn pick<T>(self, given: Option<T>, quick: T, full: T) -> T {
        given.unwrap_or(if self.quick { quick } else { full })
    }
}

/// Parses a count that must be at least 1 (runs, rounds, repetitions, pages).
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number: {e}")),
    }
}

/// Parses a time in seconds: a finite number greater than 0 and at most an hour.
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("not a number: {e}"))?;
    if v.is_finite() && v > 0.0 && v <= 3600.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds greater than 0 and at most 3600".into())
    }
}

/// Parses a time in milliseconds, at most a minute.
pub fn millis(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if v <= 60_000 => Ok(v),
        Ok(_) => Err("must be at most 60000 (one minute)".into()),
        Err(e) => Err(format!("not a whole number of milliseconds: {e}")),
    }
}

/// Why a hugetlb measurement needing `needed` free 2 MiB huge pages cannot run now, or
/// `None` when enough are free. Benchmarks never reserve pages themselves. The text
/// starts with "skipped: " (tools match on it).
pub fn hugetlb_skip(needed: u64) -> Option<String> {
    let available =
        zeronce::zeronce_mem::HugetlbPoolCounters::read(2 << 20).map_or(0, |p| p.available());
    let how = format!("needs {needed} free 2 MiB huge pages: echo N > /proc/sys/vm/nr_hugepages");
    match available {
        0 => Some(format!("skipped: no huge pages reserved ({how})")),
        n if n < needed => Some(format!("skipped: only {n} huge pages free ({how})")),
        _ => None,
    }
}

/// Error type of the benchmarks: a message for the user.
pub type BenchResult = Result<(), Box<dyn std::error::Error>>;
