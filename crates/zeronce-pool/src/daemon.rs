//! The running pool: [`PoolState`] behind a mutex, the files, the zeroing workers, the
//! state file, and the "zeroable pages appeared" notifications.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zeronce_mem::{HugePageSize, ZeroKernel};
use zeronce_mm::hugepool::{Clock, Notifier, ZeroableEvent};
use zeronce_mm::sync::{self, lock};
use zeronce_mm::ZoneId;

use crate::files::{FilesError, PoolFiles};
use crate::pacer::Pacer;
use crate::persist;
use crate::state::{FileId, FileState, Job, PoolState, StateError, Take};
use crate::worker::{self, WorkerConfig};

/// What a pool is made of.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// A hugetlbfs mount (of `page_size` pages).
    pub dir: PathBuf,
    /// The huge page size.
    pub page_size: HugePageSize,
    /// Number of files.
    pub files: usize,
    /// Bytes per file (a multiple of the page size).
    pub file_bytes: u64,
    /// The state file (not on hugetlbfs, which cannot be written with `write`).
    pub state_file: PathBuf,
    /// The zeroing workers.
    pub workers: WorkerConfig,
    /// Least time between two "zeroable pages appeared" events.
    pub min_event_interval: Duration,
}

/// Why a pool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The files.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The pool state refused.
    #[error(transparent)]
    State(#[from] StateError),
    /// The state file could not be written.
    #[error(transparent)]
    Persist(#[from] persist::PersistError),
    /// The configuration is unusable.
    #[error("bad configuration: {0}")]
    Config(String),
    /// Zeroing a file for a taker stopped (shutdown or an I/O failure; see the log).
    #[error("zeroing {0} for the taker did not finish")]
    Interrupted(PathBuf),
    /// The daemon is shutting down.
    #[error("the pool is shutting down")]
    ShuttingDown,
    /// A thread could not be started.
    #[error("spawning a thread: {0}")]
    Spawn(std::io::Error),
}

/// How a taken file was made ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// It was pre-zeroed: nothing was done on the request.
    Prezeroed,
    /// It was zeroed on the request (no pre-zeroed file was free).
    ZeroedInline,
}

impl Served {
    /// `prezeroed` / `zeroed_inline`.
    pub fn name(self) -> &'static str {
        match self {
            Served::Prezeroed => "prezeroed",
            Served::ZeroedInline => "zeroed_inline",
        }
    }
}

/// A file handed to a client.
#[derive(Debug)]
pub struct Taken {
    /// Which.
    pub file: FileId,
    /// Its path.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// How it was made ready.
    pub served: Served,
}

/// What a `prezero` request did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrezeroReport {
    /// Pages zeroed by the daemon.
    pub pages_zeroed: u64,
    /// Holes repopulated by the kernel on the way.
    pub pages_repopulated: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Pages still zeroable afterwards.
    pub zeroable_left: u64,
}

/// The monotonic clock of the notifier.
#[derive(Debug)]
struct MonoClock(Instant);

impl Clock for MonoClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

pub(crate) struct Inner {
    pub(crate) pool: PoolState,
    notifier: Notifier,
}

type Subscribers = Arc<Mutex<Vec<Sender<ZeroableEvent>>>>;

pub(crate) struct Shared {
    pub(crate) files: PoolFiles,
    inner: Mutex<Inner>,
    /// Work appeared, a file became ready, or shutdown.
    pub(crate) changed: Condvar,
    /// A notifier deadline appeared, or shutdown.
    timer: Condvar,
    pub(crate) stop: AtomicBool,
    pub(crate) pacer: Option<Mutex<Pacer>>,
    pacer_epoch: Instant,
    state_file: PathBuf,
    persisted_generation: Mutex<Option<u64>>,
    subscribers: Subscribers,
    pub(crate) kernel: ZeroKernel,
    /// Checks of orphaned files' users done so far.
    orphan_checks: AtomicU64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every state change is one call on the pure state, consistent between calls.
        lock(&self.inner)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Writes the state file if the state changed since the last write.
    pub(crate) fn persist(&self) -> Result<(), PoolError> {
        let (generation, text) = {
            let inner = self.lock();
            let p = &inner.pool;
            let text = persist::render(p.page_bytes(), p.file_bytes(), p.persisted());
            (p.generation(), text)
        };
        let mut last = lock(&self.persisted_generation);
        if last.is_some_and(|g| g >= generation) {
            return Ok(());
        }
        persist::write_atomic(&self.state_file, &text)?;
        *last = Some(generation);
        Ok(())
    }

    /// Tells the notifier the zeroable count may have grown.
    fn zeroable_grew(&self, inner: &mut Inner) {
        let zeroable = inner.pool.zeroable();
        if zeroable > 0 {
            inner.notifier.grew(ZoneId(0), zeroable);
            self.timer.notify_one();
        }
    }

    /// How long to wait before zeroing `bytes` more in the background.
    pub(crate) fn pace(&self, bytes: u64) -> Duration {
        self.pacer.as_ref().map_or(Duration::ZERO, |p| {
            let now = self.pacer_epoch.elapsed();
            lock(p).reserve(bytes, now)
        })
    }

    /// Runs `job` to its end (or `stop`), reporting to the pool; the file's new state.
    pub(crate) fn run_job(&self, job: Job, paced: bool) -> FileState {
        let outcome = worker::zero_job(self, &job, paced);
        let (file, by) = (job.file, job.by);
        let mut inner = self.lock();
        inner.pool.add_zeroing_time(outcome.zeroing_nanos);
        let state = match inner.pool.finish_job(job) {
            Ok(s) => s.clone(),
            Err(e) => {
                tracing::error!(%e, "finishing a job this pool made failed");
                FileState::Held
            }
        };
        drop(inner);
        tracing::info!(
            path = %self.files.path(file).display(), ?by, zeroed = outcome.zeroed,
            repopulated = outcome.repopulated, ready = matches!(state, FileState::Ready | FileState::Held),
            "zeroing job done"
        );
        self.changed.notify_all();
        if let Err(e) = self.persist() {
            tracing::error!(%e, "state file not updated");
        }
        state
    }

    fn run_timer(&self) {
        let mut inner = self.lock();
        while !self.stopping() {
            let Inner { pool, notifier } = &mut *inner;
            let next = notifier.poll(|_| pool.zeroable());
            inner = match next {
                None => sync::wait(&self.timer, inner),
                Some(due) => {
                    let wait = due.saturating_sub(inner.notifier.now());
                    sync::wait_timeout(&self.timer, inner, wait)
                }
            };
        }
    }
}

/// A running pool; see the crate docs. Dropping it stops the workers (after their
/// current page) and writes the state file.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("dir", &self.shared.files.dir())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Opens the files (creating missing ones), reads the state file, starts the
    /// workers. Files not recorded zero are checked for holes and zeroed by the workers.
    pub fn start(config: PoolConfig) -> Result<Pool, PoolError> {
        let page = config.page_size.bytes() as u64;
        if config.files == 0 || config.file_bytes == 0 || !config.file_bytes.is_multiple_of(page) {
            return Err(PoolError::Config(format!(
                "{} files of {} bytes: need at least one file, a positive multiple of {page} bytes",
                config.files, config.file_bytes
            )));
        }
        let files = PoolFiles::open(
            &config.dir,
            config.page_size,
            config.files,
            config.file_bytes,
        )?;
        let records = persist::load(&config.state_file, page, config.file_bytes);
        let names: Vec<(String, _)> = files
            .names()
            .map(|n| (n.to_owned(), records.get(n).copied()))
            .collect();
        let pages_per_file = u32::try_from(config.file_bytes / page)
            .map_err(|_| PoolError::Config("too many pages per file".into()))?;
        let pool = PoolState::new(page, pages_per_file, names);
        let subscribers: Subscribers = Arc::default();
        let hook_subs = Arc::clone(&subscribers);
        let notifier = Notifier::new(
            Box::new(move |event| {
                tracing::debug!(?event, "zeroable pages appeared");
                let mut subs = lock(&hook_subs);
                subs.retain(|s| s.send(event).is_ok());
            }),
            Arc::new(MonoClock(Instant::now())),
            config.min_event_interval,
        );
        let shared = Arc::new(Shared {
            files,
            inner: Mutex::new(Inner { pool, notifier }),
            changed: Condvar::new(),
            timer: Condvar::new(),
            stop: AtomicBool::new(false),
            pacer: config
                .workers
                .max_bytes_per_sec
                .map(|rate| Mutex::new(Pacer::new(rate, page))),
            pacer_epoch: Instant::now(),
            state_file: config.state_file.clone(),
            persisted_generation: Mutex::new(None),
            subscribers,
            kernel: ZeroKernel::auto(page as usize),
            orphan_checks: AtomicU64::new(0),
        });
        shared.persist()?;
        {
            let mut inner = shared.lock();
            shared.zeroable_grew(&mut inner);
        }
        let mut threads = Vec::new();
        let timer = Arc::clone(&shared);
        threads.push(
            std::thread::Builder::new()
                .name("zeronce-pool-events".into())
                .spawn(move || timer.run_timer())
                .map_err(PoolError::Spawn)?,
        );
        for i in 0..config.workers.threads {
            let s = Arc::clone(&shared);
            let w = config.workers.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("zeronce-pool-zero-{i}"))
                    .spawn(move || worker::run(&s, &w, i))
                    .map_err(PoolError::Spawn)?,
            );
        }
        tracing::info!(
            dir = %config.dir.display(), files = config.files, file_bytes = config.file_bytes,
            page_bytes = page, workers = config.workers.threads, "pool started"
        );
        Ok(Pool {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// Takes a file of at least `bytes`: a pre-zeroed one, else a dirty one zeroed now
    /// on this thread; with `wait`, waits for files being zeroed when none is free.
    pub fn take(&self, bytes: u64, wait: bool) -> Result<Taken, PoolError> {
        let s = &self.shared;
        let mut inner = s.lock();
        let (file, served) = loop {
            if s.stopping() {
                return Err(PoolError::ShuttingDown);
            }
            match inner.pool.take(bytes) {
                Ok(Take::Ready(file)) => break (file, Served::Prezeroed),
                Ok(Take::ZeroInline(job)) => {
                    drop(inner);
                    let file = job.file;
                    if s.run_job(job, false) != FileState::Held {
                        return Err(PoolError::Interrupted(s.files.path(file)));
                    }
                    inner = s.lock();
                    break (file, Served::ZeroedInline);
                }
                Err(StateError::Exhausted { zeroing }) if wait && zeroing > 0 => {
                    inner = sync::wait(&s.changed, inner);
                }
                Err(e) => return Err(e.into()),
            }
        };
        let bytes = inner.pool.file_bytes();
        drop(inner);
        // Recorded held before the client learns the path.
        s.persist()?;
        let path = s.files.path(file);
        tracing::info!(path = %path.display(), served = served.name(), "file taken");
        Ok(Taken {
            file,
            path,
            bytes,
            served,
        })
    }

    /// A client gives a file back, by path (or name): the workers re-zero it.
    pub fn give_back(&self, path: &Path) -> Result<PathBuf, PoolError> {
        let s = &self.shared;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|_| {
                path.parent()
                    .is_none_or(|p| p.as_os_str().is_empty() || p == s.files.dir())
            })
            .ok_or_else(|| StateError::Unknown(path.display().to_string()))?;
        let file = {
            let mut inner = s.lock();
            let file = inner.pool.give_back(name)?;
            s.zeroable_grew(&mut inner);
            file
        };
        s.changed.notify_all();
        s.persist()?;
        let path = s.files.path(file);
        tracing::info!(path = %path.display(), "file returned");
        Ok(path)
    }

    /// Ties a file just taken to its client's connection (see [`Pool::end_lease`]).
    pub fn lease(&self, file: FileId) -> Result<(), PoolError> {
        self.shared.lock().pool.lease(file)?;
        self.shared.persist()
    }

    /// The connection that leased `file` closed. If the file was not returned, it is
    /// orphaned: reclaimed (re-zeroed) only once no process has it open or mapped
    /// ([`Pool::reclaim_orphans`], also run here).
    pub fn end_lease(&self, file: FileId) -> Result<(), PoolError> {
        if self.shared.lock().pool.end_lease(file) {
            tracing::warn!(path = %self.path(file).display(), "lease ended without a return: file orphaned");
            self.shared.persist()?;
            self.reclaim_orphans()?;
        }
        Ok(())
    }

    /// Checks every orphaned file for processes that have it open or mapped (`/proc`),
    /// and reclaims those none has as dirty work. Returns how many stay orphaned.
    pub fn reclaim_orphans(&self) -> Result<usize, PoolError> {
        let s = &self.shared;
        let orphans = s.lock().pool.orphans();
        let mut left = 0;
        for file in orphans {
            let path = self.path(file);
            match crate::usage::usage(&path) {
                Ok(crate::usage::Usage::Unused { not_inspected }) => {
                    if not_inspected > 0 {
                        tracing::debug!(not_inspected, "processes not inspected for orphan users");
                    }
                    let mut inner = s.lock();
                    // Returned meanwhile: nothing to reclaim.
                    if inner.pool.reclaim(file).is_ok() {
                        s.zeroable_grew(&mut inner);
                        drop(inner);
                        s.changed.notify_all();
                        tracing::info!(path = %path.display(), "orphaned file unused: reclaimed");
                    }
                }
                Ok(user) => {
                    tracing::debug!(path = %path.display(), ?user, "orphaned file still in use");
                    left += 1;
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), %e, "cannot check an orphaned file's users");
                    left += 1;
                }
            }
        }
        s.orphan_checks.fetch_add(1, Ordering::Relaxed);
        s.persist()?;
        Ok(left)
    }

    /// Zeroes up to `pages` zeroable pages now, on this thread (paced like the workers).
    pub fn prezero(&self, pages: u64) -> PrezeroReport {
        let s = &self.shared;
        let start = Instant::now();
        let before = s.lock().pool.counters();
        let mut left = pages;
        while left > 0 && !s.stopping() {
            let Some(job) = s.lock().pool.next_job(left) else {
                break;
            };
            left = left.saturating_sub(job.pages.len() as u64);
            s.run_job(job, true);
        }
        let inner = s.lock();
        let after = inner.pool.counters();
        PrezeroReport {
            pages_zeroed: after.pages_zeroed_background - before.pages_zeroed_background,
            pages_repopulated: after.pages_repopulated - before.pages_repopulated,
            elapsed: start.elapsed(),
            zeroable_left: inner.pool.zeroable(),
        }
    }

    /// A snapshot of counts and counters.
    pub fn stats(&self) -> crate::Stats {
        let inner = self.shared.lock();
        crate::Stats {
            page_bytes: inner.pool.page_bytes(),
            file_bytes: inner.pool.file_bytes(),
            files: inner.pool.file_count(),
            pages: inner.pool.counts(),
            counters: inner.pool.counters(),
            events: inner.notifier.fired(),
            orphan_checks: self.shared.orphan_checks.load(Ordering::Relaxed),
        }
    }

    /// The path of a file.
    pub fn path(&self, file: FileId) -> PathBuf {
        self.shared.files.path(file)
    }

    /// A new descriptor of a file (to pass to its client).
    pub fn dup(&self, file: FileId) -> Result<std::os::fd::OwnedFd, PoolError> {
        Ok(self.shared.files.dup(file)?)
    }

    /// Events from now on (rate-limited; see [`zeronce_mm::hugepool::events`]).
    pub fn subscribe(&self) -> Receiver<ZeroableEvent> {
        let (tx, rx) = mpsc::channel();
        lock(&self.shared.subscribers).push(tx);
        rx
    }

    /// Waits until no file is being zeroed and nothing is zeroable (tests, benchmarks),
    /// or `timeout`; whether it got there.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let s = &self.shared;
        let deadline = Instant::now() + timeout;
        let mut inner = s.lock();
        loop {
            let c = inner.pool.counts();
            if c.zeroable == 0 && c.zeroing == 0 && !inner.pool.has_work() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            inner = sync::wait_timeout(&s.changed, inner, deadline - now);
        }
    }

    /// Whether [`Pool::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shared.stopping()
    }

    /// Stops the workers after their current page (and any take or `prezero` in
    /// progress: they fail), waits for the workers, writes the state file. Idempotent.
    pub fn shutdown(&self) -> Result<(), PoolError> {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _inner = self.shared.lock();
            self.shared.changed.notify_all();
            self.shared.timer.notify_all();
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        self.shared.persist()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(%e, "state file not written at shutdown");
        }
    }
}
