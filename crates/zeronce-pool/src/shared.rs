//! What the pool's threads share: the pure [`PoolState`] and the events behind one mutex,
//! the files, the wake-ups, the bandwidth cap and the state file. The [`Pool`] handle,
//! the zeroing workers and the events thread all work through it.
//!
//! [`Pool`]: crate::Pool

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zeronce_mem::ZeroKernel;
use zeronce_types::sync::{self, lock};

use crate::events::Events;
use crate::files::PoolFiles;
use crate::pacer::Pacer;
use crate::persist::{self, PersistError};
use crate::state::PoolState;

/// What the pool's mutex guards.
pub(crate) struct Inner {
    pub(crate) pool: PoolState,
    pub(crate) events: Events,
}

/// See the module docs.
pub(crate) struct Shared {
    pub(crate) files: PoolFiles,
    inner: Mutex<Inner>,
    /// Work appeared, a file became ready, or shutdown.
    pub(crate) changed: Condvar,
    /// An event was held back, or shutdown.
    timer: Condvar,
    stop: AtomicBool,
    pacer: Option<Mutex<Pacer>>,
    pacer_epoch: Instant,
    state_file: PathBuf,
    persisted_generation: Mutex<Option<u64>>,
    pub(crate) kernel: ZeroKernel,
    /// Checks of orphaned files' users done so far.
    pub(crate) orphan_checks: AtomicU64,
}

impl Shared {
    /// The pool over `files` in state `pool`, its state file, its cap on background
    /// zeroing (bytes per second) and its least time between two events.
    pub(crate) fn new(
        files: PoolFiles,
        pool: PoolState,
        state_file: PathBuf,
        max_bytes_per_sec: Option<u64>,
        min_event_interval: Duration,
    ) -> Shared {
        let page = pool.page_bytes();
        Shared {
            files,
            inner: Mutex::new(Inner {
                pool,
                events: Events::new(min_event_interval),
            }),
            changed: Condvar::new(),
            timer: Condvar::new(),
            stop: AtomicBool::new(false),
            pacer: max_bytes_per_sec.map(|rate| Mutex::new(Pacer::new(rate, page))),
            pacer_epoch: Instant::now(),
            state_file,
            persisted_generation: Mutex::new(None),
            kernel: ZeroKernel::auto(page as usize),
            orphan_checks: AtomicU64::new(0),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every state change is one call on the pure state, consistent between calls.
        lock(&self.inner)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sets the stop flag and wakes every waiting thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _inner = self.lock();
        self.changed.notify_all();
        self.timer.notify_all();
    }

    /// Writes the state file if the state changed since the last write.
    pub(crate) fn persist(&self) -> Result<(), PersistError> {
        let (generation, text) = {
            let inner = self.lock();
            let p = &inner.pool;
            let text = persist::render_with_tokens(
                p.page_bytes(),
                p.file_bytes(),
                p.persisted(),
                p.tokens(),
            );
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

    /// Tells the events the zeroable count may have grown.
    pub(crate) fn zeroable_grew(&self, inner: &mut Inner) {
        let zeroable = inner.pool.zeroable();
        if zeroable > 0 {
            inner.events.grew(zeroable);
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

    /// The events thread: fires held-back events when due, until shutdown.
    pub(crate) fn run_timer(&self) {
        let mut inner = self.lock();
        while !self.stopping() {
            let Inner { pool, events } = &mut *inner;
            inner = match events.poll(|| pool.zeroable()) {
                None => sync::wait(&self.timer, inner),
                Some(wait) => sync::wait_timeout(&self.timer, inner, wait),
            };
        }
    }
}
