//! `zeronce demo --mode vm`: the process demo's story through virtio-balloon. The guest
//! allocator's reporting engine hands free blocks to the balloon driver, which puts one
//! buffer per block on the reporting queue (rings in guest RAM); the device thread punches
//! holes in the shared memfd and answers `used_len` = buffer length ("now zero", bit 6).
//! Then the same with a device that does not offer bit 6: the allocator must zero.
//! `--topology vhost-user`: the same story with each device in a `zeronce serve` child
//! process, the driver reaching it as a vhost-user front-end.

use super::args::{DemoArgs, DemoTopology, Plan};
use super::out::Out;
use super::report::{
    Allocator, Baseline, BaselineKind, DeviceCounters, DeviceCounts, DriverCounts, Intro,
    IntroMode, Negotiated, Phase,
};
use super::steps::{self, MIB};
use zeronce::zeronce_balloon::Feature;
use zeronce::zeronce_mm::reporting::ReportingConfig;
use zeronce::zeronce_mm::PAGE_SIZE;
use zeronce::{DeviceHost, VmMemory};
use zeronce_bench::served::ServedDevice;

/// With vhost-user, one daemon per device: with the hints as asked, and without.
struct Devices {
    served: Option<(ServedDevice, ServedDevice)>,
}

impl Devices {
    fn start(args: &DemoArgs, plan: &Plan) -> Result<Devices, Box<dyn std::error::Error>> {
        let served = match args.topology {
            DemoTopology::Thread => None,
            DemoTopology::VhostUser => Some((
                ServedDevice::start("demo", plan.setup.zero_hints)?,
                ServedDevice::start("demo-plain", false)?,
            )),
        };
        Ok(Devices { served })
    }

    /// How the guest and the baseline guest reach their devices, and where the first
    /// runs, in words.
    fn hosts(&self) -> (DeviceHost, DeviceHost, String) {
        match &self.served {
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
        }
    }

    fn guest(&self) -> Option<&ServedDevice> {
        self.served.as_ref().map(|s| &s.0)
    }

    fn baseline(&self) -> Option<&ServedDevice> {
        self.served.as_ref().map(|s| &s.1)
    }
}

/// Runs the VM-mode demo.
pub fn run(args: &DemoArgs, plan: &Plan, out: &mut Out) -> Result<(), Box<dyn std::error::Error>> {
    let devices = Devices::start(args, plan)?;
    let (host, plain_host, device_at) = devices.hosts();
    let delay = plan.setup.config.delay;
    let vm = VmMemory::builder()
        .size(plan.size)
        .backing(plan.backing)
        .reporting(plan.setup.config)
        .zero_hints(plan.setup.zero_hints)
        .device(host)
        .build()?;
    out.show(&Intro {
        mode: IntroMode::Vm { device_at },
        size_mib: args.size_mib,
        backing: args.plan_backing_name(),
        working_set_mib: args.working_set_mib,
    });
    out.show(&negotiated(&vm));
    out.show(&steps::settings(args, plan));
    out.show(&steps::level(&vm, Phase::Start, delay));
    let written = steps::round_trip(&vm, plan.blocks, delay, None, out)?;
    out.show(&device_counters(GUEST, plan, &vm, devices.guest()));
    let why = if plan.setup.zero_hints {
        ""
    } else {
        "--no-zero-hints: the device makes no zero promise"
    };
    let (ours, again) = steps::realloc_zeroed(&vm, &written, why)?;
    out.show(&ours);
    out.show(&Allocator(vm.stats().mm));
    drop(again);

    let plain = plain_guest(plan, plain_host)?;
    let (zeroed_mib, timing, _blocks) = steps::baseline(&plain, plan.blocks, || {
        plain.flush(u64::MAX);
    })?;
    out.show(&Baseline {
        kind: BaselineKind::NoZeroPromise,
        zeroed_mib,
        timing,
    });
    out.show(&device_counters(PLAIN, plan, &plain, devices.baseline()));
    Ok(())
}

/// The baseline's guest: its device lacks DEVICE_INIT_REPORTED. It discards just the
/// same, but promises nothing, so every reported block is zeroed again on allocation.
fn plain_guest(plan: &Plan, host: DeviceHost) -> Result<VmMemory, Box<dyn std::error::Error>> {
    Ok(VmMemory::builder()
        .size(plan.working_set + 4 * MIB)
        .backing(plan.backing)
        // Small on purpose (every block is the one just written): no watermark gate.
        .reporting(ReportingConfig {
            watermark_gate: false,
            ..plan.setup.config
        })
        .zero_hints(false)
        .fresh_is_zero(false)
        .device(host)
        .build()?)
}

/// The guest's device, steps 0 to 4.
const GUEST: Counted = Counted {
    key: "device",
    label: "device (steps 0-4)",
    // `reported = a ∧ b` on merge (docs/ARCHITECTURE.md §3), as in Linux.
    beyond_why: "never-written free memory merged with a freed neighbour, and a merged block \
                 counts as reported only if both halves were, so it was reported again whole",
};

/// The baseline's device, step 5.
const PLAIN: Counted = Counted {
    key: "baseline_device",
    label: "second device (step 5's own, bit 6 off)",
    beyond_why: "the rest of this smaller guest's RAM was never written, but without a zero \
                 promise it counts as dirty, and the flush reports all free memory",
};

/// What the driver and the device agreed on.
fn negotiated(vm: &VmMemory) -> Negotiated {
    let (ring_gpa, ring_bytes) = vm.ring_area();
    Negotiated {
        features: Feature::ALL
            .iter()
            .filter(|f| vm.negotiated().contains(**f))
            .map(|f| format!("{f:?}"))
            .collect(),
        reporting_queue: vm.reporting_queue_index(),
        ring_gpa,
        ring_bytes,
    }
}

/// Which device [`device_counters`] reads.
struct Counted {
    key: &'static str,
    label: &'static str,
    beyond_why: &'static str,
}

/// The device's counters (from the daemon's control socket when it is one) and the
/// driver's; and by how much the device was reported more than the working set.
fn device_counters(
    c: Counted,
    plan: &Plan,
    vm: &VmMemory,
    served: Option<&ServedDevice>,
) -> DeviceCounters {
    let s = vm.stats();
    let device = match served {
        None => DeviceCounts {
            pages_reported: Some(s.device.pages_reported),
            bytes_discarded: Some(s.device.bytes_discarded),
            zero_promises: Some(s.device.zero_promises),
            failed_discards: Some(s.device.discard_errors),
            malformed: Some(s.device.malformed),
        },
        Some(served) => {
            let m = served.metrics();
            DeviceCounts {
                pages_reported: m["pages_reported"].as_u64(),
                bytes_discarded: m["bytes_discarded"].as_u64(),
                zero_promises: m["zero_promises"].as_u64(),
                failed_discards: m["discard_errors"].as_u64(),
                malformed: m["malformed"].as_u64(),
            }
        }
    };
    let working_set = plan.working_set as u64;
    let reported = device.pages_reported.unwrap_or(0) * PAGE_SIZE;
    DeviceCounters {
        key: c.key,
        label: c.label,
        served: served.is_some(),
        beyond: reported.saturating_sub(working_set),
        device,
        driver: DriverCounts {
            reports: s.driver.reports,
            zeroed: s.driver.zeroed,
            not_zeroed: s.driver.not_zeroed,
            failures: s.driver.failures,
        },
        working_set,
        beyond_why: c.beyond_why,
    }
}
