//! `zeronce bench zero`: GB/s of each zeroing kernel this CPU has, and of plain memset
//! (`write_bytes`), on warm memory: one 256 MiB private anonymous THP buffer, faulted in
//! once and reused, re-dirtied (untimed) before every timed call.
//!
//! Three scenarios, every kernel measured round-robin within each run (the starting
//! kernel rotates) so they share the machine's noise; medians over the runs:
//!
//! - **2 MiB chunks**: one 2 MiB chunk zeroed per call, walking through the buffer (far
//!   larger than the last-level cache), so each chunk is cold and holds old data, like a
//!   freshly freed huge page. `best_over_rep_stosb_2mib` is taken from this one.
//! - **2 MiB hot**: the same 2 MiB chunk zeroed again and again (cache-resident; shown
//!   to explain why cache-allocating kernels look good in naive loops).
//! - **256 MiB**: one call zeroing the whole buffer.
//!
//! Time is the measuring thread's CPU time (the upstream series' task-clock: preemption by the
//! other jobs on this shared 2-vCPU VM is not counted); wall-clock medians are in the JSON.

use crate::common::{BenchResult, Common};
use crate::stats::{time_it, Summary};
use clap::Args;
use serde_json::{json, Map, Value};
use zeronce_mem::NON_TEMPORAL_THRESHOLD;
use zeronce_mem::{BackingKind, GuestRam, RangeError, ZeroKernel};

/// Arguments of `zeronce bench zero`.
#[derive(Args, Debug)]
pub struct ZeroArgs {
    /// `--quick` and `--json`.
    #[command(flatten)]
    pub common: Common,
}

const MIB: usize = 1 << 20;
const CHUNK: usize = 2 * MIB;
const BUF: usize = 256 * MIB;
/// The "old data" every timed call starts from.
const OLD: u8 = 0xa5;

/// One measured scenario.
#[derive(Clone, Copy)]
enum Scenario {
    ChunksWalk,
    ChunkHot,
    Big,
}

impl Scenario {
    const ALL: [Scenario; 3] = [Scenario::ChunksWalk, Scenario::ChunkHot, Scenario::Big];

    fn key(self) -> &'static str {
        match self {
            Scenario::ChunksWalk => "2mib_chunks",
            Scenario::ChunkHot => "2mib_hot",
            Scenario::Big => "256mib",
        }
    }

    fn describe(self) -> String {
        match self {
            Scenario::ChunksWalk => format!(
                "one 2 MiB chunk per call, walking through a pre-touched, dirty {} MiB buffer \
                 (each chunk cold and holding old data, like a freshly freed huge page)",
                BUF / MIB
            ),
            Scenario::ChunkHot => {
                format!(
                    "the same 2 MiB chunk zeroed {} times (cache-resident after the first)",
                    BUF / CHUNK
                )
            }
            Scenario::Big => format!(
                "one call zeroing a pre-touched, dirty {} MiB buffer",
                BUF / MIB
            ),
        }
    }

    /// Zeroes this scenario's bytes once with `kernel`; returns the bytes zeroed.
    fn run(self, ram: &mut GuestRam, kernel: ZeroKernel) -> Result<usize, RangeError> {
        match self {
            Scenario::ChunksWalk => {
                for off in (0..ram.len()).step_by(CHUNK) {
                    ram.zero_with(off, CHUNK, kernel, None)?;
                }
                Ok(ram.len())
            }
            Scenario::ChunkHot => {
                let reps = ram.len() / CHUNK;
                for _ in 0..reps {
                    ram.zero_with(0, CHUNK, kernel, None)?;
                }
                Ok(reps * CHUNK)
            }
            Scenario::Big => {
                ram.zero_with(0, ram.len(), kernel, None)?;
                Ok(ram.len())
            }
        }
    }
}

/// GB/s medians (CPU time and wall time) of one kernel in one scenario.
struct Rates {
    cpu: Summary,
    wall: Summary,
}

/// What the runs measured: `rates[scenario][kernel]`, kernels as in `kernels`.
struct Measured {
    runs: usize,
    kernels: Vec<ZeroKernel>,
    rates: Vec<Vec<Rates>>,
}

/// The figures the benchmark reports, taken from [`Measured`].
struct Findings {
    /// Rep stosb where the CPU has it, else memset.
    baseline: ZeroKernel,
    best2: ZeroKernel,
    best2_rate: f64,
    ratio2: Option<f64>,
    best256: ZeroKernel,
    ratio256: Option<f64>,
    auto2: ZeroKernel,
    auto256: ZeroKernel,
    auto2_over_baseline: Option<f64>,
}

/// Index in [`Scenario::ALL`] of the 2 MiB chunks walk and of the 256 MiB call.
const WALK: usize = 0;
const BIG: usize = 2;

/// Runs the benchmark.
pub fn run(args: &ZeroArgs) -> BenchResult {
    let Common { quick, json } = args.common;
    let m = measure(if quick { 7 } else { 21 })?;
    let f = m.findings()?;
    if json {
        print_json(quick, &m, &f);
    } else {
        print_table(quick, &m, &f);
    }
    Ok(())
}

/// Times every kernel in every scenario, `runs` times, round-robin within each run.
fn measure(runs: usize) -> Result<Measured, Box<dyn std::error::Error>> {
    let kernels = ZeroKernel::available();
    // Warm: faulted in (THP) once and reused; re-dirtied (untimed) before every timed call.
    let mut ram = GuestRam::new(BUF, BackingKind::Anonymous { thp: true })?;

    // rates[scenario][kernel] = (cpu GB/s per run, wall GB/s per run)
    let mut samples = vec![vec![(Vec::new(), Vec::new()); kernels.len()]; Scenario::ALL.len()];
    for (si, sc) in Scenario::ALL.into_iter().enumerate() {
        for &k in &kernels {
            ram.fill(0, BUF, OLD)?;
            sc.run(&mut ram, k)?; // warm-up, not counted
        }
        for run in 0..runs {
            for i in 0..kernels.len() {
                let ki = (i + run) % kernels.len();
                ram.fill(0, BUF, OLD)?;
                let (t, bytes) = time_it(|| sc.run(&mut ram, kernels[ki]));
                let bytes = bytes? as f64;
                let (cpu, wall) = &mut samples[si][ki];
                cpu.push(bytes / t.cpu.as_secs_f64().max(1e-9) / 1e9);
                wall.push(bytes / t.wall.as_secs_f64().max(1e-9) / 1e9);
            }
        }
    }
    let rates: Vec<Vec<Rates>> = samples
        .iter()
        .map(|per_kernel| {
            per_kernel
                .iter()
                .map(|(c, w)| {
                    let empty = "no samples";
                    Ok(Rates {
                        cpu: Summary::of(c).ok_or(empty)?,
                        wall: Summary::of(w).ok_or(empty)?,
                    })
                })
                .collect::<Result<Vec<_>, &str>>()
        })
        .collect::<Result<_, _>>()?;
    Ok(Measured {
        runs,
        kernels,
        rates,
    })
}

impl Measured {
    /// The CPU-time median of `k` in scenario `si`, if the CPU has `k`.
    fn median(&self, si: usize, k: ZeroKernel) -> Option<f64> {
        self.kernels
            .iter()
            .position(|&x| x == k)
            .map(|ki| self.rates[si][ki].cpu.median)
    }

    /// The fastest kernel in scenario `si`, and its median.
    fn best(&self, si: usize) -> Result<(ZeroKernel, f64), &'static str> {
        self.kernels
            .iter()
            .zip(&self.rates[si])
            .max_by(|a, b| a.1.cpu.median.total_cmp(&b.1.cpu.median))
            .map(|(&k, r)| (k, r.cpu.median))
            .ok_or("no kernel available")
    }

    fn findings(&self) -> Result<Findings, &'static str> {
        let baseline = if self.kernels.contains(&ZeroKernel::RepStosb) {
            ZeroKernel::RepStosb
        } else {
            ZeroKernel::WriteBytes
        };
        let (best2, best2_rate) = self.best(WALK)?;
        let (best256, best256_rate) = self.best(BIG)?;
        let auto2 = ZeroKernel::auto(CHUNK);
        Ok(Findings {
            baseline,
            best2,
            best2_rate,
            ratio2: self.median(WALK, baseline).map(|b| best2_rate / b),
            best256,
            ratio256: self
                .median(BIG, ZeroKernel::WriteBytes)
                .map(|b| best256_rate / b),
            auto2,
            auto256: ZeroKernel::auto(BUF),
            auto2_over_baseline: self
                .median(WALK, auto2)
                .zip(self.median(WALK, baseline))
                .map(|(a, b)| a / b),
        })
    }
}

fn print_json(quick: bool, m: &Measured, f: &Findings) {
    let mut per_kernel = Map::new();
    for (ki, k) in m.kernels.iter().enumerate() {
        let mut o = Map::new();
        for (si, sc) in Scenario::ALL.into_iter().enumerate() {
            o.insert(format!("{}_gbps", sc.key()), m.rates[si][ki].cpu.to_json());
            o.insert(
                format!("{}_gbps_wall", sc.key()),
                m.rates[si][ki].wall.to_json(),
            );
        }
        per_kernel.insert(k.name().into(), Value::Object(o));
    }
    let measured: Map<String, Value> = Scenario::ALL
        .into_iter()
        .map(|sc| (sc.key().to_string(), sc.describe().into()))
        .collect();
    let out = json!({
        "bench": "zero",
        "quick": quick,
        "runs": m.runs,
        "timing": "GB/s from the measuring thread's CPU time (medians); *_wall from wall-clock time",
        "measured": measured,
        "kernels": per_kernel,
        "baseline_2mib": f.baseline.name(),
        "best_kernel_2mib": f.best2.name(),
        "best_2mib_gbps": f.best2_rate,
        "best_over_rep_stosb_2mib": f.ratio2,
        "best_kernel_256mib": f.best256.name(),
        "best_over_memset_256mib": f.ratio256,
        "auto": {
            "threshold_bytes": NON_TEMPORAL_THRESHOLD,
            "2mib": f.auto2.name(),
            "256mib": f.auto256.name(),
            "auto_2mib_over_rep_stosb": f.auto2_over_baseline,
        },
    });
    println!("{out}");
}

fn print_table(quick: bool, m: &Measured, f: &Findings) {
    println!(
        "bench zero{}: {} runs, kernels round-robin per run; medians of GB/s from thread CPU time",
        if quick { " (quick: fewer runs)" } else { "" },
        m.runs
    );
    for sc in Scenario::ALL {
        println!("  {:<12} {}", sc.key(), sc.describe());
    }
    print!("\n{:<12}", "kernel");
    for sc in Scenario::ALL {
        print!(" {:>18}", format!("{} GB/s", sc.key()));
    }
    println!();
    for (ki, k) in m.kernels.iter().enumerate() {
        print!("{:<12}", k.name());
        for per_kernel in &m.rates {
            let s = per_kernel[ki].cpu;
            print!(" {:>18}", format!("{:.1} ±{:.1}", s.median, s.sd));
        }
        println!();
    }
    println!(
        "\nbest on 2 MiB chunks: {} = {:.2}× {}",
        f.best2,
        f.ratio2.unwrap_or(f64::NAN),
        f.baseline
    );
    println!(
        "best on 256 MiB: {} = {:.2}× write_bytes (memset)",
        f.best256,
        f.ratio256.unwrap_or(f64::NAN)
    );
    println!(
        "auto choice: {} for 2 MiB, {} for 256 MiB (non-temporal from {} KiB)",
        f.auto2,
        f.auto256,
        NON_TEMPORAL_THRESHOLD / 1024
    );
}
