//! `zeronce demo --mode vm`: the process demo's story through virtio-balloon. The guest
//! allocator's reporting engine hands free blocks to the balloon driver, which puts one
//! buffer per block on the reporting queue (rings in guest RAM); the device thread punches
//! holes in the shared memfd and answers `used_len` = buffer length ("now zero", bit 6).
//! Then the same with a device that does not offer bit 6: the allocator must zero.
//! `--topology vhost-user`: the same story with each device in a `zeronce serve` child
//! process, the driver reaching it as a vhost-user front-end.

use std::time::Duration;

use zeronce::zeronce_mm::reporting::ReportingConfig;
use zeronce::{DeviceHost, Order, VmMemory, VmStats};

use super::args::DemoTopology;
use crate::vhost::ServedDevice;

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
            "in a thread".to_owned(),
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
    println!(
        "zeronce demo --mode vm: {} MiB of {backing:?} guest RAM, working set {} MiB in 2 MiB \
         blocks; virtio-balloon device {where_}, features {:?}, reporting queue at index \
         {}, rings at {ring_gpa:#x} ({} KiB), delay {:?}",
        args.size_mib,
        args.working_set_mib,
        vm.negotiated(),
        vm.reporting_queue_index(),
        ring_len >> 10,
        reporting.delay
    );
    println!(
        "0. start                          memfd allocated {:>6} MiB",
        mib(vm.memfd_allocated_bytes())
    );
    let written = write_working_set(&vm, order, blocks)?;
    println!(
        "1. wrote the working set          memfd allocated {:>6} MiB",
        mib(vm.memfd_allocated_bytes())
    );
    drop(written);
    println!(
        "2. freed it                       memfd allocated {:>6} MiB (still held)",
        mib(vm.memfd_allocated_bytes())
    );
    let settled = wait_for_reporter(&vm, reporting.delay + Duration::from_secs(5));
    println!(
        "3. reported over the virtqueue    memfd allocated {:>6} MiB after {:.1} s",
        mib(vm.memfd_allocated_bytes()),
        settled.as_secs_f64()
    );
    print_device(&vm.stats(), served.as_ref().map(|s| &s.0));

    realloc_zeroed(&vm, order, blocks, "device-zeroed")?;
    let s = vm.stats();
    println!(
        "   allocator: {} MiB zeroed, {} MiB of zeroing skipped",
        s.mm.bytes_zeroed >> 20,
        s.mm.bytes_zeroing_skipped >> 20
    );

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
    println!(
        "5. same with a device without bit 6 (flushed): every block comes back not known \
         zero, the allocator zeroes {} MiB: alloc {:.2} ms, first touch {:.2} ms",
        (plain.stats().mm.bytes_zeroed - before) >> 20,
        ms(theirs.alloc),
        ms(theirs.touch)
    );
    print_device(&plain.stats(), served.as_ref().map(|s| &s.1));
    Ok(())
}

/// The device's counters (from the daemon's control socket when it is one) and the
/// driver's.
fn print_device(s: &VmStats, served: Option<&ServedDevice>) {
    let device = match served {
        None => format!(
            "{} pages reported, {} MiB discarded, {} zero promises, {} discard errors, {} \
             malformed",
            s.device.pages_reported,
            s.device.bytes_discarded >> 20,
            s.device.zero_promises,
            s.device.discard_errors,
            s.device.malformed
        ),
        Some(d) => {
            let m = d.metrics();
            format!(
                "{} pages reported, {} MiB discarded, {} zero promises, {} discard errors, {} \
                 malformed (its control socket)",
                m["pages_reported"],
                m["bytes_discarded"].as_u64().unwrap_or(0) >> 20,
                m["zero_promises"],
                m["discard_errors"],
                m["malformed"]
            )
        }
    };
    println!(
        "   device: {device}; driver: {} report calls, used_len verdicts {} zeroed / {} \
         not zeroed, {} failures",
        s.driver.reports, s.driver.zeroed, s.driver.not_zeroed, s.driver.failures
    );
}
