//! What the program tests share: the library under test (built on first use), the
//! programs' compilation, and running them with and without the preload.
#![allow(dead_code)] // each test binary uses a part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The library under test: `ZERONCE_LIB`, else `libzeronce.so` built now (cargo does not
/// build a cdylib for integration tests) in this test's target and profile directory.
pub fn lib() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| match std::env::var_os("ZERONCE_LIB") {
            Some(p) => PathBuf::from(p),
            None => build_lib(),
        })
        .clone()
}

pub fn build_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // <target>/<profile dir>/deps/programs-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let target = profile_dir.parent().expect("the target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "test",
        Some(other) => other,
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "--lib",
            "--profile",
            profile,
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target)
        .status()
        .expect("run cargo to build libzeronce.so");
    assert!(status.success(), "cargo build of libzeronce.so failed");
    let path = profile_dir.join("libzeronce.so");
    assert!(
        path.is_file(),
        "{} is missing after cargo build",
        path.display()
    );
    path
}

/// The full path of `tool`, or a failure saying which package brings it.
pub fn need(tool: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("`{tool}` is not installed: `apt-get install {package}` (.ci/run installs it)")
    })
}

/// A directory of this test's own under cargo's temporary directory.
pub fn workdir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("malloc-programs")
        .join(test);
    std::fs::create_dir_all(&dir).expect("create the test's directory");
    dir
}

/// Compiles `tests/programs/<source>` into `dir` with gcc (or g++ for `.cpp`).
pub fn compile(dir: &Path, source: &str, extra: &[&str]) -> PathBuf {
    let cpp = source.ends_with(".cpp");
    let compiler = if cpp {
        need("g++", "g++")
    } else {
        need("gcc", "gcc")
    };
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(source);
    let stem = source.split('.').next().unwrap_or(source);
    let out = dir.join(if extra.contains(&"-shared") {
        format!("lib{stem}.so")
    } else {
        stem.to_string()
    });
    let status = Command::new(compiler)
        .args(["-O1", "-g", "-pthread", "-Wall"])
        .args(extra)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run the compiler");
    assert!(status.success(), "compiling {}", src.display());
    out
}

/// `cmd` with no allocator settings inherited from the test's environment.
pub fn clean(mut cmd: Command) -> Command {
    cmd.env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ZERONCE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `cmd` with `preload` (a `LD_PRELOAD` value; none: glibc's allocator) and the
/// exit report asked for.
pub fn run(make: &dyn Fn() -> Command, preload: Option<&str>) -> Output {
    command(make, preload).output().expect("run the program")
}

/// The program of `make`, cleaned, with `preload` and the exit report (none: glibc's
/// allocator).
fn command(make: &dyn Fn() -> Command, preload: Option<&str>) -> Command {
    let mut cmd = clean(make());
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p).env("ZERONCE_SHOW_STATS", "1");
    }
    cmd
}

/// [`run`] under zeronce, killed after `secs` seconds: a program the allocator should
/// abort must fail the test, not hang it (a corrupted free list can spin forever).
pub fn run_abort(make: &dyn Fn() -> Command, secs: u64) -> Output {
    run_deadline(make, true, secs)
}

/// [`run_abort`], with the exit report (`ZERONCE_SHOW_STATS=1`, which sends small
/// allocations through the counting path) or without (the fast path).
pub fn run_deadline(make: &dyn Fn() -> Command, report: bool, secs: u64) -> Output {
    let mut cmd = command(make, Some(&lib().to_string_lossy()));
    if !report {
        cmd.env_remove("ZERONCE_SHOW_STATS");
    }
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the program");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().expect("wait for the program").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reap the program");
            panic!(
                "still running after {secs} s (killed); stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect the output")
}

/// The run of `mode` ended in `abort()` (SIGABRT) after exactly one line of the library's
/// starting with `line` opened its stderr, and the program did not go on to say "not
/// detected".
pub fn aborted_with_one_line(out: &Output, mode: &str, line: &str) {
    use std::os::unix::process::ExitStatusExt;
    const SIGABRT: i32 = 6;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(SIGABRT), "{mode}: {stderr}");
    assert!(stderr.starts_with(line), "{mode}: {stderr}");
    let lines = stderr
        .lines()
        .filter(|l| l.starts_with("zeronce: "))
        .count();
    assert_eq!(lines, 1, "{mode}: {stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("not detected"));
}

/// Runs the program on glibc and under libzeronce.so; both succeed with the same output.
/// Returns zeronce's run.
pub fn same_output(make: &dyn Fn() -> Command) -> Output {
    let lib = lib();
    let glibc = run(make, None);
    let ours = run(make, Some(&lib.to_string_lossy()));
    let text = |o: &Output| {
        format!(
            "status {}\nstdout:\n{}\nstderr:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(glibc.status.success(), "on glibc: {}", text(&glibc));
    assert!(
        ours.status.success(),
        "under libzeronce.so: {}",
        text(&ours)
    );
    assert_eq!(
        String::from_utf8_lossy(&glibc.stdout),
        String::from_utf8_lossy(&ours.stdout),
        "the output under libzeronce.so differs; its stderr:\n{}",
        String::from_utf8_lossy(&ours.stderr)
    );
    ours
}

/// How many allocations zeronce served, from the exit reports on `stderr` (summed: every
/// process of a pipeline, and every `fork` child, writes its own).
pub fn large_allocations(out: &Output) -> u64 {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let counts: Vec<u64> = stderr
        .lines()
        .filter(|l| l.starts_with("zeronce: large (zeronce) "))
        .map(|line| {
            line.split(" in ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unreadable report line: {line}"))
        })
        .collect();
    assert!(!counts.is_empty(), "no exit report in stderr:\n{stderr}");
    counts.iter().sum()
}

/// Compiles `tests/programs/<source>`, runs it on glibc and under libzeronce.so (same
/// output), and checks zeronce served at least `served` allocations.
pub fn prints_the_same(source: &str, served: u64) {
    let stem = source.split('.').next().unwrap_or(source);
    let exe = compile(&workdir(stem), source, &[]);
    assert_served(&same_output(&program(&exe, &[])), served);
}

/// zeronce served at least `n` allocations in `out`'s run.
pub fn assert_served(out: &Output, n: u64) {
    let served = large_allocations(out);
    assert!(
        served >= n,
        "zeronce served {served} allocations, expected at least {n}; stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn program(path: &Path, args: &[&str]) -> impl Fn() -> Command {
    let (path, args): (PathBuf, Vec<String>) = (
        path.to_path_buf(),
        args.iter().map(|a| a.to_string()).collect(),
    );
    move || {
        let mut c = Command::new(&path);
        c.args(&args);
        c
    }
}
