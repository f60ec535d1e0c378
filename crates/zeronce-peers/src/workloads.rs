//! The workloads (see the crate docs). Every figure is of this process only.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::measure::{ms, rss_anon_mib, touch, Timer};

const REUSE_BYTES: usize = 256 << 20;

/// Free 256 MiB, idle `delay_ms`, then allocate it zeroed again and touch it; free it and
/// read RSS `idle_after_s` seconds later (0: not read).
pub fn reuse(delay_ms: u64, idle_after_s: u64) -> Value {
    let mut first = vec![0u8; REUSE_BYTES];
    touch(&mut first);
    drop(first);
    let idle_from = Instant::now();
    std::thread::sleep(Duration::from_millis(delay_ms));
    let rss_idle = rss_anon_mib();
    let timer = Timer::start(idle_from);
    let mut again = vec![0u8; REUSE_BYTES];
    let alloc_cpu = timer.cpu();
    touch(&mut again);
    let (cpu, wall, faults) = (timer.cpu(), timer.wall(), timer.minor_faults());
    let rss_after = rss_anon_mib();
    drop(again);
    std::thread::sleep(Duration::from_secs(idle_after_s));
    json!({
        "workload": "reuse", "delay_ms": delay_ms, "idle_ms": timer.idle_ms(),
        "alloc_cpu_ms": ms(alloc_cpu), "cpu_ms": ms(cpu), "wall_ms": ms(wall),
        "minor_faults": faults, "pages_touched": REUSE_BYTES / 4096,
        "rss_idle_mib": rss_idle, "rss_after_mib": rss_after,
        "idle_after_s": idle_after_s, "rss_idle_after_free_mib": rss_anon_mib(),
    })
}

/// The floor: zeroing 256 MiB that is resident, and touching it.
pub fn floor() -> Value {
    let mut buf = vec![0u8; REUSE_BYTES];
    touch(&mut buf);
    let timer = Timer::start(Instant::now());
    buf.fill(0);
    std::hint::black_box(&mut buf);
    touch(&mut buf);
    json!({
        "workload": "floor", "idle_ms": timer.idle_ms(),
        "cpu_ms": ms(timer.cpu()), "wall_ms": ms(timer.wall()),
    })
}

/// A xorshift step.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// 2 threads allocating zeroed buffers of 1–64 MiB and touching them for `secs`; idle
/// time is counted from `started` (the process start).
pub fn churn(secs: u64, started: Instant) -> Value {
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let peak = AtomicU64::new(0);
    // The two threads' own CPU time (µs) and minor faults: with the pages they touched,
    // they tell a cold sample (slow refaults of memory the machine's host took back)
    // from a warm one, as for `reuse`.
    let (cpu_us, faults) = (AtomicU64::new(0), AtomicU64::new(0));
    let timer = Timer::start(started);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (stop, bytes, cpu_us, faults) = (&stop, &bytes, &cpu_us, &faults);
            s.spawn(move || {
                let own = Timer::start(Instant::now());
                let mut x = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
                while !stop.load(Relaxed) {
                    let n = (1 + next(&mut x) % 64) as usize * (1 << 20);
                    let mut v = vec![0u8; n];
                    touch(&mut v);
                    bytes.fetch_add(n as u64, Relaxed);
                }
                cpu_us.fetch_add(own.cpu().as_micros() as u64, Relaxed);
                faults.fetch_add(own.minor_faults(), Relaxed);
            });
        }
        while timer.wall() < Duration::from_secs(secs) {
            peak.fetch_max((rss_anon_mib() * 1024.0) as u64, Relaxed);
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Relaxed);
    });
    let wall = timer.wall();
    std::thread::sleep(Duration::from_secs(5));
    json!({
        "workload": "churn", "secs": secs, "idle_ms": timer.idle_ms(),
        "throughput_mib_s": bytes.load(Relaxed) as f64 / (1 << 20) as f64 / wall.as_secs_f64(),
        "cpu_ms": cpu_us.load(Relaxed) as f64 / 1e3, "minor_faults": faults.load(Relaxed),
        "pages_touched": bytes.load(Relaxed) / 4096,
        "peak_rss_mib": peak.load(Relaxed) as f64 / 1024.0,
        "rss_5s_after_mib": rss_anon_mib(),
    })
}

/// "Reads" `rounds` files of 64 MiB into fresh zeroed buffers and hashes them; idle time
/// is counted from `started` (the process start).
pub fn app(rounds: u64, started: Instant) -> Value {
    let timer = Timer::start(started);
    let mut digest = 0u64;
    let mut peak = 0f64;
    // The allocation and first touch of each buffer, timed apart from the work on it:
    // its CPU time and faults tell a cold sample from a warm one, as for `reuse`.
    let (mut alloc_cpu, mut faults) = (Duration::ZERO, 0);
    for r in 0..rounds {
        let own = Timer::start(Instant::now());
        let mut buf = vec![0u8; 64 << 20];
        touch(&mut buf);
        (alloc_cpu, faults) = (alloc_cpu + own.cpu(), faults + own.minor_faults());
        let mut x = r.wrapping_mul(2).wrapping_add(1);
        for chunk in buf.chunks_mut(8) {
            chunk.copy_from_slice(&next(&mut x).to_le_bytes()[..chunk.len()]);
        }
        digest ^= buf.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
            let w = c.iter().fold(0u64, |w, &b| w << 8 | u64::from(b));
            (h ^ w).wrapping_mul(0x100_0000_01b3)
        });
        peak = peak.max(rss_anon_mib());
    }
    json!({
        "workload": "app", "rounds": rounds, "digest": format!("{digest:016x}"),
        "idle_ms": timer.idle_ms(), "work_cpu_ms": ms(timer.cpu()), "wall_ms": ms(timer.wall()),
        "cpu_ms": ms(alloc_cpu), "minor_faults": faults, "pages_touched": rounds * (16 << 10),
        "peak_rss_mib": peak,
    })
}
