//! Test rig: a device plus a driver-side split queue per negotiated queue, all in
//! vm-memory guest memory.
#![allow(dead_code)]

pub mod hostile;

use std::sync::Arc;
use std::time::Instant;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::{DriverBuf, DriverQueue};
use zeronce_balloon::mock::{RecordingDiscarder, RecordingInterrupt};
use zeronce_balloon::{
    BalloonDevice, BalloonOptions, Discarder, Feature, FeatureSet, QueueKind, QueueReport,
};

/// Where test data buffers start (queues live below).
pub const DATA: u64 = 0x10_0000;
pub const MIB: u64 = 1 << 20;

/// Every feature a guest may ack besides VERSION_1 (the hostile tests negotiate them all).
pub const ALL: [Feature; 4] = [
    Feature::StatsVq,
    Feature::PageReporting,
    Feature::DeviceInitReported,
    Feature::DeviceInitOnInflate,
];

/// Guest RAM: [0, 4 MiB) and [8 MiB, 12 MiB), a hole between.
pub fn mem_with_hole() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), 4 * MIB as usize),
        (GuestAddress(8 * MIB), 4 * MIB as usize),
    ])
    .unwrap()
}

pub fn features(fs: &[Feature]) -> FeatureSet {
    fs.iter().copied().chain([Feature::Version1]).collect()
}

pub struct Rig<'m, D> {
    pub mem: &'m GuestMemoryMmap,
    pub dev: BalloonDevice<D, Arc<RecordingInterrupt>>,
    pub irq: Arc<RecordingInterrupt>,
    pub queues: Vec<DriverQueue>,
    pub now: Instant,
}

impl<'m> Rig<'m, RecordingDiscarder> {
    /// A negotiated, activated device with a recording discarder.
    pub fn mock(mem: &'m GuestMemoryMmap, fs: &[Feature]) -> Self {
        Rig::new(
            mem,
            BalloonOptions::default(),
            RecordingDiscarder::zeroing(),
            fs,
            16,
        )
    }

    pub fn calls(&self) -> usize {
        self.dev.discarder().calls.len()
    }
}

impl<'m, D: Discarder<GuestMemoryMmap>> Rig<'m, D> {
    pub fn new(
        mem: &'m GuestMemoryMmap,
        options: BalloonOptions,
        d: D,
        fs: &[Feature],
        qsize: u16,
    ) -> Self {
        let irq = Arc::new(RecordingInterrupt::default());
        // The rig offers the proposal's zero-hint bits whenever the test negotiates them.
        let mut options = options;
        if fs.contains(&Feature::DeviceInitReported) || fs.contains(&Feature::DeviceInitOnInflate) {
            options.offer = options.offer.with_zero_hints();
        }
        let mut dev = BalloonDevice::new(options, d, Arc::clone(&irq));
        let neg = dev.ack_features(features(fs)).expect("features");
        let queues: Vec<DriverQueue> = (0..neg.layout().len())
            .map(|i| DriverQueue::new(mem, GuestAddress(0x4000 * i as u64), qsize).unwrap())
            .collect();
        dev.activate(queues.iter().map(DriverQueue::device_queue).collect())
            .expect("activate");
        Rig {
            mem,
            dev,
            irq,
            queues,
            now: Instant::now(),
        }
    }

    pub fn index(&self, kind: QueueKind) -> u16 {
        self.dev
            .layout()
            .unwrap()
            .index(kind)
            .expect("queue negotiated")
    }

    pub fn submit(&mut self, kind: QueueKind, bufs: &[DriverBuf]) -> u16 {
        let i = usize::from(self.index(kind));
        self.queues[i].add_chain(self.mem, bufs).unwrap()
    }

    pub fn notify(&mut self, kind: QueueKind) -> QueueReport {
        let i = self.index(kind);
        self.dev
            .process_queue_at(self.mem, i, self.now)
            .expect("notify")
    }

    pub fn used(&mut self, kind: QueueKind) -> Vec<(u32, u32)> {
        let i = usize::from(self.index(kind));
        self.queues[i].take_used(self.mem).unwrap()
    }

    /// Submits, notifies, and returns the single used length.
    pub fn roundtrip(&mut self, kind: QueueKind, bufs: &[DriverBuf]) -> u32 {
        let head = self.submit(kind, bufs);
        self.notify(kind);
        let used = self.used(kind);
        assert_eq!(used.len(), 1, "{kind:?}: {used:?}");
        assert_eq!(used[0].0, u32::from(head));
        used[0].1
    }

    pub fn write_pfns(&self, at: u64, pfns: &[u32]) {
        let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.mem.write_slice(&bytes, GuestAddress(at)).unwrap();
    }

    pub fn fill(&self, at: u64, len: usize, byte: u8) {
        self.mem
            .write_slice(&vec![byte; len], GuestAddress(at))
            .unwrap();
    }

    pub fn read(&self, at: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(at)).unwrap();
        v
    }

    /// An inflate request for `pfns` (PFN array at DATA, bitmap at DATA + 0x8000).
    pub fn inflate_bufs(&self, pfns: &[u32], bitmap: Option<u32>) -> Vec<DriverBuf> {
        self.write_pfns(DATA, pfns);
        let mut b = vec![DriverBuf::read(DATA, 4 * pfns.len() as u32)];
        if let Some(len) = bitmap {
            b.push(DriverBuf::write(DATA + 0x8000, len));
        }
        b
    }
}
