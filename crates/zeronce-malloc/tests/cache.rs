//! The thread caches of small blocks (`src/ffi/cache.rs`), tried with a C program under
//! the preload (`tests/programs/cache.c`): blocks moving between threads never handed out
//! twice, ended threads' caches given back, `fork` while blocks move, and the static
//! thread-local storage the caches' fast path stands on.

mod common;
use common::*;
use std::process::Command;

/// Runs `cache MODE` under the library, with the exit report and without (small calls take
/// another path then); it checks itself and prints one line.
fn cache_mode(mode: &str, expect: &str) {
    let exe = compile(&workdir(&format!("cache-{mode}")), "cache.c", &[]);
    for report in [false, true] {
        let out = run_deadline(&program(&exe, &[mode]), report, 120);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(expect),
            "cache {mode} (report {report}): {:?}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn blocks_freed_by_other_threads_come_back_once_and_intact() {
    cache_mode("pairs", "blocks checked");
}

#[test]
fn an_ended_threads_cache_goes_back() {
    cache_mode("exit", "RSS grew under 64 MiB");
}

#[test]
fn fork_while_blocks_move_between_threads_leaves_children_working() {
    cache_mode("fork", "children finished");
}

/// The caches reach their thread-local lists at one offset from the thread pointer,
/// right only for the static TLS block: the library must say `STATIC_TLS`.
#[test]
fn the_librarys_thread_locals_are_in_the_static_tls_block() {
    let readelf = need("readelf", "binutils");
    let out = Command::new(readelf)
        .arg("-d")
        .arg(lib())
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let flags = text
        .lines()
        .find(|l| l.contains("(FLAGS)"))
        .unwrap_or_else(|| panic!("no FLAGS entry in\n{text}"));
    assert!(flags.contains("STATIC_TLS"), "{flags}");
}
