//! Free page hinting through real split rings: a run (command id, blocks, STOP, DONE),
//! blocks outside a run, and the hostile-guest refusals on free_page_vq.

mod common;

use common::hostile::{refused, still_serves, HOLE};
use common::*;
use vm_memory::{Bytes, GuestAddress};
use zeronce_balloon::guest_ring::DriverBuf;
use zeronce_balloon::mock::RecordingDiscarder;
use zeronce_balloon::spec::{CMD_ID_DONE, CMD_ID_STOP};
use zeronce_balloon::{BalloonOptions, Feature, FeatureOffer, HintState, MalformedKind, QueueKind};

const Q: QueueKind = QueueKind::FreePageHint;
/// Where the driver keeps its command id buffer.
const CMD: u64 = DATA + 0x100;

fn hinting() -> BalloonOptions {
    BalloonOptions {
        offer: FeatureOffer {
            free_page_hint: true,
            ..FeatureOffer::default()
        },
        ..BalloonOptions::default()
    }
}

fn rig<'m>(mem: &'m vm_memory::GuestMemoryMmap, fs: &[Feature]) -> Rig<'m, RecordingDiscarder> {
    Rig::new(mem, hinting(), RecordingDiscarder::zeroing(), fs, 16)
}

/// The driver sends command id `id` (Linux's `send_cmd_id_start` / `send_cmd_id_stop`).
fn send_id(rig: &mut Rig<'_, RecordingDiscarder>, id: u32) -> u32 {
    rig.mem.write_obj(id.to_le(), GuestAddress(CMD)).unwrap();
    rig.roundtrip(Q, &[DriverBuf::read(CMD, 4)])
}

/// A rig with a run started and acknowledged by the driver.
fn running(mem: &vm_memory::GuestMemoryMmap) -> Rig<'_, RecordingDiscarder> {
    let mut rig = rig(mem, &[Feature::StatsVq, Feature::FreePageHint]);
    let id = rig.dev.start_hint_run().expect("negotiated");
    assert_eq!(send_id(&mut rig, id), 0);
    rig
}

#[test]
fn a_run_discards_each_block_then_sets_done_at_the_drivers_stop() {
    let mem = mem_with_hole();
    let mut rig = rig(
        &mem,
        &[
            Feature::StatsVq,
            Feature::FreePageHint,
            Feature::PageReporting,
        ],
    );
    assert_eq!(rig.index(Q), 3, "after stats, before reporting");
    assert_eq!(rig.dev.hint_status().state, HintState::Idle);
    let id = rig.dev.start_hint_run().unwrap();
    assert!(id >= 2);
    assert_eq!(rig.dev.config().free_page_hint_cmd_id(), id);
    assert_eq!(rig.irq.config_changes(), 1, "the driver is told");
    assert_eq!(rig.dev.hint_status().state, HintState::Running);
    assert_eq!(send_id(&mut rig, id), 0);
    assert!(rig.dev.hint_status().acknowledged);
    // Linux 6.1: one writable 4 MiB block per chain; here 2 MiB and 1 MiB blocks.
    rig.fill(8 * MIB, 0x1000, 0xaa);
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 2 << 20)]), 0);
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(10 * MIB, 1 << 20)]), 0);
    let calls = &rig.dev.discarder().calls;
    assert_eq!(
        calls.iter().map(|c| (c.gpa.0, c.len)).collect::<Vec<_>>(),
        vec![(8 * MIB, 2 << 20), (10 * MIB, 1 << 20)]
    );
    assert!(rig.read(8 * MIB, 0x1000).iter().all(|&b| b == 0));
    let s = rig.dev.hint_status();
    assert_eq!((s.pages_hinted, s.bytes_discarded), (768, 3 << 20));
    assert_eq!(rig.dev.metrics().pages_hinted.get(), 768);
    assert_eq!(send_id(&mut rig, CMD_ID_STOP), 0);
    assert_eq!(rig.dev.config().free_page_hint_cmd_id(), CMD_ID_DONE);
    assert_eq!(rig.irq.config_changes(), 2, "DONE is signalled");
    assert_eq!(rig.dev.hint_status().state, HintState::Done);
    // A block after DONE (the driver frees its blocks now) is not discarded.
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    assert_eq!(rig.calls(), 2);
    assert_eq!(rig.dev.metrics().hints_stale.get(), 1);
    let next = rig.dev.start_hint_run().unwrap();
    assert_ne!(next, id, "a new run, a new id");
    assert_eq!(rig.dev.hint_status().pages_hinted, 0, "figures are per run");
}

#[test]
fn blocks_before_the_drivers_id_or_of_a_superseded_run_are_not_discarded() {
    let mem = mem_with_hole();
    let mut rig = rig(&mem, &[Feature::FreePageHint]);
    assert_eq!(rig.index(Q), 2, "without stats");
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    let first = rig.dev.start_hint_run().unwrap();
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    assert_eq!(rig.calls(), 0, "no run, or the driver has not started it");
    assert_eq!(send_id(&mut rig, first), 0);
    let second = rig.dev.start_hint_run().unwrap();
    // The driver's STOP of the first sequence does not end the second run.
    assert_eq!(send_id(&mut rig, CMD_ID_STOP), 0);
    assert_eq!(rig.dev.config().free_page_hint_cmd_id(), second);
    assert_eq!(rig.dev.hint_status().state, HintState::Running);
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    assert_eq!(rig.calls(), 0);
    assert_eq!(rig.dev.metrics().hints_stale.get(), 3);
    assert_eq!(send_id(&mut rig, second), 0);
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    assert_eq!(rig.calls(), 1);
    rig.dev.reset();
    assert_eq!(rig.dev.hint_status().state, HintState::Idle);
    assert_eq!(rig.dev.config().free_page_hint_cmd_id(), CMD_ID_STOP);
}

#[test]
fn hinting_is_offered_only_when_asked_and_runs_only_when_negotiated() {
    let mem = mem_with_hole();
    let plain = Rig::mock(&mem, &[Feature::StatsVq]);
    assert!(!plain.dev.device_features().contains(Feature::FreePageHint));
    let mut rig = rig(&mem, &[Feature::StatsVq]);
    assert!(rig.dev.device_features().contains(Feature::FreePageHint));
    assert_eq!(rig.dev.start_hint_run(), None, "not negotiated");
    assert_eq!(rig.irq.config_changes(), 0);
}

#[test]
fn hostile_hint_chains_are_refused_and_the_queue_keeps_serving() {
    let mem = mem_with_hole();
    let mut rig = running(&mem);
    let id = rig.dev.config().free_page_hint_cmd_id();
    for bad in [CMD_ID_DONE, id + 1, u32::MAX] {
        rig.mem.write_obj(bad, GuestAddress(CMD)).unwrap();
        refused(
            &mut rig,
            Q,
            &[DriverBuf::read(CMD, 4)],
            MalformedKind::HintCommandId,
        );
    }
    let cases: Vec<(Vec<DriverBuf>, MalformedKind)> = vec![
        (
            vec![DriverBuf::read(CMD, 8)],
            MalformedKind::HintCommandLength,
        ),
        (
            vec![DriverBuf::read(CMD, 2), DriverBuf::read(CMD + 2, 2)],
            MalformedKind::HintCommandLength,
        ),
        (
            vec![DriverBuf::read(CMD, 4), DriverBuf::write(8 * MIB, 0x1000)],
            MalformedKind::WrongDirection,
        ),
        (
            vec![DriverBuf::write(8 * MIB, 0x1000), DriverBuf::read(CMD, 4)],
            MalformedKind::WrongDirection,
        ),
        (
            vec![DriverBuf::write(HOLE, 0x1000)],
            MalformedKind::OutOfGuestMemory,
        ),
        (
            vec![DriverBuf::write(4 * MIB - 0x1000, 0x2000)],
            MalformedKind::CrossesRegion,
        ),
        (
            vec![DriverBuf::write(8 * MIB + 0x10, 0x1000)],
            MalformedKind::Misaligned,
        ),
        (
            vec![DriverBuf::write(8 * MIB, 0)],
            MalformedKind::EmptyBuffer,
        ),
        (
            vec![DriverBuf::write(u64::MAX - 0xfff, 0x1000)],
            MalformedKind::AddressOverflow,
        ),
        (
            vec![DriverBuf::write(0, 0x4000)],
            MalformedKind::DiscardOverlap,
        ),
        (
            vec![DriverBuf::read(HOLE, 4)],
            MalformedKind::OutOfGuestMemory,
        ),
    ];
    for (bufs, kind) in &cases {
        refused(&mut rig, Q, bufs, *kind);
    }
    let long: Vec<DriverBuf> = (0..15)
        .map(|i| DriverBuf::write(8 * MIB + 0x1000 * i, 0x1000))
        .collect();
    // 15 descriptors are a legal chain of blocks on a 16-entry queue.
    assert_eq!(rig.roundtrip(Q, &long), 0);
    assert_eq!(
        rig.dev.hint_status().state,
        HintState::Running,
        "hostile ids end nothing"
    );
    still_serves(&mut rig, Q);
}

#[test]
fn a_timed_out_run_sets_stop_discards_nothing_more_and_the_drivers_stop_gets_done() {
    let mem = mem_with_hole();
    let mut rig = running(&mem);
    let id = rig.dev.hint_status().cmd_id;
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    assert_eq!(rig.calls(), 1);
    let changes = rig.irq.config_changes();
    assert!(!rig.dev.time_out_hint_run(id + 1), "not the current run");
    assert!(rig.dev.time_out_hint_run(id));
    assert_eq!(rig.dev.config().free_page_hint_cmd_id(), CMD_ID_STOP);
    assert_eq!(rig.irq.config_changes(), changes + 1, "STOP is signalled");
    let s = rig.dev.hint_status();
    assert_eq!((s.state, s.pages_hinted), (HintState::TimedOut, 1));
    assert!(!rig.dev.time_out_hint_run(id), "a run ends once");
    // A block the driver queued before it saw STOP is not discarded.
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    assert_eq!(rig.calls(), 1);
    // The driver ends its sequence: DONE, so it frees its hinted blocks; only once.
    assert_eq!(send_id(&mut rig, CMD_ID_STOP), 0);
    assert_eq!(rig.dev.config().free_page_hint_cmd_id(), CMD_ID_DONE);
    assert_eq!(rig.irq.config_changes(), changes + 2);
    assert_eq!(send_id(&mut rig, CMD_ID_STOP), 0);
    assert_eq!(rig.irq.config_changes(), changes + 2);
    assert_eq!(rig.dev.hint_status().state, HintState::TimedOut);
    assert_eq!(rig.dev.metrics().malformed_total(), 0);
    let next = rig.dev.start_hint_run().unwrap();
    assert_ne!(next, id, "a new run, a new id");
    assert_eq!(rig.dev.hint_status().state, HintState::Running);
}

#[test]
fn a_run_timed_out_before_the_driver_started_it_is_no_hostile_id() {
    let mem = mem_with_hole();
    let mut rig = rig(&mem, &[Feature::FreePageHint]);
    let id = rig.dev.start_hint_run().unwrap();
    assert!(rig.dev.time_out_hint_run(id));
    // The driver had read the id before the STOP: its id, blocks and STOP come late.
    assert_eq!(send_id(&mut rig, id), 0);
    assert_eq!(rig.roundtrip(Q, &[DriverBuf::write(8 * MIB, 0x1000)]), 0);
    assert_eq!(rig.calls(), 0, "nothing discarded after the timeout");
    assert_eq!(send_id(&mut rig, CMD_ID_STOP), 0);
    assert_eq!(rig.dev.config().free_page_hint_cmd_id(), CMD_ID_DONE);
    assert_eq!(
        rig.dev.metrics().malformed_total(),
        0,
        "a race, not an attack"
    );
    assert_eq!(rig.dev.metrics().hints_stale.get(), 1);
}
