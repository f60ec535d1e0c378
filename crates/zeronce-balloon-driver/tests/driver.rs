//! The guest driver against a scripted device: the reporting engine of a real
//! `zeronce_mm::MemoryManager` reports through `BalloonDriver` over split virtqueues in
//! guest memory, and the transport answers as told — truthfully, with a used id that is
//! not in flight, with a `used_len` beyond the buffer, never, or not at all (the kick
//! fails). Whatever the answer, no block is lost and the manager's invariants hold.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestMemoryMmap};
use zeronce_balloon::{Feature, FeatureOffer, FeatureSet, InterruptSignal};
use zeronce_balloon_driver::{BalloonDriver, DriverOptions, UsedSignal};
use zeronce_balloon_driver::{QueueAddrs, Transport, TransportError};
use zeronce_mm::reporting::{Reporter, ReportingConfig};
use zeronce_mm::{FreeState, MemoryManager, MmConfig, NoopZeroer, PageRange, Pfn};

const SIZE: u64 = 32 << 20;
const QUEUE_SIZE: u16 = 16;

/// How the scripted device answers a kick of the reporting queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Every buffer used with `used_len` = its length.
    FullLength,
    /// The first buffer used under an id that is not in flight.
    UnknownId,
    /// The first buffer used with a `used_len` one byte beyond its length.
    TooLong,
    /// Never uses anything.
    Silent,
    /// The kick itself fails (the device is gone).
    Gone,
}

/// What the scripted device saw.
#[derive(Debug, Default)]
struct Seen {
    acked: Option<FeatureSet>,
    resets: usize,
    kicks: Vec<u16>,
}

struct Scripted {
    mem: GuestMemoryMmap,
    irq: Arc<UsedSignal>,
    offer: FeatureSet,
    answer: Answer,
    queues: Vec<Queue>,
    seen: Arc<Mutex<Seen>>,
}

impl Transport for Scripted {
    fn device_features(&mut self) -> Result<FeatureSet, TransportError> {
        Ok(self.offer)
    }
    fn set_driver_features(&mut self, features: FeatureSet) -> Result<(), TransportError> {
        self.seen.lock().unwrap().acked = Some(features);
        Ok(())
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) -> Result<(), TransportError> {
        Ok(())
    }
    fn activate(&mut self, queues: &[QueueAddrs]) -> Result<(), TransportError> {
        self.queues = queues.iter().map(|a| a.device_queue().unwrap()).collect();
        Ok(())
    }
    fn notify(&mut self, index: u16) -> Result<(), TransportError> {
        self.seen.lock().unwrap().kicks.push(index);
        if self.answer == Answer::Gone {
            return Err(TransportError::DeviceGone);
        }
        let q = &mut self.queues[usize::from(index)];
        let chains: Vec<(u16, u32)> = q
            .iter(&self.mem)
            .unwrap()
            .map(|c| (c.head_index(), c.into_iter().map(|d| d.len()).sum()))
            .collect();
        if self.answer == Answer::Silent {
            return Ok(());
        }
        for (i, (head, len)) in chains.into_iter().enumerate() {
            let (id, used_len) = match (self.answer, i) {
                (Answer::UnknownId, 0) => (QUEUE_SIZE - 1, len),
                (Answer::TooLong, 0) => (head, len + 1),
                _ => (head, len),
            };
            q.add_used(&self.mem, id, used_len).unwrap();
        }
        self.irq.signal_used_queue(index);
        Ok(())
    }
    fn reset(&mut self) -> Result<(), TransportError> {
        self.seen.lock().unwrap().resets += 1;
        self.queues.clear();
        Ok(())
    }
}

struct Setup {
    mm: Arc<MemoryManager>,
    reporter: Reporter<MemoryManager, BalloonDriver<GuestMemoryMmap, Scripted>>,
    seen: Arc<Mutex<Seen>>,
}

/// A dirty manager over the RAM below the ring area, reporting through the driver.
fn setup(offer: FeatureSet, answer: Answer) -> Setup {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), SIZE as usize)]).unwrap();
    let ring_len = BalloonDriver::<GuestMemoryMmap, Scripted>::ring_area_bytes(QUEUE_SIZE);
    let ring_gpa = SIZE - ring_len;
    let irq = Arc::new(UsedSignal::new());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let transport = Scripted {
        mem: mem.clone(),
        irq: Arc::clone(&irq),
        offer,
        answer,
        queues: Vec::new(),
        seen: Arc::clone(&seen),
    };
    let opts = DriverOptions {
        queue_size: QUEUE_SIZE,
        timeout: Duration::from_millis(100),
        ..DriverOptions::default()
    };
    let driver =
        BalloonDriver::probe(mem, GuestAddress(ring_gpa), ring_len, transport, irq, opts).unwrap();
    let mut config = MmConfig::new(vec![PageRange::new(Pfn(0), ring_gpa / 4096)]);
    config.initial_state = FreeState::DIRTY;
    let mm = Arc::new(MemoryManager::new(config, Arc::new(NoopZeroer)).unwrap());
    let reporting = ReportingConfig {
        delay: Duration::from_secs(3600),
        watermark_gate: false,
        ..ReportingConfig::default()
    };
    let reporter = Reporter::start(Arc::clone(&mm), driver, reporting).unwrap();
    Setup { mm, reporter, seen }
}

fn offer(bit6: bool) -> FeatureSet {
    FeatureOffer::default()
        .features()
        .with(Feature::DeviceInitReported, bit6)
}

#[test]
fn full_length_means_zero_only_with_bit_6() {
    for bit6 in [true, false] {
        let s = setup(offer(bit6), Answer::FullLength);
        let free = s.mm.stats().free_pages_total();
        let pass = s.reporter.flush(u64::MAX);
        assert!(pass.error.is_none(), "{:?}", pass.error);
        assert!(pass.stats.calls >= 1 && pass.stats.blocks >= 1);
        let st = s.mm.stats();
        assert_eq!(st.reported_pages(), pass.stats.pages);
        let zero = if bit6 { pass.stats.pages } else { 0 };
        assert_eq!(st.known_zero_pages(), zero, "bit 6 = {bit6}");
        assert_eq!(st.free_pages_total(), free);
        let d = s.reporter.with_device(|d| d.stats());
        assert_eq!(d.zeroed + d.not_zeroed, pass.stats.blocks);
        assert_eq!(d.zeroed, if bit6 { pass.stats.blocks } else { 0 });
        let seen = s.seen.lock().unwrap();
        assert_eq!(
            seen.acked.unwrap().contains(Feature::DeviceInitReported),
            bit6
        );
        // Stats queue negotiated: reporting is queue 3, and only it was kicked.
        assert!(seen.kicks.iter().all(|&k| k == 3), "{:?}", seen.kicks);
        s.mm.check_invariants().unwrap();
    }
}

#[test]
fn every_bad_answer_fails_the_call_resets_the_device_and_loses_nothing() {
    for answer in [
        Answer::UnknownId,
        Answer::TooLong,
        Answer::Silent,
        Answer::Gone,
    ] {
        let s = setup(offer(true), answer);
        let free = s.mm.stats().free_pages_total();
        let pass = s.reporter.flush(u64::MAX);
        assert!(pass.error.is_some(), "{answer:?}");
        assert_eq!(pass.stats.errors, 1, "{answer:?}");
        let st = s.mm.stats();
        assert_eq!(st.free_pages_total(), free, "{answer:?}: no block lost");
        assert_eq!(st.reported_pages(), 0, "{answer:?}: back unreported");
        assert_eq!(st.isolated_pages, 0);
        s.mm.check_invariants().unwrap();
        assert!(s.reporter.with_device(|d| d.is_broken()));
        assert_eq!(
            s.seen.lock().unwrap().resets,
            2,
            "probe + after the failure"
        );

        // Broken: later calls fail at once, without touching the device.
        let kicks = s.seen.lock().unwrap().kicks.len();
        assert!(s.reporter.flush(u64::MAX).error.is_some());
        assert_eq!(s.seen.lock().unwrap().kicks.len(), kicks);
        assert_eq!(s.mm.stats().free_pages_total(), free);
        s.mm.check_invariants().unwrap();
    }
}

#[test]
fn capacity_is_the_queue_size() {
    let s = setup(offer(true), Answer::FullLength);
    assert_eq!(
        s.reporter.engine().config().capacity,
        usize::from(QUEUE_SIZE)
    );
}
