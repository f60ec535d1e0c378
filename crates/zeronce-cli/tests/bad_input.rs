//! Bad input to the `zeronce` program: each case exits non-zero at once with one line on
//! stderr naming the problem (never a panic, never exit 0 with a table of zeros), and
//! `--quick` does not override a flag given explicitly.

mod common;

use std::process::Output;

fn zeronce(args: &str) -> Output {
    common::zeronce(&args.split_whitespace().collect::<Vec<_>>())
}

/// Runs `args`, expects exit code `code` and exactly one line on stderr containing `msg`.
fn refused(args: &str, code: i32, msg: &str) {
    let out = zeronce(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "`zeronce {args}`: {stderr}");
    assert!(
        stderr.contains(msg),
        "`zeronce {args}`: stderr lacks {msg:?}: {stderr}"
    );
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "`zeronce {args}`: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "`zeronce {args}`: {stderr}");
    assert!(out.stdout.is_empty(), "`zeronce {args}` printed results");
}

#[test]
fn zero_runs_rounds_and_repetitions_are_refused() {
    refused(
        "bench prezero --runs 0",
        2,
        "'--runs <RUNS>': must be at least 1",
    );
    refused(
        "bench alloc-once --runs 0",
        2,
        "'--runs <RUNS>': must be at least 1",
    );
    refused(
        "bench churn --rounds 0",
        2,
        "'--rounds <ROUNDS>': must be at least 1",
    );
    refused("bench prezero --pages 0", 2, "'--pages <PAGES>'");
    refused(
        "bench alloc --batch 0",
        2,
        "'--batch <BATCH>': must be at least 1",
    );
}

#[test]
fn an_alloc_batch_that_does_not_fit_is_refused_before_measuring() {
    // 2 threads × 512 blocks of 2 MiB = 2 GiB > the 1 GiB managed.
    refused(
        "bench alloc --batch 512 --repetitions 1 --pairs 1",
        1,
        "--batch 512: 2 thread(s) of 512 blocks of order 9 do not fit in the 262144 pages",
    );
}

#[test]
fn trial_times_that_are_not_finite_are_refused() {
    for bad in ["NaN", "inf", "-1", "0", "1e300"] {
        refused(
            &format!("bench churn --trial-s {bad}"),
            2,
            "greater than 0 and at most 3600",
        );
    }
}

#[test]
fn sizes_that_overflow_are_refused() {
    refused(
        "demo --size-mib 17592186044416 --working-set-mib 2",
        2,
        "too large",
    );
    refused("demo --size-mib 18446744073709551616", 2, "--size-mib");
}

#[test]
fn sizes_too_small_to_show_reporting_are_refused_up_front() {
    refused(
        "demo --size-mib 2 --working-set-mib 2",
        2,
        "too small to show reporting",
    );
    refused(
        "demo --working-set-mib 3",
        2,
        "--working-set-mib 3: the working set is written in 2 MiB blocks, so it must be a \
         positive multiple of 2",
    );
    refused(
        "demo --working-set-mib 0",
        2,
        "--working-set-mib 0: the working set is written in 2 MiB blocks",
    );
    refused(
        "demo --size-mib 64 --working-set-mib 128",
        2,
        "--working-set-mib 128 must not exceed --size-mib 64",
    );
}

#[test]
fn a_working_set_the_vm_cannot_hold_is_refused_up_front() {
    refused(
        "demo --mode vm --size-mib 256 --working-set-mib 256",
        2,
        "does not fit",
    );
    refused("demo --mode vm --host lazy", 2, "process mode");
}

#[test]
fn unknown_commands_and_values_are_one_line() {
    refused("bench nosuch", 2, "unrecognized subcommand");
    refused("demo --budget sometimes", 2, "--budget");
    refused("demo --reporting-order 11", 2, "--reporting-order");
}

#[test]
fn quick_keeps_explicit_flags() {
    let v = common::zeronce_json(&[
        "bench", "prezero", "--quick", "--pages", "2", "--runs", "6", "--gap-ms", "0", "--json",
    ]);
    assert_eq!(v["runs"], 6, "--runs 6 given with --quick (quick alone: 5)");
    assert_eq!(v["pages"], 2);
    assert_eq!(v["gap_ms"], 0);
}

#[test]
fn pool_and_vm_start_arguments_are_checked() {
    refused("bench vm-start --size 3M", 2, "multiple of 2M");
    refused("bench vm-start --runs 0", 2, "must be at least 1");
    refused(
        "pool serve --dir /tmp --files 1 --size 2M --page-size 4M",
        2,
        "2M or 1G",
    );
    refused("pool take --size lots", 2, "is not a size");
    refused(
        "pool stats --socket /nonexistent/zeronce-pool.sock",
        1,
        "is `zeronce pool serve` running?",
    );
}

#[test]
fn bench_peers_without_its_binaries_says_how_to_build_them() {
    let dir = std::env::temp_dir().join(format!("zeronce-no-peers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("release")).expect("create a temporary directory");
    let bin_dir = dir.join("release");
    let args = format!("bench peers --bin-dir {}", bin_dir.display());
    refused(&args, 1, "peer-jemalloc, peer-mimalloc");
    refused(
        &args,
        1,
        &format!(
            "cargo build --release --manifest-path crates/zeronce-peers/Cargo.toml --target-dir {}",
            dir.display()
        ),
    );
    std::fs::remove_dir_all(&dir).expect("remove the temporary directory");
}

#[test]
fn balloon_sizes_name_their_option_and_a_valid_value() {
    refused(
        "serve --socket /nonexistent/v.sock --target 1000",
        2,
        "invalid value '1000' for '--target <TARGET>': 1000 bytes is not a multiple of 4 KiB",
    );
    refused("serve --target 1000", 2, "--target");
    refused("balloon set 1000", 2, "e.g. 4K, 512M, 1G");
    refused(
        "balloon set 4096",
        2,
        "required arguments were not provided: --socket <SOCKET>",
    );
}

#[test]
fn a_demo_of_nothing_blames_its_own_option() {
    refused(
        "demo --size-mib 0",
        2,
        "--size-mib 0: the memory zeronce manages",
    );
}

#[test]
fn a_plot_that_cannot_be_written_is_refused_before_the_run() {
    for cmd in ["demo", "bench rss-follow --quick", "bench upstream --quick"] {
        refused(
            &format!("{cmd} --plot /nonexistent-zeronce-dir/x.svg"),
            2,
            "cannot write /nonexistent-zeronce-dir/x.svg: directory /nonexistent-zeronce-dir \
             does not exist",
        );
    }
    refused("demo --plot /tmp", 2, "/tmp is a directory");
}

/// Runs `zeronce args` with stdout a pipe whose reader is already gone (`| head` that
/// has exited): the first write fails, and the program must end quietly.
fn ends_quietly_on_a_closed_pipe(args: &[&str]) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(writer)
        .output()
        .expect("run the zeronce binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "`zeronce {args:?}`: {stderr}");
    assert!(stderr.is_empty(), "`zeronce {args:?}`: {stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success() || out.status.signal() == Some(13) || out.status.code() == Some(141),
        "`zeronce {args:?}`: {:?}",
        out.status
    );
}

#[test]
fn a_reader_that_went_away_ends_the_program_quietly() {
    ends_quietly_on_a_closed_pipe(&["--help"]);
    ends_quietly_on_a_closed_pipe(&["demo", "--size-mib", "128", "--working-set-mib", "8"]);
    ends_quietly_on_a_closed_pipe(&[
        "bench", "prezero", "--quick", "--pages", "2", "--runs", "1", "--gap-ms", "0", "--json",
    ]);
}

#[test]
fn balloon_pointed_at_the_vhost_user_socket_says_so_and_is_no_front_end() {
    use std::io::{BufRead, BufReader};
    let dir = common::fresh_dir("misdirected");
    let socket = dir.join("v.sock");
    let (socket_s, control_s) = (
        socket.display().to_string(),
        format!("{}.ctl", socket.display()),
    );
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_zeronce"))
        .args(["serve", "--socket", &socket_s])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run zeronce serve");
    let mut line = String::new();
    BufReader::new(daemon.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening"), "{line:?}");
    refused(
        &format!("balloon --socket {socket_s} status"),
        1,
        &format!(
            "{socket_s} is the vhost-user socket of `zeronce serve`, not its control socket: use \
             --socket {control_s}"
        ),
    );
    let status = common::zeronce_json(&["balloon", "--socket", &control_s, "status"]);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status["connections"], 0, "not a front-end: {status}");
    assert_eq!(status["rejected_connections"], 1, "{status}");
}

#[test]
fn balloon_without_a_daemon_says_to_check_that_serve_runs_and_names_the_socket() {
    let socket = common::fresh_dir("nodaemon").join("v.sock.ctl");
    refused(
        &format!("balloon --socket {} status", socket.display()),
        1,
        &format!(
            "cannot reach the control socket {}: No such file or directory (os error 2); is \
             `zeronce serve` running?",
            socket.display()
        ),
    );
    std::fs::remove_dir_all(socket.parent().unwrap()).unwrap();
}

#[test]
fn balloon_pointed_at_something_else_says_it_is_no_control_socket() {
    let dir = common::fresh_dir("notctl");
    let path = dir.join("other.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // A peer that closes every connection at once.
    let peer = std::thread::spawn(move || drop(listener.accept()));
    let out = zeronce(&format!("balloon --socket {} status", path.display()));
    peer.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not a zeronce control socket"),
        "{stderr}"
    );
}
