//! The zeroing bandwidth cap: a virtual-clock token bucket shared by every zeroer. Pure:
//! the caller passes the time and sleeps for what it is told.

use std::time::Duration;

/// Keeps the bytes zeroed under `bytes_per_sec`, allowing a burst of `burst` bytes.
#[derive(Clone, Debug)]
pub struct Pacer {
    bytes_per_sec: f64,
    burst: Duration,
    /// The time at which everything granted so far has been "paid for".
    paid_until: Duration,
}

impl Pacer {
    /// A cap of `bytes_per_sec` (at least 1), with bursts of `burst_bytes`.
    pub fn new(bytes_per_sec: u64, burst_bytes: u64) -> Pacer {
        let rate = bytes_per_sec.max(1) as f64;
        Pacer {
            bytes_per_sec: rate,
            burst: Duration::from_secs_f64(burst_bytes as f64 / rate),
            paid_until: Duration::ZERO,
        }
    }

    /// Grants `bytes` at time `now`; returns how long to wait before writing them.
    pub fn reserve(&mut self, bytes: u64, now: Duration) -> Duration {
        let start = self.paid_until.max(now);
        self.paid_until = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
        self.paid_until
            .saturating_sub(now)
            .saturating_sub(self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_stream_is_held_to_the_rate_after_the_burst() {
        let mut p = Pacer::new(1000, 2000);
        let mut now = Duration::ZERO;
        // Two 1000-byte grants fit in the burst.
        assert_eq!(p.reserve(1000, now), Duration::ZERO);
        assert_eq!(p.reserve(1000, now), Duration::ZERO);
        // The third waits one second; sleeping it keeps 1000 B/s.
        let wait = p.reserve(1000, now);
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-9, "{wait:?}");
        now += wait;
        let wait = p.reserve(1000, now);
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-9, "{wait:?}");
        // After a long idle period only the burst is available again, not more.
        now += Duration::from_secs(100);
        assert_eq!(p.reserve(2000, now), Duration::ZERO);
        assert!(p.reserve(1000, now) > Duration::ZERO);
    }
}
