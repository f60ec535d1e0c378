//! Small statistics and timing helpers shared by every benchmark.

use std::time::{Duration, Instant};

/// CPU time consumed by the calling thread so far (what `perf stat` calls "task-clock", the measure the upstream series report).
pub fn thread_cpu_time() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Wall and thread-CPU time of one call of `f`, with its result.
pub fn time_it<T>(f: impl FnOnce() -> T) -> (Sample, T) {
    let cpu0 = thread_cpu_time();
    let wall0 = Instant::now();
    let out = f();
    let wall = wall0.elapsed();
    let cpu = thread_cpu_time().saturating_sub(cpu0);
    (Sample { wall, cpu }, out)
}

/// One timed run.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Elapsed wall-clock time.
    pub wall: Duration,
    /// CPU time of the timing thread.
    pub cpu: Duration,
}

/// Summary of a series of measurements (any unit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Number of values.
    pub n: usize,
    /// Median.
    pub median: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (0 for fewer than two values).
    pub sd: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` when empty.
    pub fn of(values: &[f64]) -> Option<Summary> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let sd = if n > 1 {
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Summary {
            n,
            median,
            mean,
            sd,
            min: v[0],
            max: v[n - 1],
        })
    }

    /// As a JSON object.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "n": self.n, "median": self.median, "mean": self.mean,
            "sd": self.sd, "min": self.min, "max": self.max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_odd_and_even_series() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.mean, s.min, s.max), (2.0, 2.0, 1.0, 3.0));
        assert!((s.sd - 1.0).abs() < 1e-12);
        let s = Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn thread_cpu_time_advances_with_work() {
        let (sample, sum) = time_it(|| (0..5_000_000u64).fold(0u64, |a, b| a.wrapping_add(b * b)));
        assert_ne!(sum, 1);
        assert!(sample.cpu > Duration::ZERO);
    }
}
