//! `PAGE_POISON` (bit 4) and `poison_val`, in the orders real transports deliver them.
//!
//! Linux's driver writes `poison_val` in `virtballoon_probe`, after FEATURES_OK and
//! before DRIVER_OK: 0 with `init_on_free=1` (freed pages are zeroed, so a discarded page
//! reads as the poison), `PAGE_POISON` (0xaa per byte) with `page_poison=1`. A vhost-user
//! front-end that sends the features only when the device starts (QEMU, crosvm: at
//! DRIVER_OK) delivers the poison *before* the features; so the device keeps the config
//! space across a feature acknowledgement and across a stop, and only a device reset
//! clears it.

mod common;

use std::sync::Arc;

use common::*;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::{DriverBuf, DriverQueue};
use zeronce_balloon::mock::{RecordingDiscarder, RecordingInterrupt};
use zeronce_balloon::spec::config_layout::POISON_VAL;
use zeronce_balloon::{BalloonDevice, BalloonOptions, Feature, FeatureOffer, QueueKind};

type Dev = BalloonDevice<RecordingDiscarder, Arc<RecordingInterrupt>>;

const REPORTED: u64 = 8 * MIB;

fn device() -> Dev {
    let options = BalloonOptions {
        offer: FeatureOffer::default().with_zero_hints(),
        ..BalloonOptions::default()
    };
    BalloonDevice::new(
        options,
        RecordingDiscarder::zeroing(),
        Arc::new(RecordingInterrupt::default()),
    )
}

fn poison(dev: &mut Dev, val: u32) {
    dev.write_config(POISON_VAL, &val.to_le_bytes()).unwrap();
}

/// Activates with fresh rings; returns them.
fn activate(dev: &mut Dev, mem: &GuestMemoryMmap) -> Vec<DriverQueue> {
    let n = dev.layout().expect("negotiated").len();
    let queues: Vec<DriverQueue> = (0..n)
        .map(|i| DriverQueue::new(mem, GuestAddress(0x4000 * i as u64), 16).unwrap())
        .collect();
    dev.activate(queues.iter().map(DriverQueue::device_queue).collect())
        .unwrap();
    queues
}

/// One 2 MiB report; its `used_len`.
fn report(dev: &mut Dev, mem: &GuestMemoryMmap, queues: &mut [DriverQueue]) -> u32 {
    let i = dev.layout().unwrap().index(QueueKind::Reporting).unwrap();
    let q = &mut queues[usize::from(i)];
    q.add_chain(mem, &[DriverBuf::write(REPORTED, 2 << 20)])
        .unwrap();
    dev.process_queue(mem, i).unwrap();
    let used = q.take_used(mem).unwrap();
    assert_eq!(used.len(), 1, "{used:?}");
    used[0].1
}

const HARDENED: [Feature; 4] = [
    Feature::PagePoison,
    Feature::PageReporting,
    Feature::DeviceInitReported,
    Feature::Version1,
];

#[test]
fn page_poison_is_offered_by_default_and_poison_val_is_in_the_config_space() {
    let mut dev = device();
    assert!(dev.device_features().contains(Feature::PagePoison));
    dev.ack_features(HARDENED.into_iter().collect()).unwrap();
    poison(&mut dev, 0xaaaa_aaaa);
    let mut b = [0u8; 4];
    dev.read_config(POISON_VAL, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 0xaaaa_aaaa);
}

#[test]
fn init_on_free_poison_zero_reports_are_discarded_and_promised_zero() {
    let mem = mem_with_hole();
    let mut dev = device();
    dev.ack_features(HARDENED.into_iter().collect()).unwrap();
    poison(&mut dev, 0);
    let mut queues = activate(&mut dev, &mem);
    assert_eq!(report(&mut dev, &mem, &mut queues), 2 << 20, "bit 6 holds");
    assert_eq!(dev.discarder().calls.len(), 1, "discarded");
    assert_eq!(dev.metrics().reports_skipped_poison.get(), 0);
}

#[test]
fn a_poison_written_before_the_features_survives_them() {
    // QEMU / crosvm order: the guest's config write reaches the back-end first, then
    // SET_FEATURES when the device starts.
    let mem = mem_with_hole();
    let mut dev = device();
    poison(&mut dev, 0xaaaa_aaaa);
    dev.ack_features(HARDENED.into_iter().collect()).unwrap();
    assert_eq!(dev.config().poison_val(), 0xaaaa_aaaa);
    let mut queues = activate(&mut dev, &mem);
    assert_eq!(
        report(&mut dev, &mem, &mut queues),
        0,
        "acknowledged, no promise"
    );
    assert!(
        dev.discarder().calls.is_empty(),
        "a discard would erase the poison"
    );
    assert_eq!(dev.metrics().reports_skipped_poison.get(), 1);
}

#[test]
fn a_stop_keeps_features_and_poison_and_a_reset_clears_them() {
    let mem = mem_with_hole();
    let mut dev = device();
    let neg = dev.ack_features(HARDENED.into_iter().collect()).unwrap();
    poison(&mut dev, 0xaaaa_aaaa);
    activate(&mut dev, &mem);
    dev.stop();
    assert!(!dev.is_active());
    assert_eq!(
        dev.negotiated(),
        Some(neg),
        "restartable without SET_FEATURES"
    );
    assert_eq!(dev.config().poison_val(), 0xaaaa_aaaa);
    let mut queues = activate(&mut dev, &mem);
    assert_eq!(report(&mut dev, &mem, &mut queues), 0);
    assert!(
        dev.discarder().calls.is_empty(),
        "still poisoned after restart"
    );
    dev.reset();
    assert_eq!(dev.negotiated(), None);
    assert_eq!(dev.config().poison_val(), 0, "a device reset clears it");
}
