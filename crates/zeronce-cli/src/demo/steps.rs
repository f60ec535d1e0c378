//! The steps both demos take, on process or VM memory ([`DemoMemory`]): write the working
//! set, free it, wait for the reporter, allocate it again zeroed. Each measures and
//! returns what it saw (`report`); the demos show it.

use super::args::{DemoArgs, DemoMode, Plan};
use super::out::Out;
use super::report::{Gauge, Level, Phase, Realloc, Sample, Settings, Settled, Timing};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use zeronce::zeronce_mm::{AllocRequest, Stats, Zeroing};
use zeronce::{Order, PageBlock, ProcessMemory, VmMemory};

/// Bytes in a MiB.
pub const MIB: usize = 1 << 20;

/// The order of the demos' blocks: 9, 2 MiB.
pub const ORDER: Order = match Order::new(9) {
    Ok(order) => order,
    Err(_) => panic!("order 9 is a valid order"),
};

/// What the demo steps need from process or VM memory.
pub trait DemoMemory {
    /// Allocates one block.
    fn alloc_with(&self, order: Order, req: AllocRequest)
        -> Result<PageBlock, zeronce::BlockError>;
    /// The allocator's counters.
    fn mm_stats(&self) -> Stats;
    /// Bytes held in memory (resident pages, or the memfd's allocated blocks).
    fn held(&self) -> Sample;
    /// What [`DemoMemory::held`] counts.
    const GAUGE: Gauge;
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
    fn held(&self) -> Sample {
        Sample::now(self.resident_bytes())
    }
    const GAUGE: Gauge = Gauge::Resident;
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
    fn held(&self) -> Sample {
        Sample::now(self.memfd_allocated_bytes())
    }
    const GAUGE: Gauge = Gauge::Memfd;
    fn scheduled_passes(&self) -> u64 {
        self.stats().reporting.passes
    }
}

/// What the reporter and the host do.
pub fn settings(args: &DemoArgs, plan: &Plan) -> Settings {
    Settings {
        size_mib: args.size_mib,
        working_set_mib: args.working_set_mib,
        config: plan.setup.config,
        host: match args.mode {
            DemoMode::Vm => "the device discards at once".to_string(),
            DemoMode::Process => format!("{:?}", args.host).to_lowercase(),
        },
        zero_hints: plan.setup.zero_hints,
    }
}

/// Memory held now, after `phase`.
pub fn level<M: DemoMemory>(mem: &M, phase: Phase, delay: Duration) -> Level {
    Level {
        phase,
        held: mem.held(),
        gauge: M::GAUGE,
        delay,
    }
}

/// Steps 1 to 3, each shown as it is taken: writes the working set (`blocks` blocks),
/// frees it, and waits until the reporter has reported it or the delay and 5 s more have
/// passed. Returns the first page of each block written.
pub fn round_trip<M: DemoMemory>(
    mem: &M,
    blocks: usize,
    delay: Duration,
    hold: Option<Duration>,
    out: &mut Out,
) -> Result<HashSet<u64>, zeronce::Error> {
    let written = write_working_set(mem, blocks)?;
    let starts = starts(&written);
    out.show(&level(mem, Phase::Wrote, delay));
    let freed_at = Instant::now();
    drop(written);
    out.show(&level(mem, Phase::Freed, delay));
    let settled = wait_for_reporter(mem, freed_at, delay + Duration::from_secs(5));
    out.show(&level(mem, Phase::Reported { settled, hold }, delay));
    Ok(starts)
}

/// Allocates `n` blocks and fills them with old data; returns them, still allocated.
pub fn write_working_set(
    mem: &impl DemoMemory,
    n: usize,
) -> Result<Vec<PageBlock>, zeronce::Error> {
    (0..n)
        .map(|_| {
            let mut b = mem.alloc_with(ORDER, AllocRequest::DIRTY)?;
            b.as_mut_slice().fill(0xA5);
            Ok(b)
        })
        .collect()
}

/// The first page of each block (to tell later whether a block is one of these).
fn starts(blocks: &[PageBlock]) -> HashSet<u64> {
    blocks.iter().map(first_page).collect()
}

fn first_page(b: &PageBlock) -> u64 {
    b.allocation().block.range().start.0
}

/// Polls every 100 ms until the reporter has reported what is free or `limit` passed
/// since `freed_at`, reading the memory held each time (for the plot).
fn wait_for_reporter(mem: &impl DemoMemory, freed_at: Instant, limit: Duration) -> Settled {
    let passes_before = mem.scheduled_passes();
    let mut samples = Vec::new();
    while freed_at.elapsed() < limit {
        samples.push(mem.held());
        let s = mem.mm_stats();
        let unreported_free: u64 = s.free_pages_total() - reported_pages(&s);
        if unreported_free < 512 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    samples.push(mem.held());
    Settled {
        after: freed_at.elapsed(),
        passes: mem.scheduled_passes().saturating_sub(passes_before),
        samples,
    }
}

fn reported_pages(s: &Stats) -> u64 {
    s.free_pages
        .iter()
        .map(|c| c.reported_dirty + c.reported_zero)
        .sum()
}

/// Step 4: allocates as many blocks as were `written` again zeroed, times it, and counts
/// where each block came from: one of the blocks written in step 1 that the host zeroed
/// (reported, answered "zero"), memory never written since it was mapped (reads zero),
/// or zeroed by the allocator. `why_not_host` says why the host zeroed none, if the
/// settings explain it. The blocks are returned, still allocated.
pub fn realloc_zeroed(
    mem: &impl DemoMemory,
    written: &HashSet<u64>,
    why_not_host: &'static str,
) -> Result<(Realloc, Vec<PageBlock>), zeronce::Error> {
    let blocks = written.len();
    let (timing, again) = alloc_zeroed_timed(mem, blocks)?;
    let count = |f: &dyn Fn(&PageBlock) -> bool| again.iter().filter(|b| f(b)).count();
    let known_zero = |b: &PageBlock| b.allocation().zeroing == Zeroing::Skipped;
    let was_written = |b: &PageBlock| written.contains(&first_page(b));
    let skipped = count(&known_zero);
    let by_host = count(&|b| known_zero(b) && was_written(b) && b.allocation().prior.reported);
    let fresh = count(&|b| known_zero(b) && !was_written(b));
    let report = Realloc {
        blocks,
        mib: (blocks * ORDER.bytes() as usize) >> 20,
        known_zero: skipped,
        by_host,
        fresh,
        ahead: skipped - by_host - fresh,
        zeroed: count(&|b| b.allocation().zeroing == Zeroing::Done),
        timing,
        why_not_host,
    };
    Ok((report, again))
}

/// Step 5 on a baseline: writes and frees the working set (`blocks` blocks), runs
/// `settle`, then allocates it again zeroed. Returns the MiB the allocator zeroed, the
/// timing and the blocks, still allocated.
pub fn baseline(
    mem: &impl DemoMemory,
    blocks: usize,
    settle: impl FnOnce(),
) -> Result<(u64, Timing, Vec<PageBlock>), zeronce::Error> {
    drop(write_working_set(mem, blocks)?);
    settle();
    let before = mem.mm_stats().bytes_zeroed;
    let (timing, again) = alloc_zeroed_timed(mem, blocks)?;
    Ok(((mem.mm_stats().bytes_zeroed - before) >> 20, timing, again))
}

/// Allocates `n` blocks zeroed and then touches every page, timing both; returns the
/// blocks, still allocated.
fn alloc_zeroed_timed(
    mem: &impl DemoMemory,
    n: usize,
) -> Result<(Timing, Vec<PageBlock>), zeronce::Error> {
    let start = Instant::now();
    let mut blocks = (0..n)
        .map(|_| mem.alloc_with(ORDER, AllocRequest::ZEROED))
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
