//! A hostile guest at the device's edges rather than on its queues: config space out of
//! range or read-only, notifications before the driver is ready, unknown queues and
//! unoffered features (each a typed, counted error; the device keeps serving).

mod common;

use common::hostile::*;
use common::*;
use vm_memory::GuestAddress;
use zeronce_balloon::mock::{RecordingDiscarder, RecordingInterrupt};
use zeronce_balloon::spec::config_layout;
use zeronce_balloon::{
    BalloonDevice, BalloonOptions, Feature, FeatureSet, MalformedKind, NotReadyReason, QueueKind,
};
use Feature::*;

#[test]
fn config_access_out_of_range_or_read_only() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &ALL);
    let mut b = [0u8; 8];
    let e = rig.dev.read_config(12, &mut b).unwrap_err();
    assert_eq!(e.kind(), Some(MalformedKind::ConfigOutOfRange));
    let e = rig.dev.write_config(u64::MAX, &[1]).unwrap_err();
    assert_eq!(e.kind(), Some(MalformedKind::ConfigOutOfRange));
    let e = rig
        .dev
        .write_config(config_layout::NUM_PAGES, &[1, 2, 3, 4])
        .unwrap_err();
    assert_eq!(e.kind(), Some(MalformedKind::ConfigReadOnly));
    let m = rig.dev.metrics();
    assert_eq!(m.malformed_count(MalformedKind::ConfigOutOfRange), 2);
    assert_eq!(m.malformed_count(MalformedKind::ConfigReadOnly), 1);
    assert_eq!(rig.dev.config().num_pages(), 0);
    still_serves(&mut rig, QueueKind::Reporting);
}

#[test]
fn notifications_before_the_driver_is_ready() {
    let mem = mem_with_hole();
    let irq = std::sync::Arc::new(RecordingInterrupt::default());
    let mut dev = BalloonDevice::new(
        BalloonOptions::default(),
        RecordingDiscarder::default(),
        irq,
    );
    let reason = |r: Result<_, zeronce_balloon::BalloonError>| match r {
        Err(zeronce_balloon::BalloonError::NotReady { reason, .. }) => reason,
        other => panic!("expected NotReady, got {other:?}"),
    };
    assert_eq!(
        reason(dev.process_queue(&mem, 0)),
        NotReadyReason::FeaturesNotNegotiated
    );
    assert_eq!(
        reason(dev.activate(Vec::new()).map(|_| Default::default())),
        NotReadyReason::FeaturesNotNegotiated
    );
    dev.ack_features(features(&[])).unwrap();
    assert_eq!(
        reason(dev.process_queue(&mem, 0)),
        NotReadyReason::DriverNotOk
    );
    let dq: Vec<_> = (0..2)
        .map(|i| {
            zeronce_balloon::guest_ring::DriverQueue::new(&mem, GuestAddress(0x4000 * i), 16)
                .unwrap()
        })
        .collect();
    let mut queues: Vec<_> = dq.iter().map(|q| q.device_queue()).collect();
    virtio_queue::QueueT::set_ready(&mut queues[1], false);
    dev.activate(queues).unwrap();
    assert_eq!(
        reason(dev.process_queue(&mem, 1)),
        NotReadyReason::QueueNotReady
    );
    assert_eq!(dev.metrics().malformed_count(MalformedKind::NotReady), 4);
    assert!(
        dev.process_queue(&mem, 0).is_ok(),
        "the ready queue is served"
    );
}

#[test]
fn unknown_queues_and_unoffered_features() {
    let mem = mem_with_hole();
    let mut rig = Rig::mock(&mem, &[]);
    let e = rig.dev.process_queue(&mem, 2).unwrap_err();
    assert_eq!(e.kind(), Some(MalformedKind::UnknownQueue));
    let e = rig
        .dev
        .ack_features(FeatureSet::from_bits(FreePageHint.mask() | 1 << 40))
        .unwrap_err();
    assert_eq!(e.kind(), Some(MalformedKind::UnofferedFeature));
    assert!(
        rig.dev.is_active(),
        "a refused ack does not disturb the running device"
    );
    let m = rig.dev.metrics();
    assert_eq!(m.malformed_count(MalformedKind::UnknownQueue), 1);
    assert_eq!(m.malformed_count(MalformedKind::UnofferedFeature), 1);
    still_serves(&mut rig, QueueKind::Inflate);
}

#[test]
fn a_confidential_guest_is_not_offered_bits_6_and_7() {
    // docs/ARCHITECTURE.md §5: a confidential guest must not use bits 6 and 7. Offered
    // with zero promises off, a guest acking bit 7 would have to append a bitmap to every
    // inflate that could never have a bit set.
    let opts = BalloonOptions {
        zero_promises: false,
        ..BalloonOptions::default()
    };
    let irq = std::sync::Arc::new(RecordingInterrupt::default());
    let mut dev = BalloonDevice::new(opts, RecordingDiscarder::default(), irq);
    let offered = dev.device_features();
    assert!(!offered.contains(DeviceInitReported) && !offered.contains(DeviceInitOnInflate));
    assert!(
        offered.contains(PageReporting),
        "reporting itself is still offered"
    );
    assert!(matches!(
        dev.ack_features(features(&[PageReporting, DeviceInitOnInflate])),
        Err(zeronce_balloon::BalloonError::UnofferedFeature { .. })
    ));
    assert!(dev.ack_features(features(&[PageReporting])).is_ok());
}
