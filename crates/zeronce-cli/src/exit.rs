//! How the program ends: exit code 0, 1 for a failure at run time, 2 for bad arguments
//! (a parse error or [`UsageError`]), each failure as one line on stderr.

use clap::error::ErrorKind;
use std::process::ExitCode;

/// The exit code of a command's `result`; a failure is said on stderr.
pub fn of(result: Result<(), Box<dyn std::error::Error>>) -> ExitCode {
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
pub fn parse_error(e: clap::Error) -> ExitCode {
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
