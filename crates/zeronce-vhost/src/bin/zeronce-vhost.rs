//! `zeronce-vhost serve|balloon`: the same verbs as `zeronce serve` / `zeronce balloon`,
//! in a binary of their own (what the real-guest test starts).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use zeronce_vhost::cli::{self, BalloonArgs, ServeArgs};

/// The zeronce virtio-balloon device as a vhost-user back-end.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the balloon device on a vhost-user socket.
    Serve(ServeArgs),
    /// Control a running `serve` (set the target, read status and statistics).
    Balloon(BalloonArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Serve(a) => cli::serve(&a),
        Command::Balloon(a) => cli::balloon(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zeronce-vhost: {e}");
            ExitCode::FAILURE
        }
    }
}
