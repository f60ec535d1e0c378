//! The pool on a real hugetlbfs mount of 2 MiB pages (`ZERONCE_HUGETLBFS_2M`). Ignored by
//! a plain `cargo nextest run`; `.ci/run` mounts one and runs them (`--run-ignored all`);
//! without the mount they fail saying what to set up. Each test works in its
//! own directory of the mount and removes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use zeronce_mem::{BackingKind, DiscardOp, GuestRam, HugePageSize};
use zeronce_pool::files::mount_from_env;
use zeronce_pool::state::Persisted;
use zeronce_pool::{persist, Pool, PoolConfig, Served, WorkerConfig};

const PAGE: u64 = 2 << 20;
const PAGES_PER_FILE: u64 = 4;
const IDLE: Duration = Duration::from_secs(120);

/// A directory of the mount and a state file, removed on drop.
struct Scratch {
    dir: PathBuf,
    state: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let mount = mount_from_env().unwrap_or_else(|e| panic!("{e}"));
        let dir = mount.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state =
            std::env::temp_dir().join(format!("zeronce-pool-{name}-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&state);
        Scratch { dir, state }
    }

    fn config(&self, files: usize, workers: usize) -> PoolConfig {
        PoolConfig {
            dir: self.dir.clone(),
            page_size: HugePageSize::Size2M,
            files,
            file_bytes: PAGES_PER_FILE * PAGE,
            state_file: self.state.clone(),
            workers: WorkerConfig {
                threads: workers,
                ..WorkerConfig::default()
            },
            min_event_interval: Duration::from_millis(10),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.state);
    }
}

fn map(path: &Path) -> GuestRam {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    GuestRam::map_file(file.into(), BackingKind::Hugetlb(HugePageSize::Size2M)).unwrap()
}

/// Maps the file, asserts every byte reads zero, writes all of it.
fn use_file(path: &Path) -> GuestRam {
    let mut ram = map(path);
    assert!(
        ram.is_zero(0, ram.len()).unwrap(),
        "{} not zero",
        path.display()
    );
    let len = ram.len();
    ram.fill(0, len, 0xA5).unwrap();
    ram
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn returned_files_are_rezeroed_and_punched_pages_are_repopulated_not_zeroed() {
    let scratch = Scratch::new("rezero");
    let pool = Pool::start(scratch.config(2, 1)).unwrap();
    assert!(pool.wait_idle(IDLE));
    let s = pool.stats();
    assert_eq!(s.pages.free_zero, 2 * PAGES_PER_FILE);
    // Fresh files are all holes: the kernel fills them, the daemon zeroes nothing.
    assert_eq!(s.counters.pages_repopulated, 2 * PAGES_PER_FILE);
    assert_eq!(s.counters.pages_zeroed_background, 0);

    let a = pool.take(PAGES_PER_FILE * PAGE, true).unwrap();
    assert_eq!(a.served, Served::Prezeroed);
    drop(use_file(&a.path));
    pool.give_back(&a.path).unwrap();
    assert!(pool.wait_idle(IDLE));
    assert_eq!(
        pool.stats().counters.pages_zeroed_background,
        PAGES_PER_FILE
    );

    // Take both files: each reads zero everywhere (one was written and re-zeroed).
    let b = pool.take(PAGE, true).unwrap();
    let c = pool.take(PAGE, true).unwrap();
    let mut rams = vec![use_file(&b.path), use_file(&c.path)];
    // Punch pages 1 and 3 of the first, as a balloon would.
    assert!(rams[0]
        .discard(PAGE as usize, PAGE as usize, DiscardOp::PunchHole)
        .unwrap()
        .is_zeroed());
    assert!(rams[0]
        .discard(3 * PAGE as usize, PAGE as usize, DiscardOp::PunchHole)
        .unwrap()
        .is_zeroed());
    drop(rams);
    let before = pool.stats().counters;
    pool.give_back(&b.path).unwrap();
    assert!(pool.wait_idle(IDLE));
    let after = pool.stats().counters;
    assert_eq!(after.pages_repopulated - before.pages_repopulated, 2);
    assert_eq!(
        after.pages_zeroed_background - before.pages_zeroed_background,
        2
    );

    let d = pool.take(PAGE, false).unwrap();
    assert_eq!(d.path, b.path);
    let ram = use_file(&d.path);
    assert_eq!(
        ram.file_allocated_bytes().unwrap().unwrap(),
        PAGES_PER_FILE * PAGE
    );
    drop(ram);
    pool.give_back(&d.path).unwrap();
    pool.give_back(&c.path).unwrap();
    pool.shutdown().unwrap();
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn without_workers_a_take_zeroes_inline_and_prezero_is_on_request() {
    let scratch = Scratch::new("inline");
    let pool = Pool::start(scratch.config(1, 0)).unwrap();
    let a = pool.take(PAGE, false).unwrap();
    // The fresh file needed only the kernel's repopulation, on the request.
    assert_eq!(a.served, Served::ZeroedInline);
    drop(use_file(&a.path));
    pool.give_back(&a.path).unwrap();
    assert_eq!(pool.stats().pages.zeroable, PAGES_PER_FILE);
    let events = pool.subscribe();
    let b = pool.take(PAGE, false).unwrap();
    assert_eq!(b.served, Served::ZeroedInline);
    drop(use_file(&b.path));
    pool.give_back(&b.path).unwrap();
    // A return makes zeroable pages: an event comes (rate-limited, maybe trailing).
    let e = events.recv_timeout(IDLE).expect("no zeroable event");
    assert_eq!(e.zeroable, PAGES_PER_FILE);
    let r = pool.prezero(3);
    assert_eq!((r.pages_zeroed, r.zeroable_left), (3, 1));
    let r = pool.prezero(10);
    assert_eq!((r.pages_zeroed, r.zeroable_left), (1, 0));
    let c = pool.take(PAGE, false).unwrap();
    assert_eq!(c.served, Served::Prezeroed);
    drop(use_file(&c.path));
    let s = pool.stats().counters;
    assert_eq!(
        (s.pages_zeroed_inline, s.pages_zeroed_background),
        (PAGES_PER_FILE, PAGES_PER_FILE)
    );
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_restart_keeps_held_files_and_rezeroes_only_what_it_cannot_prove_zero() {
    let scratch = Scratch::new("restart");
    let pool = Pool::start(scratch.config(3, 1)).unwrap();
    assert!(pool.wait_idle(IDLE));
    let held = pool.take(PAGE, false).unwrap();
    let ram = use_file(&held.path);
    let unrecorded = pool.take(PAGE, false).unwrap();
    drop(use_file(&unrecorded.path));
    pool.shutdown().unwrap();
    drop(pool);

    // Lose the record of the second file (as if the daemon died before writing it).
    let text = std::fs::read_to_string(&scratch.state).unwrap();
    let records = persist::parse(&text, PAGE, PAGES_PER_FILE * PAGE).unwrap();
    let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(records[&name(&held.path)], Persisted::Held);
    assert_eq!(records[&name(&unrecorded.path)], Persisted::Held);
    let kept = records
        .iter()
        .filter(|(n, _)| **n != name(&unrecorded.path))
        .map(|(n, p)| (n.as_str(), *p));
    persist::write_atomic(
        &scratch.state,
        &persist::render(PAGE, PAGES_PER_FILE * PAGE, kept),
    )
    .unwrap();

    let pool = Pool::start(scratch.config(3, 1)).unwrap();
    assert!(pool.wait_idle(IDLE));
    let s = pool.stats();
    assert_eq!(s.pages.in_use, PAGES_PER_FILE, "the held file stays held");
    assert_eq!(
        s.counters.pages_zeroed_background, PAGES_PER_FILE,
        "only the unrecorded file is zeroed"
    );
    assert_eq!(s.counters.pages_repopulated, 0);
    let a = pool.take(PAGE, false).unwrap();
    let b = pool.take(PAGE, false).unwrap();
    for f in [&a, &b] {
        assert_eq!(f.served, Served::Prezeroed);
        assert_ne!(f.path, held.path);
        drop(use_file(&f.path));
    }
    // Unmapped first: a file this process still maps would be held as orphaned (the
    // write lease sees this process's mappings too), and returning it again allowed.
    drop(ram);
    pool.give_back(&held.path).unwrap();
    assert!(pool.give_back(&held.path).is_err(), "double return refused");
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_file_opened_while_it_is_zeroed_stops_its_zeroing_and_is_held_until_unused() {
    let scratch = Scratch::new("openedwhilezeroing");
    let mut config = scratch.config(1, 1);
    // One page a second: the open below lands in the middle of the job.
    config.workers.max_bytes_per_sec = Some(PAGE);
    let pool = Pool::start(config).unwrap();
    assert!(pool.wait_idle(IDLE));
    let taken = pool.take(PAGE, false).unwrap();
    drop(use_file(&taken.path));
    pool.give_back(&taken.path).unwrap();
    let start = std::time::Instant::now();
    while pool.stats().counters.pages_zeroed_background == 0 {
        assert!(start.elapsed() < IDLE, "no page zeroed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Someone opens the file being zeroed (the open waits for the job to notice).
    let ram = map(&taken.path);
    let s = pool.stats();
    assert_eq!(s.counters.jobs_found_in_use, 1, "{s:?}");
    assert_eq!(s.pages.orphaned, PAGES_PER_FILE, "{s:?}");
    assert!(
        s.counters.pages_zeroed_background < PAGES_PER_FILE,
        "too late: {s:?}"
    );
    let last = (PAGES_PER_FILE - 1) * PAGE;
    assert!(
        !ram.is_zero(last as usize, PAGE as usize).unwrap(),
        "the job went on zeroing a file someone opened"
    );
    assert_eq!(pool.reclaim_orphans().unwrap(), 1, "still open: held");
    drop(ram);
    assert_eq!(pool.reclaim_orphans().unwrap(), 0);
    assert!(pool.wait_idle(IDLE));
    drop(use_file(&pool.take(PAGE, false).unwrap().path));
}
