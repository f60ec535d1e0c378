//! `zeronce demo`: process mode end to end, with the real background reporter
//! (`--mode vm`: the same story through the virtio-balloon driver and device, [`vm`]).
//!
//! A working set is written, freed, reported by the background worker after its delay
//! (the kernel discards the backing, RSS falls), then allocated again *zeroed*: the host
//! already zeroed it, so the allocator writes nothing. The same allocation on memory that
//! never left (reporting off) is timed beside it. Figures here are one run, for show;
//! `zeronce bench …` measures the claims with medians.

mod args;
mod out;
mod vm;

use out::Out;
use serde_json::json;

pub use args::DemoArgs;
use args::{DemoHost, DemoMode, Plan};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use zeronce::zeronce_mm::{AllocRequest, Stats, Zeroing};
use zeronce::{Order, PageBlock, ProcessMemory, VmMemory};

/// What the demo steps need from process or VM memory.
trait DemoMemory {
    fn alloc_with(&self, order: Order, req: AllocRequest)
        -> Result<PageBlock, zeronce::BlockError>;
    fn mm_stats(&self) -> Stats;
    /// Bytes held in memory (resident pages, or the memfd's allocated blocks).
    fn resident(&self) -> u64;
    /// Scheduled reporting passes run so far.
    fn scheduled_passes(&self) -> u64;
}

impl DemoMemory for ProcessMemory {
    fn alloc_with(
        &self,
        order: Order,
        req: AllocRequest,
    ) -> Result<PageBlock, zeronce::BlockError> {
        ProcessMemory::alloc_with(self, order, req)
    }
    fn mm_stats(&self) -> Stats {
        self.stats().mm
    }
    fn resident(&self) -> u64 {
        self.resident_bytes()
    }
    fn scheduled_passes(&self) -> u64 {
        self.stats().reporting.map_or(0, |r| r.passes)
    }
}

impl DemoMemory for VmMemory {
    fn alloc_with(
        &self,
        order: Order,
        req: AllocRequest,
    ) -> Result<PageBlock, zeronce::BlockError> {
        VmMemory::alloc_with(self, order, req)
    }
    fn mm_stats(&self) -> Stats {
        self.stats().mm
    }
    fn resident(&self) -> u64 {
        self.memfd_allocated_bytes()
    }
    fn scheduled_passes(&self) -> u64 {
        self.stats().reporting.passes
    }
}

const MIB: usize = 1 << 20;

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let plan = args.plan()?;
    match args.mode {
        DemoMode::Process => run_process(args, &plan),
        DemoMode::Vm => vm::run(args, &plan),
    }
}

fn run_process(args: &DemoArgs, plan: &Plan) -> Result<(), Box<dyn std::error::Error>> {
    let order = Order::new(9)?; // 2 MiB blocks
    let blocks = plan.blocks;
    let delay = plan.setup.config.delay;
    let pm = ProcessMemory::builder()
        .size(plan.size)
        .backing(plan.backing)
        .reporting(plan.setup)
        .build()?;
    let mut out = Out::new(args.json);
    out.say(
        &format!(
            "zeronce demo, process mode: {} MiB of {} memory managed by zeronce, working set {} \
             MiB in 2 MiB blocks",
            args.size_mib,
            args.plan_backing_name(),
            args.working_set_mib
        ),
        "mode",
        json!("process"),
    );
    settings(&mut out, args, plan);

    let written = write_working_set(&pm, order, blocks)?;
    let written_at = starts(&written);
    out.sample(pm.resident_bytes());
    let resident = mib(pm.resident_bytes());
    out.step(
        format!("1. wrote the working set          resident {resident:>6} MiB"),
        json!({ "step": "wrote", "resident_mib": resident }),
    );
    let freed_at = Instant::now();
    drop(written);
    out.mark("freed");
    out.sample(pm.resident_bytes());
    let resident = mib(pm.resident_bytes());
    out.step(
        format!(
            "2. freed it                       resident {resident:>6} MiB (free in the allocator, \
             not yet given back: the next reporting pass is due within about {0:.1} s, as a pass \
             comes {0:.1} s after the first request since the last pass, which may predate this \
             free)",
            delay.as_secs_f64()
        ),
        json!({ "step": "freed", "resident_mib": resident }),
    );

    let settled = wait_for_reporter(&pm, freed_at, delay + Duration::from_secs(5), &mut out);
    out.mark("reported");
    let resident = mib(pm.resident_bytes());
    out.step(
        format!(
            "3. background reporter ran        resident {resident:>6} MiB, {} (a pass runs {:.1} s \
             after the first request since the last pass: the free, or the one made at start-up \
             as Linux does at registration; seen by polling every 0.1 s)",
            settled.describe(delay),
            delay.as_secs_f64()
        ),
        json!({ "step": "reported", "resident_mib": resident, "seconds_after_free": settled.after.as_secs_f64(), "passes": settled.passes }),
    );
    if let DemoHost::Hold = args.host {
        out.explain(&format!(
            "(host policy hold: reported memory stays resident for {:.1} s before it is \
             discarded, and reads zero only from then on)",
            args.hold_ms as f64 / 1e3
        ));
    }

    let why = match args.host {
        _ if args.no_zero_hints => {
            "--no-zero-hints: the host never says a reported block reads zero"
        }
        DemoHost::Hold => "host policy hold: the blocks were still held, not yet discarded",
        DemoHost::Lazy => "host policy lazy: MADV_FREE may leave the old bytes in place",
        DemoHost::Immediate => "",
    };
    let (ours, again) = realloc_zeroed(&pm, order, &written_at, why, &mut out)?;
    out.sample(pm.resident_bytes());
    // The counters as of step 4, while its blocks are still allocated: later frees
    // would be reported again and counted with these.
    let s = pm.stats();

    // The baseline: the same working set on memory that never left (reporting off, sized
    // to the working set so every block is the dirty one just written).
    let kept = ProcessMemory::builder()
        .size(plan.working_set)
        .backing(plan.backing)
        .build()?;
    drop(write_working_set(&kept, order, blocks)?);
    let before = kept.stats().mm.bytes_zeroed;
    let (theirs, _blocks) = alloc_zeroed_timed(&kept, order, blocks)?;
    let zeroed = (kept.stats().mm.bytes_zeroed - before) >> 20;
    out.step(
        format!(
            "5. same on memory that never left (reporting off): the allocator zeroed {zeroed} MiB: \
             alloc {:.2} ms, first touch {:.2} ms, resident {} MiB",
            ms(theirs.alloc),
            ms(theirs.touch),
            mib(kept.resident_bytes())
        ),
        json!({ "step": "baseline_never_left", "allocator_zeroed_mib": zeroed,
                "alloc_ms": ms(theirs.alloc), "first_touch_ms": ms(theirs.touch) }),
    );
    if ours.touch > theirs.touch {
        out.explain(
            "step 4's first touch costs more than step 5's: that memory was not resident (given \
             back to the host, or never touched), so touching it faults every page in and the \
             kernel zeroes it. Giving memory back \
             costs that refault, not the zeroing zeronce skipped; pre-zeroed huge pages (bench \
             prezero) and keeping reported memory for a while (--host hold) address it.",
        );
    }

    drop(again);
    if !args.json {
        println!("counters (zeronce's memory, as of step 4):");
    }
    out::allocator(&mut out, &s.mm);
    if let Some(r) = &s.reporting {
        out::reporting(&mut out, r);
    }
    if let Some(d) = s.device {
        out.say(
            &format!(
                "   host (this process's kernel): {} MiB discarded, {} MiB answered \"now zero\", \
                 {} MiB held now (reported, not yet discarded), {} failed discards",
                d.discarded_bytes >> 20,
                d.zeroed_bytes >> 20,
                d.held_bytes >> 20,
                d.errors
            ),
            "host",
            json!({ "discarded_bytes": d.discarded_bytes, "answered_zero_bytes": d.zeroed_bytes,
                    "held_bytes": d.held_bytes, "failed_discards": d.errors }),
        );
    }
    out.finish(args.plot.as_deref(), "zeronce demo: resident memory")
}

/// The settings line: what the reporter and the host do.
fn settings(out: &mut Out, args: &DemoArgs, plan: &Plan) {
    let c = plan.setup.config;
    let host = match args.mode {
        DemoMode::Vm => "the device discards at once".to_string(),
        DemoMode::Process => format!("{:?}", args.host).to_lowercase(),
    };
    out.say(
        &format!(
            "   reporting: free blocks of {} KiB and up, {} ms after a free, {} budget; host \
             policy {host}; zero hints {}",
            c.order.bytes() >> 10,
            c.delay.as_millis(),
            format!("{:?}", c.budget).to_lowercase(),
            if plan.setup.zero_hints { "on" } else { "off" }
        ),
        "settings",
        json!({
            "size_mib": args.size_mib, "working_set_mib": args.working_set_mib,
            "reporting_order": c.order.get(), "delay_ms": c.delay.as_millis() as u64,
            "budget": format!("{:?}", c.budget).to_lowercase(), "host_policy": host,
            "zero_hints": plan.setup.zero_hints,
        }),
    );
}

fn write_working_set(
    pm: &impl DemoMemory,
    order: Order,
    n: usize,
) -> Result<Vec<PageBlock>, zeronce::Error> {
    (0..n)
        .map(|_| {
            let mut b = pm.alloc_with(order, AllocRequest::DIRTY)?;
            b.as_mut_slice().fill(0xA5);
            Ok(b)
        })
        .collect()
}

/// The first page of each block (to tell later whether a block is one of these).
fn starts(blocks: &[PageBlock]) -> HashSet<u64> {
    blocks
        .iter()
        .map(|b| b.allocation().block.range().start.0)
        .collect()
}

/// Step 4 of both demos: allocates as many blocks as were `written` again zeroed, times
/// it, and says where each block came from: one of the blocks written in step 1 that the
/// host zeroed (reported, answered "zero"), memory never written since it was mapped
/// (reads zero), or zeroed by the allocator. `why_not_host` says why the host zeroed
/// none, if the settings explain it. The blocks are returned, still allocated.
fn realloc_zeroed(
    pm: &impl DemoMemory,
    order: Order,
    written: &HashSet<u64>,
    why_not_host: &str,
    out: &mut Out,
) -> Result<(Timing, Vec<PageBlock>), zeronce::Error> {
    let blocks = written.len();
    let (ours, again) = alloc_zeroed_timed(pm, order, blocks)?;
    let count = |f: &dyn Fn(&PageBlock) -> bool| again.iter().filter(|b| f(b)).count();
    let known_zero = |b: &PageBlock| b.allocation().zeroing == Zeroing::Skipped;
    let was_written = |b: &PageBlock| written.contains(&b.allocation().block.range().start.0);
    let skipped = count(&known_zero);
    let by_host = count(&|b| known_zero(b) && was_written(b) && b.allocation().prior.reported);
    let fresh = count(&|b| known_zero(b) && !was_written(b));
    let ahead = skipped - by_host - fresh;
    let zeroed = count(&|b| b.allocation().zeroing == Zeroing::Done);
    let mib = (blocks * order.bytes() as usize) >> 20;
    out.step(
        format!(
            "4. allocated {mib} MiB zeroed ({blocks} blocks): {by_host} of step 1's blocks known \
             zero from the host (reported, answered \"zero\"), {fresh} never written since \
             mapped (read zero){}, {zeroed} zeroed by the allocator: alloc {:.2} ms, first touch \
             {:.2} ms",
            if ahead > 0 {
                format!(", {ahead} zeroed ahead of time")
            } else {
                String::new()
            },
            ms(ours.alloc),
            ms(ours.touch)
        ),
        json!({ "step": "allocated_zeroed", "blocks": blocks, "blocks_known_zero": skipped,
                "blocks_known_zero_from_host": by_host,
                "blocks_never_written": fresh,
                "blocks_zeroed_ahead_of_time": ahead,
                "blocks_zeroed_by_allocator": zeroed,
                "alloc_ms": ms(ours.alloc), "first_touch_ms": ms(ours.touch) }),
    );
    if by_host == 0 && !why_not_host.is_empty() {
        out.explain(&format!("(none from the host: {why_not_host})"));
    }
    Ok((ours, again))
}

/// Wall time of allocating a working set zeroed, and of then touching every page.
struct Timing {
    alloc: Duration,
    touch: Duration,
}

fn alloc_zeroed_timed(
    pm: &impl DemoMemory,
    order: Order,
    n: usize,
) -> Result<(Timing, Vec<PageBlock>), zeronce::Error> {
    let start = Instant::now();
    let mut blocks = (0..n)
        .map(|_| pm.alloc_with(order, AllocRequest::ZEROED))
        .collect::<Result<Vec<_>, _>>()?;
    let alloc = start.elapsed();
    let start = Instant::now();
    blocks.iter_mut().for_each(|b| b.touch(0));
    Ok((
        Timing {
            alloc,
            touch: start.elapsed(),
        },
        blocks,
    ))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Polls every 100 ms until the reporter has reported what is free or `limit` passed
/// since `freed_at` (resident memory sampled for the plot); returns the time since
/// `freed_at`.
/// How long after the free the reporter had reported it, and in how many passes.
struct Settled {
    after: Duration,
    passes: u64,
}

impl Settled {
    /// "N s after the free, in N pass(es)", and why it took more than one.
    fn describe(&self, delay: Duration) -> String {
        let more = if self.passes > 1 {
            format!(
                "; a pass that spends its budget (Linux's: about 1/16 of each free list; the \
                 adaptive one's too when blocks were allocated during the delay before it) \
                 resumes {:.1} s later",
                delay.as_secs_f64()
            )
        } else {
            String::new()
        };
        format!(
            "{:.1} s after the free, in {} pass{}{more}",
            self.after.as_secs_f64(),
            self.passes,
            if self.passes == 1 { "" } else { "es" }
        )
    }
}

fn wait_for_reporter(
    pm: &impl DemoMemory,
    freed_at: Instant,
    limit: Duration,
    out: &mut Out,
) -> Settled {
    let passes_before = pm.scheduled_passes();
    while freed_at.elapsed() < limit {
        out.sample(pm.resident());
        let s = pm.mm_stats();
        let unreported_free: u64 = s.free_pages_total() - reported_pages(&s);
        if unreported_free < 512 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out.sample(pm.resident());
    Settled {
        after: freed_at.elapsed(),
        passes: pm.scheduled_passes().saturating_sub(passes_before),
    }
}

fn reported_pages(s: &zeronce::zeronce_mm::Stats) -> u64 {
    s.free_pages
        .iter()
        .map(|c| c.reported_dirty + c.reported_zero)
        .sum()
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}
