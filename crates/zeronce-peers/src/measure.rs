//! Clocks and RSS readers of the workloads.

use std::time::Duration;

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

/// Writes a non-zero byte every 4 KiB of `buf` (what a program filling it does to the
/// page tables), kept by `black_box`.
pub fn touch(buf: &mut [u8]) {
    for i in (0..buf.len()).step_by(4096) {
        buf[i] = 1;
    }
    std::hint::black_box(buf);
}
