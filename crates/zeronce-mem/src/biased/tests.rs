use super::*;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Takes `lock` with `try_lock` until it has it.
fn take<T>(lock: &BiasedLock<T>) -> BiasedGuard<'_, T> {
    loop {
        if let Some(g) = lock.try_lock() {
            return g;
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_thread_that_takes_it_often_enough_in_a_row_is_favoured() {
    let lock = BiasedLock::new(0u64);
    for _ in 0..lock.rebias_after() {
        let g = lock.try_lock().expect("nobody else holds it");
        assert!(
            !g.is_favoured(),
            "the favour comes after the takes, not during them"
        );
    }
    let g = lock.try_lock().expect("nobody else holds it");
    // Miri (and a kernel without membarrier) never favours: the lock stays test-and-set.
    assert_eq!(g.is_favoured(), heavy_barrier_ready());
    assert_eq!(lock.favours_me(), heavy_barrier_ready());
}

#[test]
fn it_is_not_reentrant_on_either_side() {
    let lock = BiasedLock::new(());
    for _ in 0..=lock.rebias_after() {
        let g = lock.try_lock().expect("free");
        assert!(
            lock.try_lock().is_none(),
            "a second guard beside {:?}",
            g.side
        );
    }
}

#[test]
fn another_user_takes_the_favour_away_and_it_is_harder_to_earn_again() {
    let lock = Arc::new(BiasedLock::new(0u64));
    for _ in 0..=lock.rebias_after() {
        *take(&lock) += 1;
    }
    if !heavy_barrier_ready() {
        return;
    }
    assert!(lock.favours_me());
    let first = lock.rebias_after();
    let other = Arc::clone(&lock);
    std::thread::spawn(move || {
        let mut g = take(&other);
        assert!(!g.is_favoured());
        *g += 1;
    })
    .join()
    .expect("the other user");
    assert!(!lock.favours_me(), "revoked");
    assert_eq!(lock.rebias_after(), first * 2);
    let g = take(&lock);
    assert!(!g.is_favoured());
    assert_eq!(*g, u64::from(first) + 2);
}

#[test]
fn a_visitor_leaves_the_favour() {
    let lock = Arc::new(BiasedLock::new(0u64));
    for _ in 0..=lock.rebias_after() {
        *take(&lock) += 1;
    }
    let favoured = lock.favours_me();
    let other = Arc::clone(&lock);
    std::thread::spawn(move || *other.lock() += 1)
        .join()
        .expect("the visitor");
    assert_eq!(lock.favours_me(), favoured);
    assert_eq!(*take(&lock), u64::from(lock.rebias_after()) + 2);
}

/// A counter whose increments are two separate steps with a pause between, so two
/// holders at once lose increments.
fn slow_increment(n: &mut u64) {
    let seen = *n;
    for _ in 0..20 {
        std::hint::spin_loop();
    }
    *n = seen + 1;
}

#[test]
fn the_favoured_thread_visitors_and_other_users_exclude_each_other() {
    // A lost increment needs two holders at once at the wrong moment: several tries.
    for _ in 0..if cfg!(miri) { 1 } else { 6 } {
        three_lockers_count_exactly();
    }
}

/// One try of the test above.
fn three_lockers_count_exactly() {
    let rounds = if cfg!(miri) { 200 } else { 200_000 };
    let lock = Arc::new(BiasedLock::new(0u64));
    let favoured_takes = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    // The main user: earns the favour and keeps it between the others' visits.
    {
        let (lock, favoured_takes) = (Arc::clone(&lock), Arc::clone(&favoured_takes));
        threads.push(std::thread::spawn(move || {
            for _ in 0..rounds {
                let mut g = take(&lock);
                if g.is_favoured() {
                    favoured_takes.fetch_add(1, Relaxed);
                }
                slow_increment(&mut g);
            }
        }));
    }
    // A drainer that visits now and then.
    {
        let lock = Arc::clone(&lock);
        threads.push(std::thread::spawn(move || {
            for _ in 0..rounds / 20 {
                slow_increment(&mut lock.lock());
                for _ in 0..200 {
                    std::hint::spin_loop();
                }
            }
        }));
    }
    // Another user, a few times: it takes the favour away each time.
    const OTHER_TAKES: usize = 4;
    {
        let lock = Arc::clone(&lock);
        threads.push(std::thread::spawn(move || {
            for _ in 0..OTHER_TAKES {
                slow_increment(&mut take(&lock));
                for _ in 0..50 {
                    std::thread::yield_now();
                }
            }
        }));
    }
    for t in threads {
        t.join().expect("a locker panicked");
    }
    let expected = rounds + rounds / 20 + OTHER_TAKES;
    assert_eq!(*take(&lock), expected as u64, "an increment was lost");
    if heavy_barrier_ready() && !cfg!(miri) {
        assert!(
            favoured_takes.load(Relaxed) > 0,
            "the main user was never favoured: the test did not test the favoured side"
        );
    }
}

#[test]
fn a_thread_the_caller_says_is_not_alone_is_never_favoured() {
    let lock = BiasedLock::new(());
    for _ in 0..4 * lock.rebias_after() {
        let g = lock.try_lock_favouring_if(|| false).expect("free");
        assert!(!g.is_favoured());
    }
    assert!(!lock.favours_me());
}

#[test]
fn a_user_that_finds_the_favoured_thread_inside_gives_way_and_ends_the_favour() {
    use std::sync::mpsc::channel;
    let lock = Arc::new(BiasedLock::new(0u64));
    for _ in 0..=lock.rebias_after() {
        *take(&lock) += 1;
    }
    if !heavy_barrier_ready() {
        return;
    }
    let mut inside = take(&lock);
    assert!(inside.is_favoured());
    let (tx, rx) = channel();
    let other = Arc::clone(&lock);
    let user = std::thread::spawn(move || {
        // The favoured thread stays inside: this user gives way.
        assert!(other.try_lock().is_none());
        tx.send(()).expect("main waits");
        // Once it has left, the next take needs no favour of anybody's.
        let mut g = take(&other);
        assert!(!g.is_favoured());
        *g += 1;
    });
    rx.recv().expect("the user gave way");
    assert!(
        !lock.favours_me(),
        "the favour ended while its thread was inside"
    );
    *inside += 1;
    drop(inside);
    user.join().expect("the user");
    assert_eq!(*take(&lock), u64::from(FIRST_REBIAS) + 3);
}
