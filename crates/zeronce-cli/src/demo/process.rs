//! `zeronce demo` in process mode: this process's kernel is the host. The steps, in
//! order; each report is shown as it is made.

use super::args::{DemoArgs, DemoHost, Plan};
use super::out::Out;
use super::report::{
    Baseline, BaselineKind, HostCounts, Intro, IntroMode, ProcessCounters, Sample, Timing,
};
use super::steps::{self, DemoMemory};
use std::time::Duration;
use zeronce::ProcessMemory;

/// Runs the process-mode demo.
pub fn run(args: &DemoArgs, plan: &Plan, out: &mut Out) -> Result<(), Box<dyn std::error::Error>> {
    let pm = ProcessMemory::builder()
        .size(plan.size)
        .backing(plan.backing)
        .reporting(plan.setup)
        .build()?;
    out.show(&Intro {
        mode: IntroMode::Process,
        size_mib: args.size_mib,
        backing: args.plan_backing_name(),
        working_set_mib: args.working_set_mib,
    });
    out.show(&steps::settings(args, plan));
    let hold = (args.host == DemoHost::Hold).then(|| Duration::from_millis(args.hold_ms));
    let written = steps::round_trip(&pm, plan.blocks, plan.setup.config.delay, hold, out)?;
    let (ours, again) = steps::realloc_zeroed(&pm, &written, why_not_host(args))?;
    out.show(&ours);
    out.show(&pm.held());
    // The counters as of step 4, while its blocks are still allocated: later frees
    // would be reported again and counted with these.
    let counters = counters(&pm);
    out.show(&never_left(plan, ours.timing)?);
    drop(again);
    out.show(&counters);
    Ok(())
}

/// Why the host zeroed none of step 1's blocks, when the settings explain it.
fn why_not_host(args: &DemoArgs) -> &'static str {
    match args.host {
        _ if args.no_zero_hints => {
            "--no-zero-hints: the host never says a reported block reads zero"
        }
        DemoHost::Hold => "host policy hold: the blocks were still held, not yet discarded",
        DemoHost::Lazy => "host policy lazy: MADV_FREE may leave the old bytes in place",
        DemoHost::Immediate => "",
    }
}

/// Step 5, the baseline: the same working set on memory that never left (reporting off,
/// sized to the working set so every block is the dirty one just written).
fn never_left(plan: &Plan, ours: Timing) -> Result<Baseline, Box<dyn std::error::Error>> {
    let kept = ProcessMemory::builder()
        .size(plan.working_set)
        .backing(plan.backing)
        .build()?;
    let (zeroed_mib, timing, _blocks) = steps::baseline(&kept, plan.blocks, || {})?;
    let Sample { bytes, .. } = kept.held();
    Ok(Baseline {
        kind: BaselineKind::NeverLeft {
            resident_mib: bytes >> 20,
            ours,
        },
        zeroed_mib,
        timing,
    })
}

/// The allocator's, the reporting engine's and the host's counters now.
fn counters(pm: &ProcessMemory) -> ProcessCounters {
    let s = pm.stats();
    ProcessCounters {
        mm: s.mm,
        reporting: s.reporting,
        host: s.device.map(|d| HostCounts {
            discarded: d.discarded_bytes,
            answered_zero: d.zeroed_bytes,
            held: d.held_bytes,
            failed: d.errors,
        }),
    }
}
