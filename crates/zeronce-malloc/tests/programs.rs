//! Real programs under `LD_PRELOAD=libzeronce.so`, each compared with its own run on
//! glibc's allocator: C programs written here (large zeroed buffers, realloc, small
//! churn, threads, fork from a multi-threaded parent, the C rules, allocation in a
//! constructor that runs before ours), a C++ program, and programs
//! nobody here wrote (`python3` with NumPy, with threads and a `fork` pool, `sqlite3`, `xz`,
//! `sort`, `perl`, Lua, `zstd`, `redis-server` with `redis-benchmark`). The C and C++ sources are in
//! `tests/programs/`, compiled with gcc/g++ at test time.
//!
//! A missing tool fails its test saying what to install (`.ci/run` installs them). What
//! the library must refuse (frees that abort) and its settings are in `misuse.rs`.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn a_c_program_of_large_and_small_blocks_and_threads_prints_the_same() {
    // 8 callocs, the realloc chain, 4 threads x 60 blocks.
    let exe = compile(&workdir("large"), "large.c", &[]);
    let out = same_output(&program(&exe, &[]));
    assert_served(&out, 8 + 240);
    // The chain 3 -> 4 -> ... -> 64 MiB in a fresh arena grows in place where the buddies
    // are free, and the report counts what those grows added.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("zeronce: large (zeronce) "))
        .unwrap_or_else(|| panic!("no report: {stderr}"));
    let grows: u64 = line
        .split(" reallocs grown in place")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no grows in the report: {line}"));
    assert!(grows >= 1, "no realloc grew in place: {line}");
    assert!(!line.contains(", 0 B more"), "grows added nothing: {line}");
}

#[test]
fn fork_from_a_multithreaded_parent_leaves_every_child_a_working_allocator() {
    prints_the_same("fork.c", 1);
}

#[test]
fn threads_that_exit_and_a_dlopened_library_with_thread_local_storage() {
    let dir = workdir("dlopen");
    let tls = compile(&dir, "tlslib.c", &["-shared", "-fPIC"]);
    let exe = compile(&dir, "dlopen.c", &[]);
    let ours = same_output(&program(&exe, &[&tls.to_string_lossy()]));
    // 200 callocs of 3 MiB, less the first round's three that raced the arena's creation
    // (mimalloc serves a large allocation while another thread creates the arena).
    assert_served(&ours, 197);
}

#[test]
fn the_library_itself_loaded_with_dlopen_serves_calls_through_dlsym() {
    let dir = workdir("selfload");
    let exe = compile(&dir, "selfload.c", &[]);
    for scope in ["local", "global"] {
        // Not preloaded: the program is glibc's, the library arrives while threads run.
        let out = clean(Command::new(&exe))
            .arg(lib())
            .arg(scope)
            .output()
            .expect("run selfload");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{scope}: {:?}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.trim(),
            format!("loaded {scope}, 4 threads through dlsym: ok, own malloc: glibc")
        );
    }
}

#[test]
fn one_large_allocation_costs_the_block_not_the_allocators_tables() {
    prints_the_same("rss.c", 1);
}

#[test]
fn blocks_above_zeronces_largest_and_aligned_past_2_mib_print_the_same() {
    // Of the aligned ones, zeronce serves all but the 1 GiB-aligned block of 1 GiB and a
    // page (larger than its largest block): 3 + 2.
    prints_the_same("huge.c", 5);
}

#[test]
fn the_c_rules_match_glibc() {
    prints_the_same("edge.c", 0);
}

#[test]
fn aligned_alloc_of_a_non_power_of_two_is_einval() {
    // glibc 2.36 rounds the alignment up; C11 DR 460 and glibc >= 2.38 say EINVAL.
    let exe = compile(&workdir("edge-strict"), "edge.c", &[]);
    let out = run(&program(&exe, &["strict"]), Some(&lib().to_string_lossy()));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "aligned_alloc(3, 64): NULL errno EINVAL\naligned_alloc(24, 8M): NULL errno EINVAL\n"
    );
}

#[test]
fn allocation_in_a_constructor_before_ours_is_served() {
    let dir = workdir("early");
    let early = compile(&dir, "early.c", &["-shared", "-fPIC"]);
    let exe = compile(&dir, "main.c", &[]);
    let lib = lib();
    // Later in LD_PRELOAD is initialised first: early.so's constructor runs before ours.
    let with = |preload: String, stats: bool| {
        let mut c = clean(Command::new(&exe));
        c.env("LD_PRELOAD", preload);
        if stats {
            c.env("ZERONCE_SHOW_STATS", "1");
        }
        c.output().expect("run the program")
    };
    let glibc = with(early.display().to_string(), false);
    let ours = with(format!("{}:{}", lib.display(), early.display()), true);
    assert!(glibc.status.success() && ours.status.success(), "{ours:?}");
    assert_eq!(
        String::from_utf8_lossy(&glibc.stdout),
        "constructor: zeroed 1\nmain: ok\n"
    );
    assert_eq!(glibc.stdout, ours.stdout);
    // The calloc and the realloc of the constructor (gcc drops main's unused malloc).
    assert_served(&ours, 2);
}

#[test]
fn a_cpp_program_of_large_vectors_prints_the_same() {
    prints_the_same("vectors.cpp", 20);
}

#[test]
fn numpy_large_zeroed_arrays_print_the_same() {
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.is_file(),
        "/usr/bin/python3 is missing: `apt-get install python3`"
    );
    let has_numpy = Command::new(python).args(["-c", "import numpy"]).status();
    assert!(
        has_numpy.is_ok_and(|s| s.success()),
        "NumPy is not installed for /usr/bin/python3: `apt-get install python3-numpy` (.ci/run installs it)"
    );
    let script = r#"
import numpy as np
for i in range(4):
    a = np.zeros(256 << 20, dtype=np.uint8)
    a[::4096] += i + 1
    b = a[: 32 << 20].astype(np.float32)
    print(i, int(a.sum()), float(b.sum()), int(np.count_nonzero(a)))
    del a, b
c = np.ones((1024, 1024)) @ np.arange(1024 * 8, dtype=np.float64).reshape(1024, 8)
print(c.sum(), np.zeros((3000, 3000)).sum())
"#;
    let make = move || {
        let mut c = Command::new("/usr/bin/python3");
        c.args(["-c", script]);
        c
    };
    let ours = same_output(&make);
    assert_served(&ours, 8);
}

#[test]
fn numpy_arrays_only_read_are_not_zeroed_again_nor_made_resident() {
    // `np.zeros(n).sum()` in a loop: each array is `calloc`ed, only read (the kernel's zero
    // page behind every page) and freed. The free looks at the page tables, finds no page
    // written, and the block goes back known zero: the next array needs no memset, and
    // the arrays never become resident (glibc maps and unmaps each one).
    let python = Path::new("/usr/bin/python3");
    let script = r#"
import numpy as np
total = 0.0
for i in range(8):
    total += np.zeros(16 << 20).sum()
print(total)
"#;
    let make = move || {
        let mut c = Command::new(python);
        c.args(["-c", script]);
        c
    };
    let ours = same_output(&make);
    let stderr = String::from_utf8_lossy(&ours.stderr);
    let skipped = stderr
        .lines()
        .find_map(|l| l.strip_prefix("zeronce: memsets skipped "))
        .unwrap_or_else(|| panic!("no memset line in the report:\n{stderr}"));
    // "<bytes> (<skipped> of <zeroed> zeroed allocations); ..."
    let counts: Vec<&str> = skipped
        .split(['(', ')'])
        .nth(1)
        .map(|c| c.split(' ').collect())
        .unwrap_or_default();
    assert!(
        counts.len() > 2 && counts[0] == counts[2],
        "an array only read was zeroed again: {skipped}"
    );
    let peak_mib: f64 = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("zeronce: process peak RSS (VmHWM, large and small together) ")
        })
        .and_then(|rest| rest.strip_suffix(" MiB"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS line in the report:\n{stderr}"));
    assert!(
        peak_mib < 128.0,
        "peak RSS {peak_mib} MiB: a 128 MiB array became resident"
    );
}

#[test]
fn sqlite3_on_a_generated_database_prints_the_same() {
    let sqlite = need("sqlite3", "sqlite3");
    let sql = r#"
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL, b BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000)
INSERT INTO t SELECT x, printf('name-%d', x * 7919 % 100003), x * 0.5, zeroblob(x % 300) FROM c;
CREATE INDEX t_name ON t(name);
SELECT count(*), sum(v), sum(length(b)) FROM t;
SELECT name FROM t ORDER BY name LIMIT 3;
SELECT length(group_concat(name)) FROM t;
SELECT length(zeroblob(8000000)), hex(substr(zeroblob(8000000), 1, 4));
UPDATE t SET name = upper(name) WHERE id % 3 = 0;
SELECT count(DISTINCT name), max(name) FROM t;
"#;
    let dir = workdir("sqlite");
    let make = move || {
        // A fresh database each run.
        let db = dir.join("t.db");
        let _ = std::fs::remove_file(&db);
        let mut c = Command::new(&sqlite);
        c.arg(&db).arg(sql);
        c
    };
    let ours = same_output(&make);
    assert_served(&ours, 1);
}

/// `lines` pseudo-random lines (29 bytes each) in `dir/data.txt`, the same every time.
fn text_data(dir: &Path, lines: u64) -> PathBuf {
    let path = dir.join("data.txt");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut text = String::with_capacity(12 << 20);
    for i in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("k{:019} v{i}\n", x % 1_000_003));
    }
    std::fs::write(&path, text).expect("write the data file");
    path
}

/// `script` run by `/bin/sh` with `$1` = `arg`: every program of the pipeline under the
/// preload (or none).
fn shell(script: &'static str, arg: &Path) -> impl Fn() -> Command {
    let arg = arg.to_path_buf();
    move || {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", script, "sh"]).arg(&arg);
        c
    }
}

#[test]
fn xz_with_a_64_mib_dictionary_prints_the_same_and_its_stats_survive_a_closed_stderr() {
    need("xz", "xz-utils");
    need("sha256sum", "coreutils");
    // 3 MiB: xz -9 still takes its 64 MiB dictionary and 600 MiB of match finder.
    let data = text_data(&workdir("xz"), 100_000);
    // xz -9 allocates its 64 MiB dictionary and match finder from malloc; the round trip
    // and the compressed bytes' digest must match. xz closes stderr at exit before the
    // library's destructor runs: the exit report must still come out.
    let ours = same_output(&shell(
        "xz -9 -T1 -c \"$1\" | sha256sum && xz -9 -T1 -c \"$1\" | xz -d | sha256sum",
        &data,
    ));
    // Each xz -9 makes 3 large allocations, xz -d 1 (its dictionary).
    assert_served(&ours, 7);
}

#[test]
fn sort_and_perl_on_large_buffers_print_the_same() {
    need("sort", "coreutils");
    need("perl", "perl-base");
    let data = text_data(&workdir("sort-perl"), 400_000);
    // sort's 128 MiB buffer; perl's strings and arrays grown by realloc past the threshold.
    let ours = same_output(&shell(
        "sort -S 128M \"$1\" | sha256sum && sort -S 64M -t' ' -k2,2 -r \"$1\" | tail -n 3 && \
         perl -e 'my $s = q(); open my $f, q(<), $ARGV[0] or die; while (<$f>) { $s .= $_ } \
                  my @w = split /\n/, $s; my %h; $h{substr($_, 0, 6)}++ for @w; \
                  print length($s), q( ), scalar(@w), q( ), scalar(keys %h), qq(\n); \
                  my $big = q(z) x (96 << 20); $big =~ tr/z/y/; print length($big), qq(\n)' \"$1\"",
        &data,
    ));
    assert_served(&ours, 2);
}

#[test]
fn lua_and_zstd_with_a_128_mib_window_print_the_same() {
    need("lua5.4", "lua5.4");
    need("zstd", "zstd");
    need("sha256sum", "coreutils");
    let data = text_data(&workdir("lua-zstd"), 100_000);
    // Lua's allocator is one realloc function: its tables and strings grow through it past
    // the threshold (a 64 MiB string, a 2-million-entry table: 11 large allocations).
    // zstd --long=27 -T2 sizes its window, tables and worker buffers to the 3 MiB input
    // (5 large allocations compressing, 1 decompressing), on two threads.
    let ours = same_output(&shell(
        "lua5.4 -e 'local t = {} for i = 1, 2000000 do t[i] = tostring(i) end \
                    local s = table.concat(t) local big = string.rep(\"xy\", 32 << 20) \
                    print(#s, #big, big:sub(-3))' && \
         zstd -q -6 --long=27 -T2 -c \"$1\" | sha256sum && \
         zstd -q -6 --long=27 -T2 -c \"$1\" | zstd -q -d --long=27 -c | sha256sum",
        &data,
    ));
    assert_served(&ours, 4);
}

#[test]
fn redis_server_with_large_values_and_redis_benchmark_print_the_same() {
    need("redis-server", "redis-server");
    need("redis-cli", "redis-tools");
    need("redis-benchmark", "redis-tools");
    need("timeout", "coreutils");
    // Debian's redis is built for jemalloc (it calls `mallctl` and `nallocx` beside
    // `malloc`): under the preload its blocks are ours and jemalloc only answers those
    // two. A 64 MiB string grown by SETRANGE and APPEND, 200 000 keys, a 3 MB value,
    // then redis-benchmark's small and 4 MB values; the server, every client and the
    // benchmark run under the preload, each with its own exit report.
    let dir = workdir("redis");
    let ours = same_output(&shell(
        r#"sock="$1/r.sock"; rm -f "$sock"
        timeout 120 redis-server --port 0 --unixsocket "$sock" --save '' --appendonly no \
            --enable-debug-command yes --daemonize no >"$1/server.log" 2>&1 &
        pid=$!
        for i in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
        c() { redis-cli -s "$sock" "$@"; }
        c SETRANGE big 67108863 x && c STRLEN big && c GETRANGE big 67108860 67108863 | od -c
        c APPEND big yz && c STRLEN big
        c DEBUG POPULATE 200000 key 100 && c DBSIZE
        c RPUSH l a b c && c LRANGE l 0 -1
        head -c 3000000 /dev/zero | tr '\0' a | c -x SET s && c STRLEN s
        c GETRANGE s 2999998 -1
        c DEL big && c FLUSHALL && c DBSIZE
        redis-benchmark -s "$sock" -q -n 20000 -t set,get,lpush,lpop -d 100 | tr '\r' '\n' \
            | grep -c 'requests per second'
        redis-benchmark -s "$sock" -q -n 200 -t set -d 4000000 | tr '\r' '\n' \
            | grep -c 'requests per second'
        c SHUTDOWN NOSAVE
        wait $pid; echo "server exit $?""#,
        &dir,
    ));
    // Both runs did the work, not failed alike (a server that never started).
    let out = String::from_utf8_lossy(&ours.stdout);
    for line in ["67108866", "200001", "3000000", "server exit 0"] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    assert_eq!(out.lines().filter(|l| *l == "4").count(), 1, "{out}");
    // The server's 64 MiB string, its 3 MB and 4 MB values.
    assert_served(&ours, 3);
}

#[test]
fn python_threads_and_a_forked_process_pool_on_large_buffers_print_the_same() {
    let python = need("python3", "python3");
    // Threads that build and free large bytes and bytearrays at once (realloc chains
    // through the threshold), then a `fork` pool whose workers inherit the parent's
    // large blocks and allocate their own (each child a new generation of the arena),
    // while the parent's threads are still running.
    let script = r#"
import hashlib, multiprocessing as mp, threading
def work(seed):
    h = hashlib.sha256()
    for i in range(6):
        b = bytearray((seed * 7 + i) % 251 for _ in range(1000)) * (3000 + 1000 * i)
        b += bytes(5 << 20)
        h.update(b[::4097])
        del b
    return h.hexdigest()[:16]
kept = bytes(range(256)) * (64 << 12)
results = {}
def run(seed):
    results[seed] = work(seed)
ts = [threading.Thread(target=run, args=(s,)) for s in range(4)]
for t in ts: t.start()
with mp.get_context("fork").Pool(3) as pool:
    pooled = pool.map(work, range(4, 10))
for t in ts: t.join()
print(sorted(results.items()))
print(pooled)
print(len(kept), hashlib.sha256(kept).hexdigest()[:16])
"#;
    let make = move || {
        let mut c = Command::new(&python);
        c.args(["-c", script]);
        c
    };
    let ours = same_output(&make);
    let out = String::from_utf8_lossy(&ours.stdout);
    assert_eq!(out.lines().count(), 3, "{out}");
    // The parent's kept 16 MiB and its threads' buffers at least; the workers report too.
    assert_served(&ours, 5);
}
