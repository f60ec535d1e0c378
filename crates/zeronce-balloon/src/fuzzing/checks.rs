//! The invariants the harness checks outside the oracle: merged deflate prefaults,
//! indirect chains never served, discards inside one region and aligned to its backing,
//! and a device that still serves after reset; and queue activation, which the last uses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use zeronce_types::clock::deadline_after;

use super::{DATA, QUEUE_SIZE, REGIONS};
use crate::device::BalloonDevice;
use crate::features::{FeatureSet, QueueKind};
use crate::guest_ring::{DriverBuf, DriverQueue, DESC_F_INDIRECT, DESC_F_NEXT};
use crate::mock::{RecordingDiscarder, RecordingInterrupt};

/// The prefaults of one deflate request are merged runs: no page twice, and no two runs
/// that touch inside one region (a deflate of `n` PFNs is at most `n` calls, fewer when
/// they are contiguous or repeated).
pub(super) fn check_one_request_prefaults(calls: &[(GuestAddress, u64)]) {
    let mut runs: Vec<(u64, u64)> = calls.iter().map(|(g, l)| (g.0, g.0 + l)).collect();
    runs.sort_unstable();
    for w in runs.windows(2) {
        let ((_, end), (next, _)) = (w[0], w[1]);
        let region_start = REGIONS.iter().any(|r| r.0 == next);
        assert!(
            end < next || (end == next && region_start),
            "deflate prefaults not merged: {runs:x?}"
        );
    }
}

/// Whether the chain from `head` in the descriptor table at `table` holds a descriptor
/// flagged `VIRTQ_DESC_F_INDIRECT` (within the 64 descriptors a chain may have).
pub(super) fn chain_has_indirect(mem: &GuestMemoryMmap, table: GuestAddress, head: u16) -> bool {
    let mut i = head;
    for _ in 0..crate::spec::limits::MAX_CHAIN_DESCRIPTORS {
        let at = table.0 + 16 * u64::from(i);
        let flags: u16 = mem.read_obj(GuestAddress(at + 12)).unwrap_or(0);
        if flags & DESC_F_INDIRECT != 0 {
            return true;
        }
        i = mem.read_obj(GuestAddress(at + 14)).unwrap_or(u16::MAX);
        if flags & DESC_F_NEXT == 0 || i >= QUEUE_SIZE {
            return false;
        }
    }
    false
}

/// Negotiates `acked` and activates fresh queues; returns the driver side.
pub(super) fn activate(
    dev: &mut BalloonDevice<RecordingDiscarder, Arc<RecordingInterrupt>>,
    mem: &GuestMemoryMmap,
    acked: FeatureSet,
) -> (Vec<DriverQueue>, bool) {
    let Ok(neg) = dev.ack_features(acked) else {
        return (Vec::new(), false);
    };
    let queues: Vec<DriverQueue> = (0..neg.layout().len())
        .map(|i| DriverQueue::new(mem, GuestAddress(0x1000 * i as u64), QUEUE_SIZE).expect("rings"))
        .collect();
    let ok = dev
        .activate(queues.iter().map(DriverQueue::device_queue).collect())
        .is_ok();
    (queues, ok)
}

/// Every discard lies inside one region of guest RAM and respects its page size.
pub(super) fn check_discards(mem: &GuestMemoryMmap, d: &RecordingDiscarder) {
    for call in &d.calls {
        let ps = call.backing.page_size() as u64;
        assert!(
            call.len > 0 && call.gpa.0 % ps == 0 && call.len % ps == 0,
            "{call:?}"
        );
        let region = mem.find_region(call.gpa).expect("discard inside guest RAM");
        assert!(
            call.gpa.0 + call.len <= region.start_addr().0 + region.len(),
            "{call:?}"
        );
    }
}

/// After whatever happened, a reset device serves a well-formed report / inflate.
pub(super) fn check_still_serves(
    dev: &mut BalloonDevice<RecordingDiscarder, Arc<RecordingInterrupt>>,
    mem: &GuestMemoryMmap,
    acked: FeatureSet,
) {
    dev.reset();
    let (mut queues, ok) = activate(dev, mem, acked);
    assert!(ok, "device refused to activate after reset");
    let layout = dev.layout().expect("negotiated");
    let (kind, bufs) = match layout.index(QueueKind::Reporting) {
        Some(_) => (QueueKind::Reporting, vec![DriverBuf::write(DATA, 0x1000)]),
        None => {
            mem.write_obj(0x200u32, GuestAddress(DATA)).expect("pfn");
            let mut bufs = vec![DriverBuf::read(DATA, 4)];
            if dev.negotiated().is_some_and(|n| n.inflate_bitmap()) {
                bufs.push(DriverBuf::write(DATA + 0x100, 1));
            }
            (QueueKind::Inflate, bufs)
        }
    };
    let index = layout.index(kind).expect("queue");
    let head = queues[usize::from(index)]
        .add_chain(mem, &bufs)
        .expect("add");
    let held_before = dev.held_requests();
    let r = dev
        .process_queue_at(mem, index, Instant::now())
        .expect("served");
    assert_eq!(r.malformed, 0, "{kind:?} rejected a well-formed request");
    let _ = dev.tick(mem, deadline_after(Instant::now(), Duration::MAX));
    let used = queues[usize::from(index)]
        .take_used(mem)
        .expect("used ring");
    assert_eq!(
        used.len(),
        1,
        "request not completed (held before: {held_before})"
    );
    assert_eq!(used[0].0, u32::from(head));
}
