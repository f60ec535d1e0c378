//! `zeronce demo --mode vm`: the process demo's story through virtio-balloon. The guest
//! allocator's reporting engine hands free blocks to the balloon driver, which puts one
//! buffer per block on the reporting queue (rings in guest RAM); the device thread punches
//! holes in the shared memfd and answers `used_len` = buffer length ("now zero", bit 6).
//! Then the same with a device that does not offer bit 6: the allocator must zero.
//! `--topology vhost-user`: the same story with each device in a `zeronce serve` child
//! process, the driver reaching it as a vhost-user front-end.

use std::time::Duration;

use serde_json::json;
use zeronce::zeronce_balloon::Feature;
use zeronce::zeronce_mm::reporting::ReportingConfig;
use zeronce::zeronce_mm::PAGE_SIZE;
use zeronce::{DeviceHost, Order, VmMemory, VmStats};

use super::args::DemoTopology;
use zeronce_bench::served::ServedDevice;

use super::out::{self, Out};
use super::{
    alloc_zeroed_timed, mib, ms, realloc_zeroed, wait_for_reporter, write_working_set, DemoArgs,
    Plan, MIB,
};

/// Runs the VM-mode demo.
pub fn run(args: &DemoArgs, plan: &Plan) -> Result<(), Box<dyn std::error::Error>> {
    let order = Order::new(9)?;
    let blocks = plan.blocks;
    let backing = plan.backing;
    let reporting = plan.setup.config;
    // With vhost-user, one daemon per device: with the hints as asked, and without.
    let served = match args.topology {
        DemoTopology::Thread => None,
        DemoTopology::VhostUser => Some((
            ServedDevice::start("demo", plan.setup.zero_hints)?,
            ServedDevice::start("demo-plain", false)?,
        )),
    };
    let (host, plain_host, where_) = match &served {
        None => (
            DeviceHost::Thread,
            DeviceHost::Thread,
            "in a thread of this process".to_owned(),
        ),
        Some((d, p)) => (
            d.host(),
            p.host(),
            format!("in `zeronce serve` (pid {}) over vhost-user", d.pid()),
        ),
    };
    let vm = VmMemory::builder()
        .size(plan.size)
        .backing(backing)
        .reporting(reporting)
        .zero_hints(plan.setup.zero_hints)
        .device(host)
        .build()?;
    let (ring_gpa, ring_len) = vm.ring_area();
    let features: Vec<String> = Feature::ALL
        .iter()
        .filter(|f| vm.negotiated().contains(**f))
        .map(|f| format!("{f:?}"))
        .collect();
    let mut out = Out::new(args.json);
    out.say(
        &format!(
            "zeronce demo, VM mode: {} MiB of {} guest RAM, working set {} MiB in 2 MiB blocks; \
             a virtio-balloon device {where_}",
            args.size_mib,
            args.plan_backing_name(),
            args.working_set_mib,
        ),
        "mode",
        json!("vm"),
    );
    out.say(
        &format!(
            "   negotiated features: {}; reporting queue {}; rings at guest address {ring_gpa:#x} \
             ({} KiB)",
            features.join(", "),
            vm.reporting_queue_index(),
            ring_len >> 10
        ),
        "device",
        json!({ "features": features, "reporting_queue": vm.reporting_queue_index(),
                "ring_gpa": ring_gpa, "ring_bytes": ring_len }),
    );
    super::settings(&mut out, args, plan);
    let step = |out: &mut Out, n: &str, what: &str, key: &str, vm: &VmMemory| {
        let m = mib(vm.memfd_allocated_bytes());
        out.sample(vm.memfd_allocated_bytes());
        out.step(
            format!("{n} {what:<31} memfd allocated {m:>6} MiB"),
            json!({ "step": key, "memfd_allocated_mib": m }),
        );
    };
    step(&mut out, "0.", "start", "start", &vm);
    let written = write_working_set(&vm, order, blocks)?;
    let written_at = super::starts(&written);
    step(&mut out, "1.", "wrote the working set", "wrote", &vm);
    let freed_at = std::time::Instant::now();
    drop(written);
    out.mark("freed");
    step(&mut out, "2.", "freed it (not reported yet)", "freed", &vm);
    let settled = wait_for_reporter(
        &vm,
        freed_at,
        reporting.delay + Duration::from_secs(5),
        &mut out,
    );
    out.mark("reported");
    step(
        &mut out,
        "3.",
        "reported over the virtqueue",
        "reported",
        &vm,
    );
    out.explain(&format!(
        "({}; a pass runs {:.1} s after the first request since the last pass: the free, or \
         the one made at start-up; seen by polling every 0.1 s)",
        settled.describe(reporting.delay),
        reporting.delay.as_secs_f64()
    ));
    device(
        &mut out,
        Counted {
            key: "device",
            label: "device (steps 0-4)",
            working_set: plan.working_set,
            // `reported = a ∧ b` on merge (docs/ARCHITECTURE.md §3), as in Linux.
            beyond: "never-written free memory merged with a freed neighbour, and a merged \
                     block counts as reported only if both halves were, so it was reported \
                     again whole",
        },
        &vm.stats(),
        served.as_ref().map(|s| &s.0),
    );

    let why = if plan.setup.zero_hints {
        ""
    } else {
        "--no-zero-hints: the device makes no zero promise"
    };
    let (_, again) = realloc_zeroed(&vm, order, &written_at, why, &mut out)?;
    out::allocator(&mut out, &vm.stats().mm);
    drop(again);

    // The baseline: a device without DEVICE_INIT_REPORTED. It discards just the same, but
    // promises nothing, so every reported block is zeroed again on allocation.
    let plain = VmMemory::builder()
        .size(plan.working_set + 4 * MIB)
        .backing(backing)
        // Small on purpose (every block is the one just written): no watermark gate.
        .reporting(ReportingConfig {
            watermark_gate: false,
            ..reporting
        })
        .zero_hints(false)
        .fresh_is_zero(false)
        .device(plain_host)
        .build()?;
    drop(write_working_set(&plain, order, blocks)?);
    plain.flush(u64::MAX);
    let before = plain.stats().mm.bytes_zeroed;
    let (theirs, _blocks) = alloc_zeroed_timed(&plain, order, blocks)?;
    let zeroed = (plain.stats().mm.bytes_zeroed - before) >> 20;
    out.step(
        format!(
            "5. same with a device that makes no zero promise (bit 6 off), reported by a flush: \
             the allocator zeroed {zeroed} MiB again: alloc {:.2} ms, first touch {:.2} ms",
            ms(theirs.alloc),
            ms(theirs.touch)
        ),
        json!({ "step": "baseline_no_zero_promise", "allocator_zeroed_mib": zeroed,
                "alloc_ms": ms(theirs.alloc), "first_touch_ms": ms(theirs.touch) }),
    );
    device(
        &mut out,
        Counted {
            key: "baseline_device",
            label: "second device (step 5's own, bit 6 off)",
            working_set: plan.working_set,
            beyond: "the rest of this smaller guest's RAM was never written, but without a zero \
                     promise it counts as dirty, and the flush reports all free memory",
        },
        &plain.stats(),
        served.as_ref().map(|s| &s.1),
    );
    out.finish(
        args.plot.as_deref(),
        "zeronce demo --mode vm: memfd allocated",
    )
}

/// Which device [`device`] prints the counters of.
struct Counted {
    /// Its JSON key.
    key: &'static str,
    /// Its name in the text (the demo has two devices).
    label: &'static str,
    /// Bytes of the working set the demo freed for it to report.
    working_set: usize,
    /// Why the device may have been reported more than the working set.
    beyond: &'static str,
}

/// The device's counters (from the daemon's control socket when it is one) and the
/// driver's, labelled; and, when the device was reported more than the working set, by
/// how much and why.
fn device(out: &mut Out, c: Counted, s: &VmStats, served: Option<&ServedDevice>) {
    let d = match served {
        None => json!({
            "pages_reported": s.device.pages_reported, "bytes_discarded": s.device.bytes_discarded,
            "zero_promises": s.device.zero_promises, "failed_discards": s.device.discard_errors,
            "malformed_requests": s.device.malformed,
        }),
        Some(served) => {
            let m = served.metrics();
            json!({
                "pages_reported": m["pages_reported"], "bytes_discarded": m["bytes_discarded"],
                "zero_promises": m["zero_promises"], "failed_discards": m["discard_errors"],
                "malformed_requests": m["malformed"],
            })
        }
    };
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    let beyond = (n("pages_reported") * PAGE_SIZE).saturating_sub(c.working_set as u64);
    out.say(
        &format!(
            "   {}, since it started{}: {} pages reported, {} MiB discarded, {} blocks \
             promised zero, {} failed discards, {} malformed requests; driver: {} report calls, \
             answers {} blocks zero / {} not zero, {} failures",
            c.label,
            if served.is_some() {
                " (its control socket)"
            } else {
                ""
            },
            n("pages_reported"),
            n("bytes_discarded") >> 20,
            n("zero_promises"),
            n("failed_discards"),
            n("malformed_requests"),
            s.driver.reports,
            s.driver.zeroed,
            s.driver.not_zeroed,
            s.driver.failures
        ),
        c.key,
        json!({
            "device": d, "driver_report_calls": s.driver.reports,
            "driver_answered_zeroed": s.driver.zeroed,
            "driver_answered_not_zeroed": s.driver.not_zeroed,
            "driver_failures": s.driver.failures,
            "reported_beyond_working_set_bytes": beyond,
        }),
    );
    if beyond > 0 {
        out.explain(&format!(
            "({} MiB more than the {} MiB working set: {})",
            mib(beyond),
            mib(c.working_set as u64),
            c.beyond
        ));
    }
}
