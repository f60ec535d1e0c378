//! VM mode end to end on real memory: the allocator reports through the virtio-balloon
//! driver over split virtqueues in the guest RAM's memfd; the device thread punches holes
//! and answers with `used_len`.

mod common;
use common::{order, reporting_config, MIB, NEVER};

use std::sync::Arc;
use std::time::Duration;

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use zeronce::zeronce_balloon::{
    Backing, BalloonDevice, BalloonOptions, DiscardError, DiscardOp, DiscardPolicy, Discarder,
    FeatureOffer, MmapDiscarder,
};
use zeronce::zeronce_balloon_driver::{DriverOptions, InProcessTransport, Transport};
use zeronce::zeronce_mem::{BackingKind, HugePageSize};
use zeronce::zeronce_mm::Zeroing;
use zeronce::{BuildError, DeviceHost, Order, PageBlock, VmBuilder, VmMemory};

const SIZE: usize = 64 << 20;
/// Blocks of 2 MiB written, freed and allocated again.
const BLOCKS: usize = 8;

fn order9() -> Order {
    order(9)
}

/// Reporting only when flushed (the delay is never reached), no watermark gate (64 MiB
/// is under Linux's low watermark + one batch).
fn builder() -> VmBuilder {
    VmMemory::builder()
        .size(SIZE)
        .reporting(reporting_config(NEVER))
}

fn write_working_set(vm: &VmMemory) -> Vec<PageBlock> {
    (0..BLOCKS)
        .map(|_| {
            let mut b = vm.alloc(order9()).unwrap();
            b.as_mut_slice().fill(0xA5);
            b
        })
        .collect()
}

/// Unreported free pages (freed blocks merge with reported buddies into unreported
/// blocks, so a report may cover more than the blocks just freed).
fn unreported_pages(vm: &VmMemory) -> u64 {
    vm.stats()
        .mm
        .free_pages
        .iter()
        .map(|c| c.unreported())
        .sum()
}

/// What [`write_free_flush`] saw.
struct Flushed {
    /// memfd bytes after the working set was written and freed.
    freed: u64,
    /// memfd bytes after the report.
    flushed: u64,
    /// Blocks and pages the report carried.
    blocks: u64,
    pages: u64,
}

/// Writes, frees and flushes the working set.
fn write_free_flush(vm: &VmMemory) -> Flushed {
    drop(write_working_set(vm));
    let freed = vm.memfd_allocated_bytes();
    let unreported = unreported_pages(vm);
    assert!(unreported >= BLOCKS as u64 * 512);
    let pass = vm.flush(u64::MAX);
    assert!(pass.error.is_none(), "{:?}", pass.error);
    assert_eq!(pass.stats.pages, unreported, "{pass:?}");
    assert_eq!(unreported_pages(vm), 0);
    Flushed {
        freed,
        flushed: vm.memfd_allocated_bytes(),
        blocks: pass.stats.blocks,
        pages: pass.stats.pages,
    }
}

/// Allocates the working set again zeroed; every block must come without zeroing.
fn realloc_zeroed_skipping(vm: &VmMemory) -> Vec<PageBlock> {
    let again: Vec<PageBlock> = (0..BLOCKS)
        .map(|_| vm.alloc_zeroed(order9()).unwrap())
        .collect();
    for b in &again {
        assert_eq!(b.allocation().zeroing, Zeroing::Skipped, "{}", b.block());
    }
    again
}

#[test]
fn reported_blocks_leave_the_memfd_and_come_back_known_zero() {
    let vm = builder().build().unwrap();
    assert!(vm
        .negotiated()
        .contains(zeronce::zeronce_balloon::Feature::DeviceInitReported));
    let (ring_gpa, ring_len) = vm.ring_area();
    assert_eq!(
        ring_gpa + ring_len,
        SIZE as u64,
        "rings at the top of guest RAM"
    );
    assert_eq!(
        vm.stats().mm.free_pages_total() * 4096,
        ring_gpa,
        "the ring area is not the allocator's"
    );
    let before = vm.memfd_allocated_bytes();
    assert!(before >= 4096, "the rings are written in the memfd");
    let f = write_free_flush(&vm);
    let (freed, flushed) = (f.freed, f.flushed);
    println!(
        "memfd allocated: {} KiB at start, {} KiB written+freed, {} KiB after the report",
        before >> 10,
        freed >> 10,
        flushed >> 10
    );
    assert!(
        freed >= before + BLOCKS as u64 * 2 * MIB,
        "the working set is in the memfd"
    );
    assert!(flushed <= before, "every reported block left the memfd");

    let s = vm.stats();
    assert_eq!(s.device.pages_reported, f.pages);
    assert_eq!(s.device.bytes_discarded, f.pages * 4096);
    assert_eq!(s.device.zero_promises, f.blocks, "one per block buffer");
    assert_eq!(s.driver.zeroed, f.blocks, "used_len == buffer length");
    assert_eq!(s.driver.not_zeroed, 0);
    assert_eq!(s.mm.known_zero_pages(), s.mm.free_pages_total());

    let again = realloc_zeroed_skipping(&vm);
    for b in &again {
        assert!(
            b.as_slice().iter().all(|&x| x == 0),
            "host-zeroed block reads zero"
        );
    }
    let s = vm.stats();
    assert_eq!(s.mm.zero_requests_skipped, BLOCKS as u64);
    assert_eq!(s.mm.bytes_zeroed, 0);
    drop(again);
    vm.manager().check_invariants().unwrap();
}

#[test]
fn verify_mode_confirms_every_zero_promise_and_skipped_zeroing() {
    let vm = builder().verify(true).build().unwrap();
    let f = write_free_flush(&vm);
    // Checking each promise reads the block: shmem read faults bring pages back.
    println!(
        "verify mode: memfd {} KiB after free, {} KiB after the report and its checks",
        f.freed >> 10,
        f.flushed >> 10
    );
    let _again = realloc_zeroed_skipping(&vm);
    let s = vm.stats();
    assert_eq!(s.mm.verify_failures, 0, "every promise read zero");
    assert_eq!(s.reporting.total.put_back_errors, 0);
    assert_eq!(s.mm.zero_requests_skipped, BLOCKS as u64);
    vm.manager().check_invariants().unwrap();
}

#[test]
fn without_bit_6_blocks_come_back_not_zero_and_are_zeroed_on_allocation() {
    let vm = builder().zero_hints(false).verify(true).build().unwrap();
    assert!(!vm
        .negotiated()
        .contains(zeronce::zeronce_balloon::Feature::DeviceInitReported));
    let before = vm.memfd_allocated_bytes();
    let f = write_free_flush(&vm);
    assert!(f.flushed <= before, "the device still discards");
    let s = vm.stats();
    assert_eq!(s.device.zero_promises, 0);
    assert_eq!(s.driver.zeroed, 0);
    assert_eq!(s.driver.not_zeroed, f.blocks);

    // Everything, zeroed: fresh memory is known zero (skipped), the reported pages are
    // not (zeroed by the allocator), and every block reads zero.
    let all: Vec<PageBlock> = std::iter::from_fn(|| vm.alloc_zeroed(order9()).ok()).collect();
    let zeroed = all
        .iter()
        .filter(|b| b.allocation().zeroing == Zeroing::Done)
        .count() as u64;
    assert_eq!(
        zeroed * 512,
        f.pages,
        "exactly the reported pages are zeroed"
    );
    assert!(all.iter().all(|b| b.as_slice().iter().all(|&x| x == 0)));
    assert_eq!(vm.stats().mm.bytes_zeroed, f.pages * 4096);
    drop(all);
    vm.manager().check_invariants().unwrap();
}

#[test]
fn reporting_queue_index_counts_only_negotiated_queues() {
    for (stats, index) in [(true, 3), (false, 2)] {
        let vm = builder().stats_queue(stats).build().unwrap();
        assert_eq!(vm.reporting_queue_index(), index, "stats queue {stats}");
        let f = write_free_flush(&vm);
        let s = vm.stats();
        assert_eq!(s.driver.zeroed, f.blocks, "reports arrive at index {index}");
        assert_eq!(
            s.device.stats_updates,
            u64::from(stats),
            "primed stats buffer"
        );
        assert_eq!(s.device.malformed, 0);
    }
}

/// A device of its own (an external host, in a thread) with `policy` and `discarder`.
fn own_device<D>(policy: DiscardPolicy, discarder: fn() -> D) -> DeviceHost
where
    D: Discarder<GuestMemoryMmap> + Send + 'static,
{
    DeviceHost::External(Arc::new(move |file, size, irq| {
        let mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            size as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .expect("device mapping");
        let options = BalloonOptions {
            offer: FeatureOffer::default().with_zero_hints(),
            policy,
            ..BalloonOptions::default()
        };
        let device = BalloonDevice::new(options, discarder(), irq);
        let t = InProcessTransport::spawn(device, mem).expect("device thread");
        Ok(Box::new(t) as Box<dyn Transport>)
    }))
}

/// VM memory on `device`, the driver waiting `timeout` for each report.
fn vm_on(device: DeviceHost, timeout: Duration) -> VmMemory {
    builder()
        .device(device)
        .driver(DriverOptions {
            timeout,
            ..DriverOptions::default()
        })
        .build()
        .unwrap()
}

/// After the driver stopped: a pass fails at once; memory stays usable and correct.
fn broken_driver_fails_at_once_memory_stays_correct(vm: &VmMemory) {
    let pass = vm.flush(u64::MAX);
    assert!(pass.error.is_some());
    let b = vm.alloc_zeroed(order9()).unwrap();
    assert!(b.as_slice().iter().all(|&x| x == 0));
    drop(b);
    vm.manager().check_invariants().unwrap();
}

/// A device that holds every report for an hour.
fn device_holding_an_hour() -> DeviceHost {
    own_device(
        DiscardPolicy::Hold(Duration::from_secs(3600)),
        MmapDiscarder::new,
    )
}

/// Real discards' backing detection, and a panic at the first discard (a device bug, or
/// a host failure the device thread does not survive).
struct PanicsOnDiscard(MmapDiscarder);

impl Discarder<GuestMemoryMmap> for PanicsOnDiscard {
    fn backing(
        &mut self,
        mem: &GuestMemoryMmap,
        gpa: GuestAddress,
    ) -> Result<Backing, DiscardError> {
        self.0.backing(mem, gpa)
    }
    fn discard(
        &mut self,
        _: &GuestMemoryMmap,
        _: GuestAddress,
        _: u64,
        _: DiscardOp,
        _: Backing,
    ) -> Result<(), DiscardError> {
        panic!("injected discard failure")
    }
}

#[test]
fn a_hold_not_below_the_driver_timeout_is_refused() {
    // The first report would time out and stop the driver for good.
    let timeout = Duration::from_millis(200);
    for hold in [timeout, Duration::from_secs(3600)] {
        let r = builder()
            .discard_policy(DiscardPolicy::Hold(hold))
            .driver(DriverOptions {
                timeout,
                ..DriverOptions::default()
            })
            .build();
        assert!(
            matches!(r, Err(BuildError::HoldNotBelowTimeout { .. })),
            "hold {hold:?}"
        );
    }
}

#[test]
fn a_device_that_never_answers_times_out_and_no_block_is_lost() {
    // The device holds reports for an hour: the driver's wait runs out, the device is
    // reset (it forgets the held blocks, discarding nothing) and every block goes back
    // unreported; the stats say why the driver stopped.
    let vm = vm_on(device_holding_an_hour(), Duration::from_millis(200));
    let free_before = vm.stats().mm.free_pages_total();
    drop(write_working_set(&vm));
    let freed = vm.memfd_allocated_bytes();
    let unreported = unreported_pages(&vm);
    let pass = vm.flush(u64::MAX);
    assert!(pass.error.is_some(), "the report call failed");
    assert!(vm.driver_broken());
    let s = vm.stats();
    assert_eq!(s.driver.failures, 1);
    let why = s
        .health
        .driver_broken
        .expect("the stats say why the driver stopped");
    assert!(why.contains("within"), "{why}");
    assert!(s.health.reporter.worker_alive);
    assert_eq!(s.device.bytes_discarded, 0);
    assert_eq!(s.mm.free_pages_total(), free_before, "no block lost");
    assert_eq!(s.mm.isolated_pages, 0);
    assert_eq!(
        unreported_pages(&vm),
        unreported,
        "the working set is back unreported"
    );
    assert_eq!(vm.memfd_allocated_bytes(), freed, "nothing was discarded");
    vm.manager().check_invariants().unwrap();

    broken_driver_fails_at_once_memory_stays_correct(&vm);
}

#[test]
fn a_device_thread_panic_fails_the_driver_at_once_with_the_reason() {
    // Fail-stop: the device thread is not restarted (see zeronce-balloon-driver's
    // inprocess module). The report in flight fails at once with the panic's message,
    // not at the driver's timeout (an hour: a hang would show as this test never
    // ending), every block goes back unreported, and the stats say why.
    let device = own_device(DiscardPolicy::Immediate, || {
        PanicsOnDiscard(MmapDiscarder::new())
    });
    let vm = vm_on(device, Duration::from_secs(3600));
    let free_before = vm.stats().mm.free_pages_total();
    drop(write_working_set(&vm));
    let unreported = unreported_pages(&vm);
    let pass = vm.flush(u64::MAX);
    let err = pass.error.expect("the report call failed").to_string();
    assert!(err.contains("injected discard failure"), "{err}");
    assert!(vm.driver_broken());
    let s = vm.stats();
    let why = s.health.driver_broken.expect("the stats say why");
    assert!(
        why.contains("device thread panicked: injected discard failure"),
        "{why}"
    );
    assert!(
        s.health.reporter.worker_alive,
        "the engine's worker lives on"
    );
    assert_eq!(s.mm.free_pages_total(), free_before, "no block lost");
    assert_eq!(s.mm.isolated_pages, 0);
    assert_eq!(unreported_pages(&vm), unreported, "back unreported");
    broken_driver_fails_at_once_memory_stays_correct(&vm);
}

#[test]
#[ignore = "needs reserved 2 MiB huge pages; .ci/run reserves them and runs it"]
fn hugetlb_guest_ram_reports_whole_huge_pages() {
    let vm = builder()
        .backing(BackingKind::Hugetlb(HugePageSize::Size2M))
        // Not verify mode: its reads would fault the huge pages right back in.
        .build()
        .unwrap_or_else(|e| {
            panic!("2 MiB hugetlb guest RAM (echo 64 > /proc/sys/vm/nr_hugepages): {e}")
        });
    assert_eq!(vm.ring_area().1, 2 << 20, "the ring area is one huge page");
    let f = write_free_flush(&vm);
    assert!(f.flushed < f.freed, "huge pages left the memfd");
    let s = vm.stats();
    assert_eq!(s.driver.zeroed, f.blocks);
    let again = realloc_zeroed_skipping(&vm);
    assert!(again.iter().all(|b| b.as_slice().iter().all(|&x| x == 0)));
    drop(again);
    vm.manager().check_invariants().unwrap();
}

#[test]
fn an_allocation_waits_for_blocks_in_flight_to_the_host() {
    // The device holds each report for 300 ms before it answers: while a flush runs, the
    // freed working set is isolated (in flight) and nothing else is free. An allocation
    // then waits for the report instead of failing out of memory.
    let vm = builder()
        .discard_policy(DiscardPolicy::Hold(Duration::from_millis(300)))
        .build()
        .unwrap();
    let mut all = Vec::new();
    while let Ok(b) = vm.alloc(order9()) {
        all.push(b);
    }
    drop(all.split_off(all.len() - BLOCKS));
    let again = std::thread::scope(|scope| {
        let flush = scope.spawn(|| vm.flush(u64::MAX));
        // Not a timing: waits until the pass has isolated the blocks (or already ended).
        while vm.manager().stats().isolated_pages == 0 && !flush.is_finished() {
            std::thread::yield_now();
        }
        let again: Vec<PageBlock> = (0..BLOCKS)
            .map(|_| vm.alloc_zeroed(order9()))
            .collect::<Result<_, _>>()
            .expect("the allocation waited for the report, then found the blocks");
        let pass = flush.join().unwrap();
        assert!(pass.error.is_none(), "{:?}", pass.error);
        assert_eq!(pass.stats.pages, BLOCKS as u64 * 512, "{pass:?}");
        again
    });
    // With nothing in flight, out of memory is an error at once.
    let e = vm.alloc(order9()).err().expect("nothing left");
    assert!(e.to_string().contains("out of memory"), "{e}");
    drop((again, all));
    vm.manager().check_invariants().unwrap();
}

#[test]
fn threads_allocating_while_reports_run_never_lose_data() {
    // Two threads write their own pattern into 2 MiB blocks, check it, and free them,
    // while this thread reports through the virtqueue over and over: a block the device
    // discarded while someone held it would lose its pattern.
    let vm = builder().verify(true).build().unwrap();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (1..=2u8)
            .map(|id| {
                let vm = vm.clone();
                scope.spawn(move || {
                    for round in 0..40u8 {
                        let mut held: Vec<PageBlock> =
                            (0..3).map(|_| vm.alloc_zeroed(order9()).unwrap()).collect();
                        let pattern = id.wrapping_mul(31).wrapping_add(round) | 1;
                        for b in &mut held {
                            assert!(b.as_slice().iter().all(|&x| x == 0));
                            b.as_mut_slice().fill(pattern);
                        }
                        std::thread::yield_now();
                        for b in &held {
                            assert!(b.as_slice().iter().all(|&x| x == pattern));
                        }
                    }
                })
            })
            .collect();
        while !workers.iter().all(|w| w.is_finished()) {
            let pass = vm.flush(u64::MAX);
            assert!(pass.error.is_none(), "{:?}", pass.error);
        }
    });
    assert!(vm.flush(u64::MAX).error.is_none());
    let s = vm.stats();
    assert_eq!(s.mm.verify_failures, 0);
    assert_eq!(s.driver.failures, 0);
    assert_eq!(s.device.malformed, 0);
    assert!(s.driver.zeroed > 0, "the freed blocks were reported");
    vm.manager().check_invariants().unwrap();
}

#[test]
fn a_poisoning_guest_refuses_bit_6_and_the_device_keeps_its_poison() {
    // PAGE_POISON with a nonzero value: the driver does not accept bit 6 and tells the
    // value; the device then must not discard (zeros would replace the poison).
    let vm = builder()
        .driver(DriverOptions {
            page_poison: Some(0xaaaa_aaaa),
            ..DriverOptions::default()
        })
        .build()
        .unwrap();
    let negotiated = vm.negotiated();
    assert!(negotiated.contains(zeronce::zeronce_balloon::Feature::PagePoison));
    assert!(!negotiated.contains(zeronce::zeronce_balloon::Feature::DeviceInitReported));
    let f = write_free_flush(&vm);
    assert_eq!(f.flushed, f.freed, "nothing discarded");
    let s = vm.stats();
    assert_eq!(s.device.reports_skipped_poison, f.blocks);
    assert_eq!(s.device.bytes_discarded, 0);
    assert_eq!((s.driver.zeroed, s.driver.not_zeroed), (0, f.blocks));
    vm.manager().check_invariants().unwrap();
}
