//! Clocks and RSS readers of the workloads.

use std::time::{Duration, Instant};

/// CPU time consumed by the calling thread so far.
pub fn thread_cpu() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `RssAnon` of this process in MiB (0 if unreadable).
pub fn rss_anon_mib() -> f64 {
    zeronce_mem::ProcessRss::read().map_or(0.0, |r| r.anon as f64 / (1 << 20) as f64)
}

/// Minor page faults of the calling thread so far (`/proc/thread-self/stat`, field 10; 0
/// if unreadable): with the step's CPU time it tells a cold sample from a warm one.
pub fn thread_minor_faults() -> u64 {
    std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.to_owned();
            after.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The clocks of one timed step, and the idle time before it: memory idle for seconds may
/// be reclaimed by the machine's own host and faulted back slowly, so every step records
/// how long its memory sat unused before the clocks started.
pub struct Timer {
    idle: Duration,
    faults0: u64,
    cpu0: Duration,
    wall0: Instant,
}

impl Timer {
    /// Starts the clocks; the idle time is the time since `idle_from` (the last free of the
    /// memory the step reuses, the last write of it, or the process start).
    pub fn start(idle_from: Instant) -> Self {
        let idle = idle_from.elapsed();
        Timer {
            idle,
            faults0: thread_minor_faults(),
            cpu0: thread_cpu(),
            wall0: Instant::now(),
        }
    }

    /// Milliseconds idle before the step.
    pub fn idle_ms(&self) -> f64 {
        ms(self.idle)
    }

    /// CPU time of the calling thread since the start.
    pub fn cpu(&self) -> Duration {
        thread_cpu() - self.cpu0
    }

    /// Minor page faults of the calling thread since the start.
    pub fn minor_faults(&self) -> u64 {
        thread_minor_faults().saturating_sub(self.faults0)
    }

    /// Wall time since the start.
    pub fn wall(&self) -> Duration {
        self.wall0.elapsed()
    }
}

/// Writes a non-zero byte every 4 KiB of `buf` (what a program filling it does to the
/// page tables), kept by `black_box`.
pub fn touch(buf: &mut [u8]) {
    for i in (0..buf.len()).step_by(4096) {
        buf[i] = 1;
    }
    std::hint::black_box(buf);
}
