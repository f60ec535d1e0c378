//! The pool's pure state: which file is ready, held, dirty or being zeroed, and which of
//! its huge pages still need zeroing. No syscalls: the effect layer (the private `daemon` module, behind [`crate::Pool`])
//! asks for work ([`PoolState::next_job`]), does it, and reports each page back.
//!
//! | event | file state after |
//! |---|---|
//! | file found or created, recorded zero | `Dirty` (holes unchecked, no page dirty) |
//! | file found, not recorded zero | `Dirty` (holes unchecked, every page dirty) |
//! | file recorded held by a client | `Held` |
//! | taken while `Ready` | `Held` |
//! | taken while `Dirty` (no file ready) | `Zeroing { inline }`, then `Held` |
//! | returned by its taker ([`PoolState::return_file`]; anyone else is refused) | `Dirty` (holes unchecked, every page dirty) |
//! | returned by its taker while another process still has it open or mapped | `Orphaned` |
//! | taken on a lease ([`PoolState::lease`]) | `Leased` |
//! | the lease's connection closed without a return | `Orphaned` |
//! | orphaned, and no process has it open or mapped ([`PoolState::reclaim`]) | `Dirty` (as returned) |
//! | picked by a zeroer ([`PoolState::next_job`]) | `Zeroing { background }` |
//! | job finished, nothing left to do | `Ready` |
//! | job stopped early (cancelled, page budget, failure) | `Dirty` with what is left |
//! | job found its file opened by someone else ([`PoolState::job_in_use`]) | `Orphaned` |
//!
//! A returned file's pages are dirty, except those the client punched out (discarded by
//! a balloon or free page reporting): those are holes, which read zero. A job first
//! checks for holes and has the kernel repopulate them ([`Job::check_holes`]); the
//! pages it reports as holes ([`PoolState::holes_repopulated`]) are clean — counted as
//! kernel repopulation, never zeroed by the daemon.
//!
//! **Never zeroing a held file**: jobs are only made from `Dirty` files, and a file being
//! zeroed cannot be taken (a taker gets a `Ready` file, zeroes a `Dirty` one itself, or
//! waits). **Crash safety**: [`PoolState::persisted`] records a file as zero only when it is
//! `Ready`; a file being zeroed inline for a taker is recorded dirty until the taker has
//! it (then held).

use std::collections::VecDeque;

use thiserror::Error;

/// Index of a pool file (its position in the pool, stable for the daemon's life).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub usize);

/// Index of a huge page inside a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageIndex(pub u32);

/// Who zeroes a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroingBy {
    /// A zeroing worker or a `prezero` request: the file goes back to the pool.
    Background,
    /// A taker found no ready file and zeroes this one on its request: the file is its.
    Inline,
}

/// State of one pool file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileState {
    /// Free; every page allocated and zero.
    Ready,
    /// Handed to a client.
    Held,
    /// Handed to a client on a lease: its while the client's connection lives.
    Leased,
    /// Its lease ended without a return. Never zeroed while a process may still have it
    /// open or mapped (a guest may be running on it); reclaimed once none has.
    Orphaned,
    /// Free, with work left: `dirty[i]` = page `i` may hold data; `holes_checked` =
    /// missing pages were looked for and repopulated since the file came back.
    Dirty {
        /// Pages that need zeroing.
        dirty: Vec<bool>,
        /// Holes were checked and repopulated.
        holes_checked: bool,
    },
    /// A job has it (its pages are not touched by anyone else).
    Zeroing {
        /// Who.
        by: ZeroingBy,
        /// Pages that still need zeroing.
        dirty: Vec<bool>,
        /// Holes were checked and repopulated.
        holes_checked: bool,
    },
}

/// How a file is recorded in the state file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persisted {
    /// Every page zero, no client holds it.
    Zero,
    /// Held by a client: never zeroed until returned.
    Held,
    /// Leased or orphaned: no lease survives a restart, so it is checked for users and
    /// reclaimed once none has it open or mapped.
    Orphaned,
    /// Anything else: must be zeroed (and checked for holes) before use.
    Dirty,
}

impl Persisted {
    /// Its name in the state file.
    pub fn name(self) -> &'static str {
        match self {
            Persisted::Zero => "zero",
            Persisted::Held => "held",
            Persisted::Orphaned => "orphaned",
            Persisted::Dirty => "dirty",
        }
    }

    /// Parses [`Persisted::name`].
    pub fn from_name(name: &str) -> Option<Persisted> {
        [
            Persisted::Zero,
            Persisted::Held,
            Persisted::Orphaned,
            Persisted::Dirty,
        ]
        .into_iter()
        .find(|p| p.name() == name)
    }
}

/// Work for a zeroer: one file, what to do to it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a file being zeroed stays unavailable until finish_job"]
pub struct Job {
    /// The file.
    pub file: FileId,
    /// Look for holes first and have the kernel repopulate them.
    pub check_holes: bool,
    /// Pages to zero, in order (holes found first are skipped by the effect layer).
    pub pages: Vec<PageIndex>,
    /// Who is zeroing.
    pub by: ZeroingBy,
}

/// What [`PoolState::take`] handed out.
#[derive(Debug, PartialEq, Eq)]
pub enum Take {
    /// A ready file: nothing to do, it is the client's.
    Ready(FileId),
    /// A dirty file the taker must zero first (then [`PoolState::finish_job`]).
    ZeroInline(Job),
}

/// Counters (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Files handed out.
    pub takes: u64,
    /// Files handed out ready (pre-zeroed).
    pub takes_prezeroed: u64,
    /// Files handed out after being zeroed on the take request.
    pub takes_zeroed_inline: u64,
    /// Takes refused (no file of the size, or none free).
    pub take_failures: u64,
    /// Files returned.
    pub returns: u64,
    /// Files returned while another process still had them open or mapped: held as
    /// orphaned (not zeroed) until unused.
    pub returns_in_use: u64,
    /// Returns refused because the client was not the file's taker.
    pub returns_refused: u64,
    /// Pages zeroed by the daemon in the background (workers, `prezero`).
    pub pages_zeroed_background: u64,
    /// Pages zeroed by the daemon on a take request.
    pub pages_zeroed_inline: u64,
    /// Pages that were holes and were repopulated by the kernel (its fault zeroing,
    /// not the daemon's).
    pub pages_repopulated: u64,
    /// Jobs stopped before their end (cancelled, budget, failure).
    pub jobs_interrupted: u64,
    /// Leases whose connection closed without returning the file.
    pub leases_orphaned: u64,
    /// Orphaned files reclaimed (no process had them open or mapped any more).
    pub orphans_reclaimed: u64,
    /// Zeroing jobs that found their file opened by someone else (before their first
    /// page or between two): stopped, the file held as orphaned until unused.
    pub jobs_found_in_use: u64,
    /// Nanoseconds zeroers spent zeroing pages (for the zeroing rate).
    pub zeroing_nanos: u64,
}

/// Page counts by state (all files).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// Pages of ready files: free and known zero.
    pub free_zero: u64,
    /// Free pages that may hold data: the daemon's zeroing work.
    pub zeroable: u64,
    /// Pages of held files.
    pub in_use: u64,
    /// Pages of files a job has.
    pub zeroing: u64,
    /// Pages of orphaned files (lease ended, not yet reclaimed).
    pub orphaned: u64,
}

impl PageCounts {
    /// All pages.
    pub fn total(&self) -> u64 {
        self.free_zero + self.zeroable + self.in_use + self.zeroing + self.orphaned
    }
}

/// Why an operation was refused. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum StateError {
    /// No file that large in this pool.
    #[error("no pool file holds {wanted} bytes (files are {file_bytes} bytes)")]
    TooLarge {
        /// Bytes asked for.
        wanted: u64,
        /// Size of every file.
        file_bytes: u64,
    },
    /// Every file is held or being zeroed; `zeroing` of them will be ready later.
    #[error("no free pool file; {zeroing} being zeroed")]
    Exhausted {
        /// Files being zeroed in the background (a taker may wait for them).
        zeroing: u64,
    },
    /// Not a file of this pool.
    #[error("not a pool file: {0}")]
    Unknown(String),
    /// The file is not held (double return, or return of a free file).
    #[error("{0} is not held by a client")]
    NotHeld(String),
    /// The file was taken by someone else: another connection, without its token.
    #[error("{0} was taken by another client: return it on the connection that took it, or with the token its take returned")]
    NotOwner(String),
    /// A take of 0 bytes.
    #[error("a take of 0 bytes: ask for at least 1 byte")]
    ZeroBytes,
    /// Lease or reclaim of a file not in the state it needs.
    #[error("file {0:?} is not {1}")]
    NotInState(FileId, &'static str),
    /// The job's file is not being zeroed by that job (a bug in the effect layer).
    #[error("file {0:?} is not being zeroed")]
    NotZeroing(FileId),
    /// A page index past the end of the file.
    #[error("page {page:?} is past the {pages} pages of file {file:?}")]
    BadPage {
        /// The file.
        file: FileId,
        /// The page.
        page: PageIndex,
        /// Pages per file.
        pages: u32,
    },
}

#[derive(Clone, Debug)]
struct File {
    name: String,
    state: FileState,
    /// Its taker, while taken (held, leased or orphaned).
    owner: Option<Owner>,
}

/// The pool of files; see the module docs.
#[derive(Clone, Debug)]
pub struct PoolState {
    files: Vec<File>,
    pages_per_file: u32,
    page_bytes: u64,
    /// Free files with work, oldest first (a file may appear once at most).
    work: VecDeque<FileId>,
    counters: PoolCounters,
    generation: u64,
}

impl PoolState {
    /// A pool of the named files (`page_bytes` × `pages_per_file` each), in the states
    /// recorded for them (`None`: not recorded, so not provably zero).
    pub fn new(
        page_bytes: u64,
        pages_per_file: u32,
        files: impl IntoIterator<Item = (String, Option<Persisted>)>,
    ) -> PoolState {
        let mut pool = PoolState {
            files: Vec::new(),
            pages_per_file,
            page_bytes,
            work: VecDeque::new(),
            counters: PoolCounters::default(),
            generation: 0,
        };
        for (name, recorded) in files {
            let id = FileId(pool.files.len());
            let state = match recorded {
                Some(Persisted::Held) => FileState::Held,
                Some(Persisted::Orphaned) => FileState::Orphaned,
                Some(Persisted::Zero) => pool.unchecked(false),
                Some(Persisted::Dirty) | None => pool.unchecked(true),
            };
            if matches!(state, FileState::Dirty { .. }) {
                pool.work.push_back(id);
            }
            pool.files.push(File {
                name,
                state,
                owner: None,
            });
        }
        pool
    }

    fn unchecked(&self, dirty: bool) -> FileState {
        FileState::Dirty {
            dirty: vec![dirty; self.pages_per_file as usize],
            holes_checked: false,
        }
    }

    /// Bytes per file.
    pub fn file_bytes(&self) -> u64 {
        self.page_bytes * u64::from(self.pages_per_file)
    }

    /// Bytes per huge page.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Huge pages per file.
    pub fn pages_per_file(&self) -> u32 {
        self.pages_per_file
    }

    /// Number of files.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// A file's name.
    pub fn name(&self, file: FileId) -> &str {
        &self.files[file.0].name
    }

    /// A file's state.
    pub fn state(&self, file: FileId) -> &FileState {
        &self.files[file.0].state
    }

    /// The file called `name`.
    pub fn find(&self, name: &str) -> Option<FileId> {
        self.files.iter().position(|f| f.name == name).map(FileId)
    }

    /// Bumped on every change of what [`PoolState::persisted`] returns.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Counters.
    pub fn counters(&self) -> PoolCounters {
        self.counters
    }

    /// Adds the time a zeroer spent on pages (for the zeroing rate).
    pub fn add_zeroing_time(&mut self, nanos: u64) {
        self.counters.zeroing_nanos += nanos;
    }

    /// What the state file must say, per file.
    pub fn persisted(&self) -> Vec<(&str, Persisted)> {
        self.files
            .iter()
            .map(|f| (f.name.as_str(), persisted_of(&f.state)))
            .collect()
    }

    fn set(&mut self, file: FileId, state: FileState) {
        let before = self.persisted_one(file);
        let f = &mut self.files[file.0];
        if !taken(&state) {
            f.owner = None;
        }
        f.state = state;
        if self.persisted_one(file) != before {
            self.generation += 1;
        }
    }

    fn persisted_one(&self, file: FileId) -> Persisted {
        persisted_of(&self.files[file.0].state)
    }

    /// Hands out a file of at least `bytes`: a ready one if any, else a dirty one the
    /// caller zeroes inline. `Exhausted` when none is free (`zeroing` > 0: wait, retry).
    pub fn take(&mut self, bytes: u64) -> Result<Take, StateError> {
        if bytes == 0 {
            self.counters.take_failures += 1;
            return Err(StateError::ZeroBytes);
        }
        if bytes > self.file_bytes() {
            self.counters.take_failures += 1;
            return Err(StateError::TooLarge {
                wanted: bytes,
                file_bytes: self.file_bytes(),
            });
        }
        if let Some(i) = self.files.iter().position(|f| f.state == FileState::Ready) {
            self.set(FileId(i), FileState::Held);
            self.counters.takes += 1;
            self.counters.takes_prezeroed += 1;
            return Ok(Take::Ready(FileId(i)));
        }
        if let Some(file) = self.work.pop_front() {
            let job = self.start_job(file, ZeroingBy::Inline, u64::MAX);
            return Ok(Take::ZeroInline(job));
        }
        self.counters.take_failures += 1;
        let zeroing = self
            .files
            .iter()
            .filter(|f| matches!(f.state, FileState::Zeroing { .. }))
            .count() as u64;
        Err(StateError::Exhausted { zeroing })
    }

    /// Whether a free file waits for a job (dirty pages, or holes to check).
    pub fn has_work(&self) -> bool {
        !self.work.is_empty()
    }

    /// Pages of free files that need work.
    pub fn zeroable(&self) -> u64 {
        self.counts().zeroable
    }

    /// The oldest free file with work, for a background zeroer; `max_pages` bounds the
    /// pages it may zero (a `prezero N` request).
    pub fn next_job(&mut self, max_pages: u64) -> Option<Job> {
        let file = self.work.pop_front()?;
        Some(self.start_job(file, ZeroingBy::Background, max_pages))
    }

    fn start_job(&mut self, file: FileId, by: ZeroingBy, max_pages: u64) -> Job {
        let FileState::Dirty {
            dirty,
            holes_checked,
        } = std::mem::replace(&mut self.files[file.0].state, FileState::Held)
        else {
            unreachable!("the work queue holds dirty files only");
        };
        let pages = dirty
            .iter()
            .enumerate()
            .filter(|(_, d)| **d)
            .map(|(i, _)| PageIndex(i as u32))
            .take(max_pages.try_into().unwrap_or(usize::MAX))
            .collect();
        self.files[file.0].state = FileState::Zeroing {
            by,
            dirty,
            holes_checked,
        };
        Job {
            file,
            check_holes: !holes_checked,
            pages,
            by,
        }
    }

    fn zeroing_pages(&mut self, job: &Job) -> Result<(&mut Vec<bool>, &mut bool), StateError> {
        match &mut self.files[job.file.0].state {
            FileState::Zeroing {
                by,
                dirty,
                holes_checked,
            } if *by == job.by => Ok((dirty, holes_checked)),
            _ => Err(StateError::NotZeroing(job.file)),
        }
    }

    fn check_page(&self, job: &Job, page: PageIndex) -> Result<(), StateError> {
        if page.0 >= self.pages_per_file {
            return Err(StateError::BadPage {
                file: job.file,
                page,
                pages: self.pages_per_file,
            });
        }
        Ok(())
    }

    /// The job checked for holes: `holes` were missing and the kernel repopulated them
    /// (they read zero: not dirty any more).
    pub fn holes_repopulated(&mut self, job: &Job, holes: &[PageIndex]) -> Result<(), StateError> {
        for &page in holes {
            self.check_page(job, page)?;
        }
        let (dirty, checked) = self.zeroing_pages(job)?;
        *checked = true;
        for page in holes {
            dirty[page.0 as usize] = false;
        }
        self.counters.pages_repopulated += holes.len() as u64;
        Ok(())
    }

    /// The job zeroed `page`.
    pub fn page_zeroed(&mut self, job: &Job, page: PageIndex) -> Result<(), StateError> {
        self.check_page(job, page)?;
        let (dirty, _) = self.zeroing_pages(job)?;
        let was_dirty = std::mem::replace(&mut dirty[page.0 as usize], false);
        if was_dirty {
            match job.by {
                ZeroingBy::Background => self.counters.pages_zeroed_background += 1,
                ZeroingBy::Inline => self.counters.pages_zeroed_inline += 1,
            }
        }
        Ok(())
    }

    /// Ends a job. A file with nothing left becomes ready (background) or the taker's
    /// (inline; counted as a take); otherwise it goes back to the front of the work queue
    /// (an inline taker that failed gets nothing). Returns the file's new state.
    pub fn finish_job(&mut self, job: Job) -> Result<&FileState, StateError> {
        let (dirty, checked) = self.zeroing_pages(&job)?;
        let done = *checked && !dirty.iter().any(|d| *d);
        let left = FileState::Dirty {
            dirty: std::mem::take(dirty),
            holes_checked: *checked,
        };
        let next = match (done, job.by) {
            (true, ZeroingBy::Background) => FileState::Ready,
            (true, ZeroingBy::Inline) => {
                self.counters.takes += 1;
                self.counters.takes_zeroed_inline += 1;
                FileState::Held
            }
            (false, by) => {
                self.counters.jobs_interrupted += 1;
                if by == ZeroingBy::Inline {
                    self.counters.take_failures += 1;
                }
                self.work.push_front(job.file);
                left
            }
        };
        self.set(job.file, next);
        Ok(&self.files[job.file.0].state)
    }

    /// Page counts by state.
    pub fn counts(&self) -> PageCounts {
        let per = u64::from(self.pages_per_file);
        let mut c = PageCounts::default();
        for f in &self.files {
            match &f.state {
                FileState::Ready => c.free_zero += per,
                FileState::Held | FileState::Leased => c.in_use += per,
                FileState::Orphaned => c.orphaned += per,
                FileState::Zeroing { .. } => c.zeroing += per,
                FileState::Dirty { dirty, .. } => {
                    // Holes read zero: a page is work only if it may hold data.
                    let work = dirty.iter().filter(|d| **d).count() as u64;
                    c.zeroable += work;
                    c.free_zero += per - work;
                }
            }
        }
        c
    }
}

/// Whether a file in `state` is a client's (held, leased, or orphaned waiting for its
/// last user).
fn taken(state: &FileState) -> bool {
    matches!(
        state,
        FileState::Held | FileState::Leased | FileState::Orphaned
    )
}

/// How a file in `state` is recorded.
fn persisted_of(state: &FileState) -> Persisted {
    match state {
        FileState::Ready => Persisted::Zero,
        FileState::Held => Persisted::Held,
        FileState::Leased | FileState::Orphaned => Persisted::Orphaned,
        FileState::Dirty { .. } | FileState::Zeroing { .. } => Persisted::Dirty,
    }
}

mod lease;
mod owner;

pub use owner::{Claim, Connection, Owner, Returner};
#[cfg(test)]
mod tests;
