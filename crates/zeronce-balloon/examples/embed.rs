//! How a rust-vmm VMM embeds the balloon device: guest memory from vm-memory, queues
//! from virtio-queue, an interrupt callback, and the four calls a transport makes
//! (features, activate, notify, set target). Here a driver-side queue in the same guest
//! memory plays the guest, reporting one 2 MiB free block.
//!
//! `cargo run -p zeronce-balloon --example embed`

use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::{DriverBuf, DriverQueue};
use zeronce_balloon::{
    BalloonDevice, BalloonOptions, Feature, FeatureOffer, FeatureSet, InterruptSignal,
    MmapDiscarder, QueueKind,
};

/// The VMM's interrupt path (an irqfd write, an MSI-X vector, ...).
#[derive(Default)]
struct Irq(AtomicU64);

impl InterruptSignal for Irq {
    fn signal_used_queue(&self, queue: u16) {
        self.0.fetch_add(1, Ordering::Relaxed);
        println!("irq: used buffers on queue {queue}");
    }
    fn signal_config_change(&self) {
        println!("irq: config changed");
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const MIB: u64 = 1 << 20;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)])?;

    // 1. The device, with the real discarder (backing derived from each region).
    let mut dev = BalloonDevice::new(
        BalloonOptions {
            // This guest speaks the zero-hint proposal (bits 6/7): offer it knowingly.
            offer: FeatureOffer::default().with_zero_hints(),
            ..BalloonOptions::default()
        },
        MmapDiscarder::new(),
        Irq::default(),
    );

    // 2. Transport: the guest acks features; queue indices follow the negotiated set.
    let acked: FeatureSet = [
        Feature::Version1,
        Feature::PageReporting,
        Feature::DeviceInitReported,
    ]
    .into_iter()
    .collect();
    let layout = dev.ack_features(acked)?.layout();
    let reporting = layout.index(QueueKind::Reporting).expect("negotiated");
    println!(
        "queues: {:?} (reporting at index {reporting})",
        layout.kinds()
    );

    // 3. DRIVER_OK: hand over one virtio_queue::Queue per index (here: rings the guest
    //    side below laid out in guest memory).
    let mut guest: Vec<DriverQueue> = (0..layout.len() as u64)
        .map(|i| DriverQueue::new(&mem, GuestAddress(0x4000 * i), 64))
        .collect::<Result<_, _>>()?;
    dev.activate(guest.iter().map(DriverQueue::device_queue).collect())?;

    // The guest reports a free 2 MiB block at 16 MiB...
    mem.write_slice(&vec![0xaa; 2 << 20], GuestAddress(16 * MIB))?;
    guest[usize::from(reporting)].add_chain(&mem, &[DriverBuf::write(16 * MIB, 2 << 20)])?;

    // 4. ...and notifies: the VMM's ioeventfd handler calls process_queue.
    let report = dev.process_queue(&mem, reporting)?;
    let used = guest[usize::from(reporting)].take_used(&mem)?;
    println!(
        "device used {:?}; used_len {} = block is now zero",
        report.used, used[0].1
    );

    // The host changes its target; the driver is notified through the callback.
    dev.set_num_pages(1024);
    let m = dev.metrics();
    println!(
        "metrics: {} pages reported, {} bytes discarded, {} zero promises",
        m.pages_reported.get(),
        m.bytes_discarded.get(),
        m.zero_promises.get()
    );
    Ok(())
}
