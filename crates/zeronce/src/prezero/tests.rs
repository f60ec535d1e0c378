use super::*;
use zeronce_mem::{HugetlbPoolCounters, RamError};
use zeronce_mm::hugepool::PoolZeroing;

fn pool(pages: u64, interval_ms: u64) -> HugePagePool {
    HugePagePool::builder()
        .pages(pages)
        .min_event_interval(Duration::from_millis(interval_ms))
        .build()
        .unwrap()
}

/// Allocates every page, writes it, frees it: an all-dirty pool.
fn dirty_everything(p: &HugePagePool) {
    let pages: Vec<PoolPage> = (0..p.counts().total())
        .map(|_| p.alloc(false).unwrap())
        .collect();
    for mut page in pages {
        page.as_mut_slice().fill(0xA5);
        page.free().unwrap();
    }
}

#[test]
fn freed_pages_become_zeroable_and_prezeroed_pages_are_served_without_zeroing() {
    let p = pool(3, 0);
    assert_eq!(p.zeroable_total(), 0, "fresh memory is known zero");
    let mut a = p.alloc(true).unwrap();
    assert_eq!(a.zeroing(), PoolZeroing::Skipped);
    assert!(a.as_slice().iter().all(|&b| b == 0));
    a.as_mut_slice()[12345] = 7;
    let pfn = a.page().pfn;
    a.free().unwrap();
    assert_eq!(p.zeroable(ZoneId(0)), 1);
    assert!(!p.reads_zero(pfn));
    assert!(
        p.take_notifications() >= 1,
        "the eventfd counted the new zeroable page"
    );
    let report = p.prezero(10, &CancelToken::new());
    assert_eq!(
        (report.pages, report.zeroable_left, report.cancelled),
        (1, 0, false)
    );
    assert_eq!(report.bytes, p.page_bytes() as u64);
    assert!(p.reads_zero(pfn));
    let all: Vec<PoolPage> = (0..3).map(|_| p.alloc(true).unwrap()).collect();
    assert!(all.iter().all(|pg| pg.zeroing() == PoolZeroing::Skipped));
    assert!(all.iter().all(|pg| pg.as_slice().iter().all(|&b| b == 0)));
    let k = p.counters();
    assert_eq!(
        (
            k.allocs_prezeroed,
            k.allocs_zeroed_inline,
            k.pages_prezeroed
        ),
        (4, 0, 1)
    );
    drop(all);
    p.check_invariants().unwrap();
}

#[test]
fn without_prezeroed_pages_a_zero_request_is_zeroed_inline() {
    let p = pool(2, 0);
    dirty_everything(&p);
    assert_eq!(p.zeroable_total(), 2);
    let a = p.alloc(true).unwrap();
    assert_eq!(a.zeroing(), PoolZeroing::Required);
    assert!(a.as_slice().iter().all(|&b| b == 0));
    let b = p.alloc(false).unwrap();
    assert_eq!(b.zeroing(), PoolZeroing::NotRequested);
    assert!(
        b.as_slice().contains(&0xA5),
        "no zero-request: contents left alone"
    );
    assert!(
        b.free_zeroed().is_ok_and(|zero| !zero),
        "a dirty page is not taken as zero"
    );
    assert!(a.free_zeroed().unwrap());
    assert_eq!(p.counters().allocs_zeroed_inline, 1);
    assert_eq!(p.counts().free_zero, 1);
    assert!(matches!(
        p.alloc_on(Some(ZoneId(3)), true),
        Err(PrezeroError::Pool(_))
    ));
}

#[test]
fn cancellation_stops_between_pages_and_threads_share_the_work() {
    let p = HugePagePool::builder().pages(6).nodes(2).build().unwrap();
    dirty_everything(&p);
    let cancel = CancelToken::new();
    cancel.cancel();
    let r = p.prezero(u64::MAX, &cancel);
    assert_eq!((r.pages, r.cancelled, r.zeroable_left), (0, true, 6));
    assert_eq!(
        p.prezero_on(Some(ZoneId(1)), u64::MAX, &CancelToken::new())
            .pages,
        3
    );
    assert_eq!(p.zeroable(ZoneId(0)), 3);
    let r = p.prezero_parallel(u64::MAX, 2, &CancelToken::new());
    assert_eq!((r.pages, r.zeroable_left), (3, 0));
    let pfns: Vec<Pfn> = (0..6).map(|i| Pfn(i * 512)).collect();
    assert!(pfns.iter().all(|&pfn| p.reads_zero(pfn)));
    p.check_invariants().unwrap();
}

#[test]
fn a_held_back_event_still_arrives() {
    let p = pool(2, 50);
    let a = p.alloc(false).unwrap();
    let b = p.alloc(false).unwrap();
    a.free().unwrap();
    assert!(p.wait_notification(Some(Duration::ZERO)).unwrap());
    assert!(p.take_notifications() >= 1);
    b.free().unwrap(); // within the interval: held back, delivered by the timer thread
    assert!(p.wait_notification(Some(Duration::from_secs(20))).unwrap());
    assert_eq!(p.counters().events, 2);
}

#[test]
fn hugetlb_backing_needs_reserved_pages_and_says_so() {
    let available = HugetlbPoolCounters::read(2 << 20).map_or(0, |k| k.available());
    let built = HugePagePool::builder()
        .pages(2)
        .backing(BackingKind::Hugetlb(HugePageSize::Size2M))
        .build();
    match built {
        Ok(p) => {
            let mut page = p.alloc(true).unwrap();
            page.as_mut_slice()[0] = 1;
            page.free().unwrap();
            assert_eq!(p.prezero(1, &CancelToken::new()).pages, 1);
        }
        Err(BuildError::Ram(RamError::NoHugePages { .. })) => assert!(available < 2),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn allocation_racing_a_prezeroer_always_gets_zeroed_pages() {
    let p = pool(2, 0);
    dirty_everything(&p);
    let stop = CancelToken::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.is_cancelled() {
                p.prezero(u64::MAX, &stop);
                std::thread::yield_now();
            }
        });
        for round in 0..300u32 {
            // Pages may be mid-zeroing: the allocator waits for them or zeroes inline.
            let mut a = p.alloc(true).unwrap();
            let mut b = p.alloc(true).unwrap();
            assert!(a.as_slice().iter().all(|&x| x == 0), "round {round}");
            assert!(b.as_slice().iter().all(|&x| x == 0), "round {round}");
            a.as_mut_slice()[round as usize] = 1;
            b.as_mut_slice()[4096 + round as usize] = 1;
            drop((a, b));
        }
        stop.cancel();
    });
    let k = p.counters();
    assert_eq!(k.allocs_prezeroed + k.allocs_zeroed_inline, 600);
    p.check_invariants().unwrap();
}
