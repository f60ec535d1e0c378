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

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The clocks of one timed step, and the idle time before it: memory idle for seconds may
/// be reclaimed by the machine's own host and faulted back slowly, so every step records
/// how long its memory sat unused before the clocks started.
pub struct Timer {
    idle: Duration,
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
