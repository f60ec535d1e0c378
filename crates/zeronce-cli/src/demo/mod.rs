//! `zeronce demo`: process mode end to end, with the real background reporter
//! (`--mode vm`: the same story through the virtio-balloon driver and device, [`vm`]).
//!
//! A working set is written, freed, reported by the background worker after its delay
//! (the kernel discards the backing, RSS falls), then allocated again *zeroed*: the host
//! already zeroed it, so the allocator writes nothing. The same allocation on memory that
//! never left (reporting off) is timed beside it. Figures here are one run, for show;
//! `zeronce bench …` measures the claims with medians.
//!
//! Each step measures and returns what it saw ([`report`]); one renderer ([`out`]) shows
//! the reports as they come: lines of text, one JSON object, the plot.

mod args;
mod out;
mod process;
mod report;
mod steps;
mod vm;

pub use args::DemoArgs;
use args::DemoMode;
use out::Out;

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let plan = args.plan()?;
    let mut out = Out::new(args.json);
    let title = match args.mode {
        DemoMode::Process => {
            process::run(args, &plan, &mut out)?;
            "zeronce demo: resident memory"
        }
        DemoMode::Vm => {
            vm::run(args, &plan, &mut out)?;
            "zeronce demo --mode vm: memfd allocated"
        }
    };
    out.finish(args.plot.as_deref(), title)
}
