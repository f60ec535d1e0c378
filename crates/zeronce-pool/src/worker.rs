//! The zeroing workers, the operator's limits on them ([`WorkerConfig`], its CPU list
//! read by [`parse_cpu_list`]), and the running of one job (shared with `take` and
//! `prezero`, which run jobs on the requesting thread: [`run_job`]).

use std::time::{Duration, Instant};

use rustix::thread::{sched_setaffinity, CpuSet};

use zeronce_mem::{LeaseError, LeaseProbe, LeaseState};

use crate::files::PoolFiles;
use crate::shared::Shared;
use crate::state::{FileId, FileState, Job, PageIndex};

/// How the operator limits the zeroing workers' CPU use.
#[derive(Clone, Debug, Default)]
pub struct WorkerConfig {
    /// Number of worker threads (0: zeroing only on `prezero` requests and takes).
    pub threads: usize,
    /// CPUs the workers may run on (empty: any).
    pub cpus: Vec<usize>,
    /// Nice value of the workers (`None`: the daemon's).
    pub nice: Option<i32>,
    /// Cap on the bytes zeroed per second by workers and `prezero` together (`None`: no
    /// cap). Zeroing for a waiting taker is never capped.
    pub max_bytes_per_sec: Option<u64>,
}

/// Parses a CPU list: `0-3,6,8-9`.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("{text:?} is not a CPU list (e.g. 0-3,6)");
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: usize = lo.trim().parse().map_err(|_| bad())?;
        let hi: usize = hi.trim().parse().map_err(|_| bad())?;
        if lo > hi || hi >= 1 << 16 {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    if cpus.is_empty() {
        return Err(bad());
    }
    Ok(cpus)
}

/// What running a job did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct JobOutcome {
    pub(crate) zeroing_nanos: u64,
    /// Pages zeroed.
    pub(crate) zeroed: u64,
    /// Holes the kernel repopulated.
    pub(crate) repopulated: u64,
    /// Someone else had the file open before the first page, or opened it between two.
    pub(crate) in_use: bool,
}

/// The daemon's write lease on a job's file (see `usage`), held from before the job's
/// first page until the pool state records the job's end (ready, or orphaned): any
/// `open` of the file meanwhile breaks it. Given back when dropped.
struct JobLease<'a> {
    files: &'a PoolFiles,
    file: FileId,
    /// Whether a lease is held (not where leases are not available: the job relies on
    /// the `/proc` check made before it then).
    held: bool,
}

impl<'a> JobLease<'a> {
    /// The lease on `file`, or `None` when someone else has the file open or mapped.
    fn take(files: &'a PoolFiles, file: FileId) -> Option<JobLease<'a>> {
        let held = match files.lease(file) {
            Ok(LeaseProbe::Held) => true,
            Ok(LeaseProbe::Busy) => return None,
            Err(LeaseError::Unsupported(_)) => false,
            Err(e) => {
                tracing::warn!(path = %files.path(file).display(), %e, "no lease for a zeroing job: held until checked");
                return None;
            }
        };
        Some(JobLease { files, file, held })
    }

    /// Whether someone opened the file since the lease was taken.
    fn broken(&self) -> bool {
        self.held && !matches!(self.files.lease_state(self.file), Ok(LeaseState::Write))
    }
}

impl Drop for JobLease<'_> {
    fn drop(&mut self) {
        if self.held {
            self.files.release_lease(self.file);
        }
    }
}

/// Applies the CPU list and nice value to the calling thread; failures are logged (the
/// worker still runs, unrestricted).
fn confine(config: &WorkerConfig) {
    if !config.cpus.is_empty() {
        let mut set = CpuSet::new();
        for &cpu in &config.cpus {
            set.set(cpu);
        }
        if let Err(errno) = sched_setaffinity(None, &set) {
            tracing::warn!(%errno, cpus = ?config.cpus, "worker CPU list not applied");
        }
    }
    if let Some(nice) = config.nice {
        let tid = rustix::thread::gettid();
        if let Err(errno) = rustix::process::setpriority_process(Some(tid), nice) {
            tracing::warn!(%errno, nice, "worker nice value not applied");
        }
    }
}

/// A worker: takes the oldest job, runs it, until shutdown.
pub(crate) fn run(shared: &Shared, config: &WorkerConfig, index: usize) {
    confine(config);
    tracing::debug!(index, "zeroing worker started");
    loop {
        let job = {
            let mut inner = shared.lock();
            loop {
                if shared.stopping() {
                    return;
                }
                if let Some(job) = inner.pool.next_job(u64::MAX) {
                    break job;
                }
                inner = zeronce_types::sync::wait(&shared.changed, inner);
            }
        };
        let file = job.file;
        let state = run_job(shared, job, true);
        if matches!(state, FileState::Dirty { .. }) && !shared.stopping() {
            // Interrupted by a failure (logged): do not spin on the same file.
            tracing::debug!(?file, "job left work; backing off");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// Runs `job` to its end (or `stop`), reporting to the pool; the file's new state.
pub(crate) fn run_job(shared: &Shared, job: Job, paced: bool) -> FileState {
    // Held until the pool state says what became of the file.
    let lease = JobLease::take(&shared.files, job.file);
    let mut outcome = match &lease {
        Some(lease) => zero_job(shared, &job, paced, lease),
        None => JobOutcome {
            in_use: true,
            ..JobOutcome::default()
        },
    };
    let (file, by) = (job.file, job.by);
    let mut inner = shared.lock();
    // Opened during the last page or since: zero, but someone has it.
    outcome.in_use |= lease.as_ref().is_some_and(JobLease::broken);
    inner.pool.add_zeroing_time(outcome.zeroing_nanos);
    let finished = if outcome.in_use {
        tracing::warn!(
            path = %shared.files.path(file).display(),
            "file opened by someone else while queued or being zeroed: held as orphaned until unused"
        );
        inner.pool.job_in_use(job)
    } else {
        inner.pool.finish_job(job)
    };
    let state = match finished {
        Ok(s) => s.clone(),
        Err(e) => {
            tracing::error!(%e, "finishing a job this pool made failed");
            FileState::Held
        }
    };
    drop(inner);
    // Given back once the state is recorded: an opener waiting on it finds the file
    // orphaned (or, past the last check, ready like any free file).
    drop(lease);
    tracing::info!(
        path = %shared.files.path(file).display(), ?by, zeroed = outcome.zeroed,
        repopulated = outcome.repopulated, ready = matches!(state, FileState::Ready | FileState::Held),
        "zeroing job done"
    );
    shared.changed.notify_all();
    if let Err(e) = shared.persist() {
        tracing::error!(%e, "state file not updated");
    }
    state
}

/// Checks the job's file for holes (repopulating them) and zeroes its dirty pages,
/// stopping between pages at shutdown, under the file's write lease: if someone opens
/// the file, nothing more is touched ([`JobOutcome::in_use`]). Reports every step to the
/// pool state.
fn zero_job(shared: &Shared, job: &Job, paced: bool, lease: &JobLease<'_>) -> JobOutcome {
    let mut outcome = JobOutcome::default();
    zero_pages(shared, job, paced, lease, &mut outcome);
    outcome
}

fn zero_pages(
    shared: &Shared,
    job: &Job,
    paced: bool,
    lease: &JobLease<'_>,
    outcome: &mut JobOutcome,
) {
    let mut holes: Vec<PageIndex> = Vec::new();
    if job.check_holes {
        match shared.files.repopulate(job.file) {
            Ok(found) => {
                outcome.repopulated = found.len() as u64;
                holes = found;
            }
            Err(e) => {
                tracing::warn!(%e, "repopulating holes failed; the file stays zeroable");
                return;
            }
        }
        if let Err(e) = shared.lock().pool.holes_repopulated(job, &holes) {
            tracing::error!(%e, "recording repopulated holes failed");
            return;
        }
    }
    let pages: Vec<PageIndex> = job
        .pages
        .iter()
        .copied()
        .filter(|p| !holes.contains(p))
        .collect();
    if pages.is_empty() {
        return;
    }
    let mut map = match shared.files.map(job.file) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(%e, "mapping a file to zero failed; it stays zeroable");
            return;
        }
    };
    let page_bytes = shared.files.page_bytes();
    for page in pages {
        if shared.stopping() {
            break;
        }
        if paced {
            // In slices, so an opener waits for the lease's break at most one slice.
            let until = Instant::now() + shared.pace(page_bytes as u64);
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                if left.is_zero() || lease.broken() || shared.stopping() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(100)));
            }
        }
        if shared.stopping() {
            break;
        }
        if lease.broken() {
            outcome.in_use = true;
            break;
        }
        let start = Instant::now();
        let offset = page.0 as usize * page_bytes;
        if let Err(e) = map.zero_with(offset, page_bytes, shared.kernel, None) {
            tracing::error!(%e, "page outside its file");
            break;
        }
        outcome.zeroing_nanos += start.elapsed().as_nanos() as u64;
        outcome.zeroed += 1;
        if let Err(e) = shared.lock().pool.page_zeroed(job, page) {
            tracing::error!(%e, "recording a zeroed page failed");
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-2,5"), Ok(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3"), Ok(vec![3]));
        for bad in ["", "a", "3-1", "1-", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }
}
