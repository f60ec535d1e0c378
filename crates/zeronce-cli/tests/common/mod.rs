//! Helpers shared by the tests of the `zeronce` program (each test file uses some).
#![allow(dead_code)]

pub mod pool;

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs `zeronce` with `args` (RUST_LOG unset: the program's default log level).
pub fn zeronce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the zeronce binary")
}

/// Runs `zeronce` with `args`, asserts it succeeded, and parses its stdout as one JSON
/// object.
pub fn zeronce_json(args: &[&str]) -> serde_json::Value {
    let out = zeronce(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "`zeronce {}`: {stdout}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("one JSON object")
}

/// An empty directory of its own for a test (`name` and this process's id).
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zeronce-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}
