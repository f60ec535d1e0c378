//! What libzeronce.so must refuse or keep, tried with small C programs under the preload:
//! frees that must abort with one line (a hang fails: each runs under a deadline), frees
//! that must not, heap addresses that differ between runs, the large arena's page size,
//! and a bad setting. The C sources are in `tests/programs/`.

mod common;
use common::*;
use std::process::Command;

#[test]
fn a_double_free_or_an_interior_pointer_aborts_with_one_line() {
    let exe = compile(&workdir("abuse"), "abuse.c", &["-pthread"]);
    let modes = [
        ("double", "free"),
        ("interior", "free"),
        ("huge-double", "free"),
        ("huge-interior", "free"),
        ("aligned-double", "free"),
        ("aligned-interior", "free"),
        ("small-double", "free"),
        ("tiny-double", "free"),
        ("thread-double", "free"),
        ("misaligned", "free"),
        ("realloc-freed", "realloc"),
    ];
    for (mode, call) in modes {
        let out = run_abort(&program(&exe, &[mode]), 60);
        aborted_with_one_line(
            &out,
            mode,
            &format!("zeronce: {call}(): invalid pointer 0x"),
        );
    }
}

#[test]
fn zeronce_thp_0_keeps_large_blocks_in_small_pages_and_the_default_follows_the_machine() {
    let exe = compile(&workdir("thp"), "thp.c", &[]);
    let huge_kib = |thp: Option<&str>| -> i64 {
        let mut cmd = clean(Command::new(&exe));
        cmd.env("LD_PRELOAD", lib());
        if let Some(v) = thp {
            cmd.env("ZERONCE_THP", v);
        }
        let out = cmd.output().expect("run thp");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace()
            .last()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no figure in {text:?}"))
    };
    assert_eq!(huge_kib(Some("0")), 0, "ZERONCE_THP=0: no huge pages");
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if mode.contains("[never]") || mode.is_empty() {
        eprintln!("THP is off on this machine ({mode:?}): the default's huge pages not checked");
        return;
    }
    // With ZERONCE_THP=1 the touched block is in huge pages (at least half of it: its
    // ends need not be 2 MiB-aligned within the arena's blocks).
    assert!(huge_kib(Some("1")) >= 32 << 10, "ZERONCE_THP=1: huge pages");
    // By default too, unless the kernel reports its free memory to a host.
    let reporting = zeronce_lib::reports_free_memory_to_host();
    let default = huge_kib(None);
    if reporting {
        assert_eq!(default, 0, "a reporting guest: small pages by default");
    } else {
        assert!(default >= 32 << 10, "the default arena uses huge pages");
    }
}

#[test]
fn heap_addresses_differ_between_runs() {
    // mimalloc's arenas once started at one fixed address in this build (2 TiB): every
    // run put its small blocks at the same place.
    let exe = compile(&workdir("addr"), "addr.c", &[]);
    let runs: Vec<String> = (0..4)
        .map(|_| {
            let out = run(&program(&exe, &[]), Some(&lib().to_string_lossy()));
            assert!(out.status.success());
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    for which in 0..2 {
        let addrs: std::collections::BTreeSet<&str> = runs
            .iter()
            .map(|r| r.split_whitespace().nth(which).unwrap_or(""))
            .collect();
        assert!(
            addrs.len() > 1,
            "block {which} at one address in 4 runs: {runs:?}"
        );
    }
}

#[test]
fn small_blocks_freed_once_are_never_taken_for_a_double_free() {
    // Blocks handed out again after their free, self-pointing list heads, tiny blocks
    // grown by realloc: each freed once, so none may abort.
    let exe = compile(&workdir("abuse-fine"), "abuse.c", &["-pthread"]);
    let out = run(&program(&exe, &["fine"]), Some(&lib().to_string_lossy()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");
}

#[test]
fn a_bad_setting_is_one_line_on_stderr_and_the_default() {
    let out = clean(Command::new("/bin/true"))
        .env("LD_PRELOAD", lib())
        .env("ZERONCE_THRESHOLD", "lots")
        .output()
        .expect("run /bin/true");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "zeronce: ignoring ZERONCE_THRESHOLD=lots: expected a size such as 2M, 512K or 1G (4K to 1G: zeronce serves nothing larger); using the default\n"
    );
}
