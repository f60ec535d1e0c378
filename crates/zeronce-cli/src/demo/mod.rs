//! `zeronce demo`: process mode end to end, with the real background reporter
//! (`--mode vm`: the same story through the virtio-balloon driver and device, [`vm`]).
//!
//! A working set is written, freed, reported by the background worker after its delay
//! (the kernel discards the backing, RSS falls), then allocated again *zeroed*: the host
//! already zeroed it, so the allocator writes nothing. The same allocation on memory that
//! never left (reporting off) is timed beside it. Figures here are one run, for show;
//! `zeronce bench …` measures the claims with medians.

mod args;
mod vm;

pub use args::DemoArgs;
use args::{DemoMode, Plan};
use std::time::{Duration, Instant};
use zeronce::zeronce_mm::{AllocRequest, Stats, Zeroing};
use zeronce::{Order, PageBlock, ProcessMemory, VmMemory};

/// What the demo steps need from process or VM memory.
trait DemoMemory {
    fn alloc_with(&self, order: Order, req: AllocRequest) -> Result<PageBlock, zeronce::Error>;
    fn mm_stats(&self) -> Stats;
}

impl DemoMemory for ProcessMemory {
    fn alloc_with(&self, order: Order, req: AllocRequest) -> Result<PageBlock, zeronce::Error> {
        ProcessMemory::alloc_with(self, order, req)
    }
    fn mm_stats(&self) -> Stats {
        self.stats().mm
    }
}

impl DemoMemory for VmMemory {
    fn alloc_with(&self, order: Order, req: AllocRequest) -> Result<PageBlock, zeronce::Error> {
        VmMemory::alloc_with(self, order, req)
    }
    fn mm_stats(&self) -> Stats {
        self.stats().mm
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
    println!(
        "zeronce demo: {} MiB of {:?} memory, working set {} MiB in 2 MiB blocks, \
         reporting order 9, delay {:?}",
        args.size_mib, args.backing, args.working_set_mib, delay
    );

    let written = write_working_set(&pm, order, blocks)?;
    println!(
        "1. wrote the working set          resident {:>6} MiB",
        mib(pm.resident_bytes())
    );
    drop(written);
    println!(
        "2. freed it                       resident {:>6} MiB (still held)",
        mib(pm.resident_bytes())
    );

    let settled = wait_for_reporter(&pm, delay + Duration::from_secs(5));
    println!(
        "3. background reporter ran        resident {:>6} MiB after {:.1} s",
        mib(pm.resident_bytes()),
        settled.as_secs_f64()
    );

    realloc_zeroed(&pm, order, blocks, "host-zeroed")?;

    // The baseline: the same working set on memory that never left (reporting off, sized
    // to the working set so every block is the dirty one just written).
    let resident = ProcessMemory::builder()
        .size(plan.working_set)
        .backing(plan.backing)
        .build()?;
    drop(write_working_set(&resident, order, blocks)?);
    let (theirs, _blocks) = alloc_zeroed_timed(&resident, order, blocks)?;
    println!(
        "5. same on memory that never left (reporting off): the allocator zeroes it: \
         alloc {:.2} ms, first touch {:.2} ms, resident {} MiB",
        ms(theirs.alloc),
        ms(theirs.touch),
        mib(resident.resident_bytes())
    );

    let s = pm.stats();
    println!(
        "stats: {} MiB zeroed by the allocator, {} MiB of zeroing skipped, {} zero-requests \
         served without zeroing",
        s.mm.bytes_zeroed >> 20,
        s.mm.bytes_zeroing_skipped >> 20,
        s.mm.zero_requests_skipped
    );
    if let Some(r) = s.reporting {
        println!("reporting: {r:?}");
    }
    if let Some(d) = s.device {
        println!("device: {d:?}");
    }
    Ok(())
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

/// Step 4 of both demos: allocates the working set again zeroed, times it, and says how
/// many blocks were known zero (zeroed by `zeroed_by`).
fn realloc_zeroed(
    pm: &impl DemoMemory,
    order: Order,
    blocks: usize,
    zeroed_by: &str,
) -> Result<(), zeronce::Error> {
    let (ours, again) = alloc_zeroed_timed(pm, order, blocks)?;
    let skipped = again
        .iter()
        .filter(|b| b.allocation().zeroing == Zeroing::Skipped)
        .count();
    println!(
        "4. allocated {} MiB zeroed: {skipped}/{blocks} blocks known zero ({zeroed_by}), \
         alloc {:.2} ms, first touch {:.2} ms",
        (blocks * order.bytes() as usize) >> 20,
        ms(ours.alloc),
        ms(ours.touch)
    );
    Ok(())
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

/// Polls every 100 ms until the reporter has reported what is free or `limit` passed;
/// returns how long it took.
fn wait_for_reporter(pm: &impl DemoMemory, limit: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        let s = pm.mm_stats();
        let unreported_free: u64 = s.free_pages_total() - reported_pages(&s);
        if unreported_free < 512 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
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
