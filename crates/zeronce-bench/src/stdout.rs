//! Everything the program prints on stdout goes through [`write()`] (this crate's `println!`
//! and `print!`, which the `zeronce` program uses too, call it).
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader has gone (`zeronce demo | head
//! -2`) fails with EPIPE, and std's `println!` panics on that. Here the program ends
//! quietly instead, the way Unix tools do: by SIGPIPE's default action (a shell reports
//! status 141). Sockets are not affected: their writes still return EPIPE as an error.

use std::io::{self, Write};

/// Writes `args` to stdout; when stdout cannot be written, ends the program (quietly if
/// its reader has gone, with a one-line error otherwise).
pub fn write(args: std::fmt::Arguments<'_>) {
    if let Err(e) = io::stdout().lock().write_fmt(args) {
        gone(&e);
    }
}

fn gone(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        // Dies by SIGPIPE as a C program would; the exit is the fallback should the
        // signal not end the process.
        let _ = signal_hook::low_level::emulate_default_handler(signal_hook::consts::SIGPIPE);
        std::process::exit(141);
    }
    eprintln!("zeronce: cannot write to stdout: {e}");
    std::process::exit(1);
}
