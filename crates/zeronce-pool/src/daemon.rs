//! The running pool: the [`Pool`] handle over the [`Shared`] state, which starts the
//! zeroing workers and the events thread and answers the clients' requests.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zeronce_mem::HugePageSize;
use zeronce_types::sync::{self, lock};

use crate::events::ZeroableEvent;
use crate::files::{FilesError, PoolFiles};
use crate::persist;
use crate::shared::Shared;
use crate::state::{Claim, Connection, FileId, FileState, Owner, PoolState, StateError, Take};
use crate::stats::Stats;
use crate::usage::{other_user, FileUser};
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
    /// No random bytes for a take's token.
    #[error("reading random bytes for a token: {0}")]
    Random(std::io::Error),
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
    /// The secret that returns it from another connection (hex); see
    /// [`Pool::return_file`].
    pub token: String,
}

/// What a return did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Returned {
    /// The file's path.
    pub path: PathBuf,
    /// Who else still had it open or mapped. Such a file is held as orphaned, never
    /// zeroed, until nobody uses it; `None`: it is dirty work now.
    pub in_use: Option<FileUser>,
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
        let mut pool = PoolState::new(page, pages_per_file, names);
        for (name, (token, uid)) in persist::load_tokens(&config.state_file) {
            if let Some(file) = pool.find(&name) {
                pool.restore_token(file, token, uid);
            }
        }
        // A file to be zeroed that a process still has open or mapped (its record was
        // lost, or the state file is for another size): held until unused.
        for file in (0..pool.file_count()).map(FileId) {
            if matches!(pool.state(file), FileState::Dirty { .. }) {
                if let Some(user) = other_user(&files, file, true) {
                    tracing::warn!(path = %files.path(file).display(), ?user, "file in use at start: held as orphaned until unused");
                    pool.hold_until_unused(file)?;
                }
            }
        }
        let shared = Arc::new(Shared::new(
            files,
            pool,
            config.state_file.clone(),
            config.workers.max_bytes_per_sec,
            config.min_event_interval,
        ));
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
        self.take_by(bytes, wait, None)
    }

    /// [`Pool::take`] for a client on `connection` (`None`: in-process): the file is
    /// that connection's, and the holder's of the token in the answer if it is of the
    /// connection's user ([`Pool::return_file`]).
    pub fn take_by(
        &self,
        bytes: u64,
        wait: bool,
        connection: Option<Connection>,
    ) -> Result<Taken, PoolError> {
        let s = &self.shared;
        let token = new_token().map_err(PoolError::Random)?;
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
                    match worker::run_job(s, job, false) {
                        FileState::Held => {}
                        // Opened by someone meanwhile: held until unused; try another.
                        FileState::Orphaned => {
                            inner = s.lock();
                            continue;
                        }
                        _ => return Err(PoolError::Interrupted(s.files.path(file))),
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
        let owner = Owner {
            connection: connection.map(|c| c.id),
            uid: connection.map(|c| c.uid),
            token: token.clone(),
        };
        inner.pool.set_owner(file, owner)?;
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
            token,
        })
    }

    /// The embedding process gives a file back, by path (or name), whoever took it:
    /// [`Pool::return_file`] without a claim.
    pub fn give_back(&self, path: &Path) -> Result<PathBuf, PoolError> {
        Ok(self.return_file(path, None)?.path)
    }

    /// `claim` returns a file by path (or name); `None`: the embedding process, which may
    /// return any taken file. A client may return only a file it took: on the same
    /// connection, or with the token of the take from the taker's user
    /// ([`StateError::NotOwner`] otherwise). Before anything is zeroed the daemon looks
    /// whether anyone else still has the file open or mapped (its write lease; see
    /// `usage`): if so, the file is held as orphaned, never zeroed, and reclaimed once
    /// unused ([`Pool::reclaim_orphans`]); else the workers re-zero it.
    pub fn return_file(
        &self,
        path: &Path,
        claim: Option<&Claim<'_>>,
    ) -> Result<Returned, PoolError> {
        let s = &self.shared;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|_| {
                path.parent()
                    .is_none_or(|p| p.as_os_str().is_empty() || p == s.files.dir())
            })
            .ok_or_else(|| StateError::Unknown(path.display().to_string()))?;
        let file = s.lock().pool.check_return(name, claim)?;
        let path = s.files.path(file);
        // Outside the lock (a busy file's user is looked for in /proc); the file stays
        // taken meanwhile.
        let in_use = other_user(&s.files, file, true);
        {
            let mut inner = s.lock();
            inner.pool.return_file(name, claim, in_use.is_some())?;
            s.zeroable_grew(&mut inner);
        }
        s.changed.notify_all();
        s.persist()?;
        match in_use {
            None => tracing::info!(path = %path.display(), "file returned"),
            Some(user) => tracing::warn!(
                path = %path.display(), ?user,
                "file returned while another process has it open or mapped: held as orphaned until unused"
            ),
        }
        Ok(Returned { path, in_use })
    }

    /// Whether `connection` holds a file it took (and has not returned).
    pub fn held_by(&self, connection: u64) -> bool {
        self.shared.lock().pool.held_by(connection)
    }

    /// Ties a file just taken to its client's connection (see [`Pool::end_lease`]).
    pub fn lease(&self, file: FileId) -> Result<(), PoolError> {
        self.shared.lock().pool.lease(file)?;
        Ok(self.shared.persist()?)
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

    /// Checks every orphaned file for other users (its write lease; `/proc` only where
    /// leases are not available), and reclaims those nobody uses as dirty work. Returns
    /// how many stay orphaned.
    pub fn reclaim_orphans(&self) -> Result<usize, PoolError> {
        let s = &self.shared;
        let orphans = s.lock().pool.orphans();
        let mut left = 0;
        for file in orphans {
            let path = self.path(file);
            match other_user(&s.files, file, false) {
                None => {
                    let mut inner = s.lock();
                    // Returned meanwhile: nothing to reclaim.
                    if inner.pool.reclaim(file).is_ok() {
                        s.zeroable_grew(&mut inner);
                        drop(inner);
                        s.changed.notify_all();
                        tracing::info!(path = %path.display(), "orphaned file unused: reclaimed");
                    }
                }
                Some(user) => {
                    tracing::debug!(path = %path.display(), ?user, "orphaned file still in use");
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
            worker::run_job(s, job, true);
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
    pub fn stats(&self) -> Stats {
        let inner = self.shared.lock();
        Stats {
            page_bytes: inner.pool.page_bytes(),
            file_bytes: inner.pool.file_bytes(),
            files: inner.pool.file_count(),
            pages: inner.pool.counts(),
            counters: inner.pool.counters(),
            events: inner.events.fired(),
            orphan_checks: self.shared.orphan_checks.load(Ordering::Relaxed),
        }
    }

    /// The path of a file.
    pub fn path(&self, file: FileId) -> PathBuf {
        self.shared.files.path(file)
    }

    /// A new descriptor of a file, of an open file description of its own (to pass to
    /// its client: a `dup` of the daemon's would hide the client from the in-use check).
    pub fn client_fd(&self, file: FileId) -> Result<std::os::fd::OwnedFd, PoolError> {
        Ok(self.shared.files.open_for_client(file)?)
    }

    /// Events from now on (rate-limited; see [`ZeroableEvent`]).
    pub fn subscribe(&self) -> Receiver<ZeroableEvent> {
        self.shared.lock().events.subscribe()
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
        self.shared.stop();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        Ok(self.shared.persist()?)
    }
}

/// A new token: 16 random bytes, in hex.
fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(%e, "state file not written at shutdown");
        }
    }
}
