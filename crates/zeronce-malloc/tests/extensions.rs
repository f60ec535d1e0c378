//! glibc's allocator extensions (`malloc_trim`, `mallinfo2`, `mallinfo`, `malloc_stats`,
//! `malloc_info`, `mallopt`) and C23's sized frees under `LD_PRELOAD=libzeronce.so`: each
//! name must resolve to the library (glibc's would trim and describe its own idle heap) and
//! do what the README says; a sized free that does not match its block aborts with one
//! line. The C source is `tests/programs/extensions.c`.

mod common;
use common::*;

#[test]
fn glibcs_extensions_are_the_librarys_and_trim_gives_a_freed_block_back_at_once() {
    let exe = compile(&workdir("extensions"), "extensions.c", &["-ldl"]);
    let out = run(&program(&exe, &[]), Some(&lib().to_string_lossy()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for name in [
        "malloc_trim",
        "mallinfo2",
        "mallinfo",
        "malloc_stats",
        "malloc_info",
        "mallopt",
        "free_sized",
        "free_aligned_sized",
    ] {
        assert!(
            stdout.contains(&format!("{name}: zeronce\n")),
            "{name} is not the library's:\n{stdout}"
        );
    }
    assert!(!stdout.contains("fail"), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("malloc_trim returned 1, rss dropped by 200 MiB or more: ok"),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("malloc_trim of small blocks returned 1, rss dropped by 50 MiB or more: ok"),
        "{stdout}"
    );
    assert!(stdout.contains("malloc_info(1): EINVAL"), "{stdout}");
    assert!(stdout.ends_with("sized frees: ok\n"), "{stdout}");
    // `malloc_stats` wrote the report (and the exit report followed it): two of them.
    let reports = stderr
        .lines()
        .filter(|l| l.starts_with("zeronce: large (zeronce) "))
        .count();
    assert_eq!(reports, 2, "{stderr}");
}

#[test]
fn a_sized_free_that_does_not_match_its_block_aborts_with_one_line() {
    let exe = compile(&workdir("extensions-abuse"), "extensions.c", &["-ldl"]);
    for (mode, line) in [
        ("bad-size", "zeronce: free_sized(): invalid size for 0x"),
        (
            "bad-small-size",
            "zeronce: free_sized(): invalid size for 0x",
        ),
        (
            "bad-align",
            "zeronce: free_aligned_sized(): invalid size for 0x",
        ),
    ] {
        let out = run_abort(&program(&exe, &[mode]), 60);
        aborted_with_one_line(&out, mode, line);
    }
}
