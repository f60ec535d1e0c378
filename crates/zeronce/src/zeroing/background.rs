//! The background zeroer of the zero-once lifecycle: freed chunks of reportable order are
//! zeroed off the allocation path with streaming stores (known zero, still resident), so a
//! zero-request takes them with no memset and no fault; the reporting engine discards them
//! later. A pass works chunk by chunk under the [`ZeroMap`] protocol: it never writes a
//! chunk an allocation holds, and an allocation waits at most one chunk's zeroing.
//!
//! The caller decides what CPU it gets: [`crate::ProcessMemory::prezero`] runs a pass on
//! the caller's own thread; [`ZeroerConfig`] starts threads with a priority and a rate.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zeronce_mem::{cache_resident_limit, SharedRam};
use zeronce_mm::sync::{lock, wait};
use zeronce_mm::{MemoryManager, PAGE_SIZE};

use super::zeromap::{Site, ZeroMap};

/// Background zeroer threads: how many, how nice, how fast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroerConfig {
    /// Threads (default 1; 0 = none: only [`crate::ProcessMemory::prezero`] zeroes).
    pub threads: usize,
    /// Nice value set on each thread (default `Some(10)`, below normal work; `None`:
    /// inherit the creating thread's).
    pub nice: Option<i32>,
    /// Most bytes per second all threads together zero (default `None`: unlimited).
    pub bytes_per_sec: Option<u64>,
}

impl Default for ZeroerConfig {
    fn default() -> Self {
        ZeroerConfig {
            threads: 1,
            nice: Some(10),
            bytes_per_sec: None,
        }
    }
}

/// What a zeroing pass works on.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) mm: Arc<MemoryManager>,
    pub(crate) ram: Arc<SharedRam>,
    pub(crate) map: Arc<ZeroMap>,
}

/// Sleeps as needed to keep `bytes` since `start` under `rate` bytes per second.
struct Pace {
    start: Instant,
    bytes: u64,
    rate: Option<u64>,
}

impl Pace {
    fn new(rate: Option<u64>) -> Pace {
        Pace {
            start: Instant::now(),
            bytes: 0,
            rate: rate.filter(|&r| r > 0),
        }
    }

    fn add(&mut self, bytes: u64) {
        self.bytes += bytes;
        if let Some(rate) = self.rate {
            let due = Duration::from_secs_f64(self.bytes as f64 / rate as f64);
            if let Some(ahead) = due.checked_sub(self.start.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
}

impl Target {
    /// Zeroes free dirty chunks until `max_bytes` are done, nothing is left, or `stop`
    /// says so (checked between chunks). Returns the bytes zeroed.
    pub(crate) fn pass(&self, max_bytes: u64, stop: &dyn Fn() -> bool, rate: Option<u64>) -> u64 {
        let mut pace = Pace::new(rate);
        let mut done = 0;
        for i in 0..self.map.len() {
            if done >= max_bytes || stop() {
                break;
            }
            if self.map.is_dirty(i) && self.zero_chunk(i) {
                let bytes = self.map.chunk_range(i).bytes();
                done += bytes;
                pace.add(bytes);
            }
        }
        done
    }

    /// Zeroes chunk `i` if it is dirty and inside a free, unreported, not-known-zero block;
    /// whether it did. Tells the manager when the whole block reads zero.
    fn zero_chunk(&self, i: usize) -> bool {
        let map = &self.map;
        if !map.begin_zeroing(i) {
            return false;
        }
        let chunk = map.chunk_range(i);
        // Under the zone lock: the chunk is free now; an allocation taking it from here on
        // waits for the end of this zeroing before handing it out.
        let block = match self.mm.free_state_of(chunk.start) {
            Some((b, s)) if b.order >= map.chunk_order() && !s.known_zero && !s.reported => b,
            _ => {
                map.end_zeroing(i, false);
                return false;
            }
        };
        let offset = (chunk.start.0 * PAGE_SIZE) as usize;
        // A discard of the same block (the engine isolated it since) holds a claim.
        let Ok(mut bytes) = self.ram.claim(offset, chunk.bytes() as usize) else {
            map.end_zeroing(i, false);
            return false;
        };
        // 2 MiB and up: streaming (non-temporal) stores, no cache pollution.
        bytes.zero(None);
        drop(bytes);
        map.end_zeroing(i, true);
        map.count_zeroed(Site::Background, chunk.bytes());
        if chunk.end() >= block.range().end() {
            // Only if every chunk of the block is still zero, checked under the zone lock.
            let r = self
                .mm
                .mark_known_zero_where(block.range(), |b| map.all_zero(b.range()));
            if let Err(e) = r {
                tracing::error!(%e, %block, "background zeroing: a zeroed block does not read zero");
            }
        }
        true
    }
}

/// How long after the free of a block that fits in the cache the zeroer threads start
/// their pass (see [`run`]).
const ZEROING_GRACE: Duration = Duration::from_millis(5);

/// Wake-up flags of the zeroer threads.
#[derive(Debug, Default)]
struct Wake {
    /// Chunks were freed since the threads last looked.
    pending: bool,
    /// One of those frees was of a block larger than [`cache_resident_limit`].
    urgent: bool,
    /// Zeroing paused by the caller.
    paused: bool,
    /// Being dropped.
    shutdown: bool,
}

/// What the caller and the zeroer threads share: the wake-up state and its condition
/// variable.
struct ZeroerControl {
    wake: Mutex<Wake>,
    cv: Condvar,
    /// Mirrors `paused || shutdown` for the passes (read between chunks).
    stop: AtomicBool,
}

/// Background zeroer threads; stopped and joined on drop.
pub(crate) struct BackgroundZeroer {
    control: Arc<ZeroerControl>,
    threads: Vec<JoinHandle<()>>,
}

impl BackgroundZeroer {
    /// Starts `config.threads` threads zeroing `target`.
    pub(crate) fn start(target: Target, config: ZeroerConfig) -> std::io::Result<Self> {
        let control = Arc::new(ZeroerControl {
            wake: Mutex::new(Wake::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let rate = config
            .bytes_per_sec
            .map(|r| r / config.threads.max(1) as u64);
        let mut threads = Vec::new();
        for n in 0..config.threads {
            let (control, target) = (Arc::clone(&control), target.clone());
            let t = std::thread::Builder::new()
                .name(format!("zeronce-zero-{n}"))
                .spawn(move || {
                    crate::threads::mark_internal_thread();
                    if let Some(nice) = config.nice {
                        let tid = rustix::thread::gettid();
                        if let Err(e) = rustix::process::setpriority_process(Some(tid), nice) {
                            tracing::warn!(%e, nice, "background zeroer: cannot set priority");
                        }
                    }
                    run(&control, &target, rate);
                })?;
            threads.push(t);
        }
        Ok(BackgroundZeroer { control, threads })
    }

    /// A block of `bytes` left dirty chunks: wake a thread (only the first free since the
    /// threads last looked pays for the wake-up; see [`run`] for when it starts).
    pub(crate) fn freed(&self, bytes: u64) {
        let urgent = bytes > cache_resident_limit() as u64;
        let mut w = lock(&self.control.wake);
        if !w.pending || (urgent && !w.urgent) {
            w.pending = true;
            w.urgent |= urgent;
            drop(w);
            self.control.cv.notify_all();
        }
    }

    /// Pauses (the current chunk is finished) or resumes zeroing.
    pub(crate) fn set_paused(&self, paused: bool) {
        let mut w = lock(&self.control.wake);
        w.paused = paused;
        w.pending = true;
        self.control.stop.store(paused || w.shutdown, Relaxed);
        drop(w);
        self.control.cv.notify_all();
    }
}

fn run(control: &ZeroerControl, target: &Target, rate: Option<u64>) {
    loop {
        let urgent = {
            let mut w = lock(&control.wake);
            while !w.shutdown && (w.paused || !w.pending) {
                w = wait(&control.cv, w);
            }
            if w.shutdown {
                return;
            }
            w.pending = false;
            std::mem::take(&mut w.urgent)
        };
        // A block that fits in the cache, freed and at once allocated again (a buffer
        // reused in a loop), is best zeroed by its allocation, through the cache it is
        // hot in: zeroing it here first races that allocation and leaves it cache-cold.
        // So after such frees the pass starts a moment later (blocks taken again by then
        // are no longer free); after a larger one, at once (its zeroing then runs beside
        // the allocation's, on another CPU).
        if !urgent {
            std::thread::sleep(ZEROING_GRACE);
        }
        target.pass(u64::MAX, &|| control.stop.load(Relaxed), rate);
    }
}

impl Drop for BackgroundZeroer {
    fn drop(&mut self) {
        {
            let mut w = lock(&self.control.wake);
            w.shutdown = true;
            self.control.stop.store(true, Relaxed);
        }
        self.control.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
