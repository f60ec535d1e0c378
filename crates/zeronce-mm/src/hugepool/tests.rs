use super::*;
use std::sync::Mutex;

const O9: Order = match Order::new(9) {
    Ok(o) => o,
    Err(_) => panic!("order 9 is valid"),
};
const HUGE: u64 = 512;

fn pool_with(node_pages: &[(usize, u64, bool)]) -> HugePool {
    let mut pool = HugePool::new(O9);
    let mut start = 0;
    for &(node, pages, known_zero) in node_pages {
        let range = PageRange::new(Pfn(start), pages * HUGE);
        assert_eq!(pool.add_range(ZoneId(node), range, known_zero), Ok(pages));
        start += pages * HUGE;
    }
    pool.check_invariants().unwrap();
    pool
}

#[test]
fn zero_requests_take_known_zero_pages_and_zero_inline_only_when_none_is_left() {
    let mut pool = pool_with(&[(0, 1, true), (0, 2, false)]);
    assert_eq!(pool.zeroable(ZoneId(0)), 2);
    let a = pool.alloc(None, true).unwrap();
    assert_eq!((a.page.pfn, a.zeroing), (Pfn(0), PoolZeroing::Skipped));
    let b = pool.alloc(None, true).unwrap();
    assert_eq!(b.zeroing, PoolZeroing::Required);
    assert_eq!(pool.zeroable(ZoneId(0)), 1);
    let c = pool.alloc(Some(ZoneId(0)), false).unwrap();
    assert_eq!(c.zeroing, PoolZeroing::NotRequested);
    assert!(matches!(
        pool.alloc(None, true),
        Err(HugePoolError::Exhausted { zeroing: 0, .. })
    ));
    let k = pool.counters();
    assert_eq!(
        (
            k.allocs,
            k.allocs_prezeroed,
            k.allocs_zeroed_inline,
            k.alloc_failures
        ),
        (3, 1, 1, 1)
    );
    pool.check_invariants().unwrap();
}

#[test]
fn other_requests_save_known_zero_pages() {
    let mut pool = pool_with(&[(0, 1, true), (0, 1, false)]);
    let a = pool.alloc(None, false).unwrap();
    assert_eq!(
        a.page.pfn,
        Pfn(HUGE),
        "the dirty page goes to the non-zero request"
    );
    assert_eq!(pool.node_counts(ZoneId(0)).free_zero, 1);
}

#[test]
fn freed_pages_are_dirty_unless_hinted_and_misuse_is_typed() {
    let mut pool = pool_with(&[(0, 2, true)]);
    let a = pool.alloc(None, true).unwrap().page;
    let b = pool.alloc(None, true).unwrap().page;
    pool.free(a, FreeHint::Dirty).unwrap();
    assert_eq!(
        pool.state_of(a.pfn),
        Some((a, PageState::Free { known_zero: false }))
    );
    assert_eq!(
        pool.free(a, FreeHint::Dirty),
        Err(HugePoolError::DoubleFree(a))
    );
    pool.free(b, FreeHint::KnownZero).unwrap();
    assert_eq!(pool.zeroable(ZoneId(0)), 1);
    let foreign = HugePage {
        pfn: Pfn(HUGE * 7),
        ..a
    };
    assert_eq!(
        pool.free(foreign, FreeHint::Dirty),
        Err(HugePoolError::ForeignPage(foreign))
    );
    let wrong_node = HugePage {
        node: ZoneId(1),
        ..a
    };
    assert_eq!(
        pool.free(wrong_node, FreeHint::Dirty),
        Err(HugePoolError::ForeignPage(wrong_node))
    );
    let overlap = PageRange::new(Pfn(HUGE), HUGE);
    assert_eq!(
        pool.add_range(ZoneId(0), overlap, true),
        Err(HugePoolError::AlreadyInPool(Pfn(HUGE)))
    );
    let unaligned = PageRange::new(Pfn(HUGE * 4 + 1), HUGE);
    assert!(matches!(
        pool.add_range(ZoneId(0), unaligned, true),
        Err(HugePoolError::Unaligned { .. })
    ));
    pool.check_invariants().unwrap();
}

#[test]
fn pages_being_zeroed_are_not_allocatable_and_come_back_per_verdict() {
    let mut pool = pool_with(&[(0, 2, false), (1, 1, false)]);
    let tickets = pool.take_zeroable(ZoneId(0), 5);
    assert_eq!(tickets.len(), 2);
    assert_eq!(pool.zeroable(ZoneId(0)), 0);
    assert_eq!(
        pool.alloc(Some(ZoneId(0)), true),
        Err(HugePoolError::Exhausted {
            node: Some(ZoneId(0)),
            zeroing: 2
        })
    );
    let page = tickets[0].page();
    assert_eq!(
        pool.free(page, FreeHint::Dirty),
        Err(HugePoolError::BeingZeroed(page))
    );
    let mut it = tickets.into_iter();
    pool.finish_zeroing(it.next().unwrap(), true).unwrap();
    pool.finish_zeroing(it.next().unwrap(), false).unwrap();
    assert_eq!(
        pool.node_counts(ZoneId(0)),
        PoolCounts {
            free_zero: 1,
            zeroable: 1,
            in_use: 0,
            zeroing: 0
        }
    );
    let a = pool.alloc(Some(ZoneId(0)), true).unwrap();
    assert_eq!((a.page, a.zeroing), (page, PoolZeroing::Skipped));
    // A ticket of another pool is refused.
    let mut other = pool_with(&[(0, 1, false)]);
    let stray = other.take_zeroable(ZoneId(0), 1).pop().unwrap();
    assert!(pool.finish_zeroing(stray, true).is_err());
    let k = pool.counters();
    assert_eq!((k.pages_prezeroed, k.zeroing_aborted), (1, 1));
    pool.check_invariants().unwrap();
}

fn recorded_pool(
    min_interval_ms: u64,
) -> (HugePool, Arc<ManualClock>, Arc<Mutex<Vec<ZeroableEvent>>>) {
    let mut pool = pool_with(&[(0, 4, true), (1, 4, true)]);
    let clock = ManualClock::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&log);
    pool.set_event_hook(
        Box::new(move |e| sink.lock().unwrap().push(e)),
        clock.clone(),
        Duration::from_millis(min_interval_ms),
    );
    (pool, clock, log)
}

#[test]
fn events_are_rate_limited_per_node_with_a_trailing_event() {
    let (mut pool, clock, log) = recorded_pool(100);
    let pages: Vec<HugePage> = (0..4)
        .map(|_| pool.alloc(Some(ZoneId(0)), true).unwrap().page)
        .collect();
    let other = pool.alloc(Some(ZoneId(1)), true).unwrap().page;
    pool.free(pages[0], FreeHint::Dirty).unwrap(); // fires at once (0 -> 1)
    pool.free(pages[1], FreeHint::Dirty).unwrap(); // held back
    pool.free(other, FreeHint::Dirty).unwrap(); // other node: its own limit, fires
    pool.free(pages[2], FreeHint::KnownZero).unwrap(); // no growth, no event
    assert_eq!(log.lock().unwrap().len(), 2);
    assert_eq!(pool.next_event_deadline(), Some(Duration::from_millis(100)));
    clock.advance(Duration::from_millis(99));
    assert_eq!(pool.poll_events(), Some(Duration::from_millis(100)));
    assert_eq!(log.lock().unwrap().len(), 2);
    clock.advance(Duration::from_millis(1));
    assert_eq!(pool.poll_events(), None);
    let events = log.lock().unwrap().clone();
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[2],
        ZeroableEvent {
            node: ZoneId(0),
            zeroable: 2,
            at: Duration::from_millis(100),
            trailing: true
        }
    );
    assert!(!events[0].trailing && events[0].zeroable == 1 && events[1].node == ZoneId(1));
    assert_eq!(pool.counters().events, 3);
}

#[test]
fn a_held_back_event_is_dropped_when_nothing_is_left_to_zero() {
    let (mut pool, clock, log) = recorded_pool(50);
    let a = pool.alloc(Some(ZoneId(0)), true).unwrap().page;
    let b = pool.alloc(Some(ZoneId(0)), true).unwrap().page;
    pool.free(a, FreeHint::Dirty).unwrap();
    pool.free(b, FreeHint::Dirty).unwrap();
    for t in pool.take_zeroable(ZoneId(0), 10) {
        pool.finish_zeroing(t, true).unwrap();
    }
    clock.advance(Duration::from_millis(60));
    assert_eq!(pool.poll_events(), None);
    assert_eq!(log.lock().unwrap().len(), 1);
    // After the interval a growth fires at once again.
    let c = pool.alloc(Some(ZoneId(0)), false).unwrap().page;
    pool.free(c, FreeHint::Dirty).unwrap();
    assert_eq!(log.lock().unwrap().len(), 2);
}
