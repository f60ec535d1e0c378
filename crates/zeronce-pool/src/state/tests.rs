use super::*;

const PAGE: u64 = 2 << 20;

fn names(n: usize) -> Vec<(String, Option<Persisted>)> {
    (0..n).map(|i| (format!("f{i}"), None)).collect()
}

/// Runs every background job to the end, zeroing every listed page (no holes).
fn zero_all(pool: &mut PoolState) {
    while let Some(job) = pool.next_job(u64::MAX) {
        pool.holes_repopulated(&job, &[]).unwrap();
        for &p in &job.pages.clone() {
            pool.page_zeroed(&job, p).unwrap();
        }
        assert_eq!(pool.finish_job(job).unwrap(), &FileState::Ready);
    }
}

fn persisted_of(pool: &PoolState, name: &str) -> Persisted {
    pool.persisted()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1
}

#[test]
fn unrecorded_files_are_zeroed_before_they_are_ready() {
    let mut pool = PoolState::new(PAGE, 4, names(2));
    assert_eq!(pool.counts().zeroable, 8);
    assert_eq!(persisted_of(&pool, "f0"), Persisted::Dirty);
    zero_all(&mut pool);
    assert_eq!(pool.counts().free_zero, 8);
    assert_eq!(pool.counters().pages_zeroed_background, 8);
    assert_eq!(persisted_of(&pool, "f0"), Persisted::Zero);
}

#[test]
fn recorded_zero_files_are_only_checked_for_holes() {
    let files = vec![("a".to_owned(), Some(Persisted::Zero))];
    let mut pool = PoolState::new(PAGE, 4, files);
    assert_eq!(pool.counts().zeroable, 0);
    let job = pool.next_job(u64::MAX).unwrap();
    assert!(job.check_holes && job.pages.is_empty());
    pool.holes_repopulated(&job, &[PageIndex(1)]).unwrap();
    assert_eq!(pool.finish_job(job).unwrap(), &FileState::Ready);
    assert_eq!(pool.counters().pages_repopulated, 1);
    assert_eq!(pool.counters().pages_zeroed_background, 0);
}

#[test]
fn held_files_stay_held_and_are_never_work() {
    let files = vec![("a".to_owned(), Some(Persisted::Held))];
    let mut pool = PoolState::new(PAGE, 4, files);
    assert!(pool.next_job(u64::MAX).is_none());
    assert_eq!(pool.counts().in_use, 4);
    assert_eq!(pool.take(PAGE), Err(StateError::Exhausted { zeroing: 0 }));
    pool.give_back("a").unwrap();
    assert_eq!(pool.counts().zeroable, 4);
}

#[test]
fn take_prefers_ready_then_zeroes_inline() {
    let mut pool = PoolState::new(PAGE, 2, names(2));
    let job = pool.next_job(u64::MAX).unwrap();
    pool.holes_repopulated(&job, &[]).unwrap();
    for &p in &job.pages.clone() {
        pool.page_zeroed(&job, p).unwrap();
    }
    pool.finish_job(job).unwrap();
    assert_eq!(pool.take(2 * PAGE), Ok(Take::Ready(FileId(0))));
    assert_eq!(persisted_of(&pool, "f0"), Persisted::Held);
    let Ok(Take::ZeroInline(job)) = pool.take(PAGE) else {
        panic!("expected inline zeroing");
    };
    assert_eq!(job.by, ZeroingBy::Inline);
    // Not zero on disk while the taker zeroes it, not work for anyone else.
    assert_eq!(persisted_of(&pool, "f1"), Persisted::Dirty);
    assert!(pool.next_job(u64::MAX).is_none());
    pool.holes_repopulated(&job, &[PageIndex(0)]).unwrap();
    pool.page_zeroed(&job, PageIndex(1)).unwrap();
    assert_eq!(pool.finish_job(job).unwrap(), &FileState::Held);
    let c = pool.counters();
    assert_eq!(
        (c.takes, c.takes_prezeroed, c.takes_zeroed_inline),
        (2, 1, 1)
    );
    assert_eq!((c.pages_zeroed_inline, c.pages_repopulated), (1, 1));
    assert_eq!(persisted_of(&pool, "f1"), Persisted::Held);
}

#[test]
fn returned_files_are_dirty_and_holes_are_not_zeroed() {
    let mut pool = PoolState::new(PAGE, 4, names(1));
    zero_all(&mut pool);
    let Take::Ready(f) = pool.take(PAGE).unwrap() else {
        panic!("ready file expected");
    };
    pool.give_back(pool.name(f).to_owned().as_str()).unwrap();
    assert_eq!(persisted_of(&pool, "f0"), Persisted::Dirty);
    let before = pool.counters().pages_zeroed_background;
    let job = pool.next_job(u64::MAX).unwrap();
    assert!(job.check_holes);
    pool.holes_repopulated(&job, &[PageIndex(0), PageIndex(2)])
        .unwrap();
    for &p in &job.pages.clone() {
        pool.page_zeroed(&job, p).unwrap();
    }
    pool.finish_job(job).unwrap();
    assert_eq!(pool.counters().pages_zeroed_background - before, 2);
    assert_eq!(pool.counters().pages_repopulated, 2);
}

#[test]
fn an_interrupted_job_leaves_its_remaining_pages_first_in_line() {
    let mut pool = PoolState::new(PAGE, 4, names(2));
    let job = pool.next_job(2).unwrap();
    assert_eq!(job.pages.len(), 2);
    let file = job.file;
    pool.holes_repopulated(&job, &[]).unwrap();
    pool.page_zeroed(&job, job.pages[0]).unwrap();
    assert!(matches!(
        pool.finish_job(job).unwrap(),
        FileState::Dirty { .. }
    ));
    assert_eq!(pool.counters().jobs_interrupted, 1);
    let next = pool.next_job(u64::MAX).unwrap();
    assert_eq!(next.file, file);
    assert!(!next.check_holes);
    assert_eq!(next.pages, vec![PageIndex(1), PageIndex(2), PageIndex(3)]);
    pool.finish_job(next).unwrap();
}

#[test]
fn bad_requests_are_typed_errors_and_change_nothing() {
    let mut pool = PoolState::new(PAGE, 2, names(1));
    let generation = pool.generation();
    assert!(matches!(
        pool.take(3 * PAGE),
        Err(StateError::TooLarge { .. })
    ));
    assert_eq!(
        pool.give_back("nope"),
        Err(StateError::Unknown("nope".into()))
    );
    assert_eq!(pool.give_back("f0"), Err(StateError::NotHeld("f0".into())));
    let job = pool.next_job(u64::MAX).unwrap();
    assert!(matches!(
        pool.page_zeroed(&job, PageIndex(9)),
        Err(StateError::BadPage { .. })
    ));
    let forged = Job {
        file: job.file,
        check_holes: false,
        pages: vec![],
        by: ZeroingBy::Inline,
    };
    assert_eq!(
        pool.finish_job(forged),
        Err(StateError::NotZeroing(job.file))
    );
    assert_eq!(pool.generation(), generation);
    pool.finish_job(job).unwrap();
}

#[test]
fn persisted_never_says_zero_for_a_file_with_work_or_a_client() {
    let mut pool = PoolState::new(PAGE, 2, names(3));
    let mut jobs = Vec::new();
    for step in 0..40u32 {
        for (name, p) in pool.persisted() {
            let id = pool.find(name).unwrap();
            if p == Persisted::Zero {
                assert_eq!(pool.state(id), &FileState::Ready, "step {step}");
            }
        }
        match step % 4 {
            0 => {
                if let Some(j) = pool.next_job(u64::MAX) {
                    jobs.push(j);
                }
            }
            1 => {
                if let Some(j) = jobs.pop() {
                    pool.holes_repopulated(&j, &[]).unwrap();
                    for &p in &j.pages.clone() {
                        pool.page_zeroed(&j, p).unwrap();
                    }
                    pool.finish_job(j).unwrap();
                }
            }
            2 => {
                if let Ok(Take::ZeroInline(j)) = pool.take(PAGE) {
                    pool.finish_job(j).unwrap();
                }
            }
            _ => {
                let held: Vec<String> = pool
                    .persisted()
                    .into_iter()
                    .filter(|(_, p)| *p == Persisted::Held)
                    .map(|(n, _)| n.to_owned())
                    .collect();
                if let Some(n) = held.first() {
                    pool.give_back(n).unwrap();
                }
            }
        }
    }
}

#[test]
fn an_orphaned_lease_is_never_work_until_reclaimed() {
    let mut pool = PoolState::new(PAGE, 4, names(2));
    zero_all(&mut pool);
    let Ok(Take::Ready(f)) = pool.take(PAGE) else {
        panic!("a ready file")
    };
    pool.lease(f).unwrap();
    assert_eq!(pool.lease(f), Err(StateError::NotInState(f, "held")));
    assert_eq!(persisted_of(&pool, "f0"), Persisted::Orphaned);
    assert!(pool.end_lease(f));
    assert!(!pool.end_lease(f), "a lease ends once");
    assert_eq!(pool.counts().orphaned, 4);
    assert_eq!(pool.counts().total(), 8);
    assert!(pool.next_job(u64::MAX).is_none(), "an orphan is not zeroed");
    assert_eq!(pool.orphans(), vec![f]);
    pool.reclaim(f).unwrap();
    assert_eq!(pool.reclaim(f), Err(StateError::NotInState(f, "orphaned")));
    assert_eq!(pool.counts().zeroable, 4);
    assert_eq!(pool.counters().leases_orphaned, 1);
    assert_eq!(pool.counters().orphans_reclaimed, 1);
    zero_all(&mut pool);

    // Returned before its connection closed: nothing to orphan. An orphan may also be
    // returned by path; a restart finds it orphaned.
    let Ok(Take::Ready(g)) = pool.take(PAGE) else {
        panic!("a ready file")
    };
    pool.lease(g).unwrap();
    pool.give_back(pool.name(g).to_owned().as_str()).unwrap();
    assert!(!pool.end_lease(g));
    zero_all(&mut pool);
    let Ok(Take::Ready(h)) = pool.take(PAGE) else {
        panic!("a ready file")
    };
    pool.lease(h).unwrap();
    assert!(pool.end_lease(h));
    let restarted = PoolState::new(
        PAGE,
        4,
        pool.persisted()
            .into_iter()
            .map(|(n, p)| (n.to_owned(), Some(p))),
    );
    assert_eq!(restarted.orphans(), vec![h]);
    pool.give_back(pool.name(h).to_owned().as_str()).unwrap();
    assert_eq!(pool.counts().orphaned, 0);
}

/// The uid of the takers of [`take_as`].
const USER: u32 = 1000;

/// Takes a ready file and records `connection` (token `t-CONNECTION`, user [`USER`]) as
/// its taker.
fn take_as(pool: &mut PoolState, connection: u64) -> FileId {
    let Ok(Take::Ready(f)) = pool.take(PAGE) else {
        panic!("a ready file")
    };
    let token = format!("t-{connection}");
    pool.set_owner(
        f,
        Owner {
            connection: Some(connection),
            uid: Some(USER),
            token,
        },
    )
    .unwrap();
    f
}

#[test]
fn only_the_taker_returns_a_file_by_its_connection_or_its_token() {
    let mut pool = PoolState::new(PAGE, 4, names(2));
    zero_all(&mut pool);
    let f = take_as(&mut pool, 1);
    let name = pool.name(f).to_owned();
    let other = |token| Claim {
        connection: 2,
        user: Returner::Uid(USER),
        token,
    };
    for claim in [other(None), other(Some("t-2")), other(Some("t-1x"))] {
        assert_eq!(
            pool.return_file(&name, Some(&claim), false),
            Err(StateError::NotOwner(name.clone()))
        );
    }
    assert_eq!(
        pool.state(f),
        &FileState::Held,
        "a refused return changes nothing"
    );
    assert_eq!(pool.counters().returns_refused, 3);
    assert!(pool.held_by(1) && !pool.held_by(2));
    assert_eq!(pool.tokens(), vec![(name.as_str(), "t-1", Some(USER))]);
    // The token, from another connection (a restarted VMM).
    pool.return_file(&name, Some(&other(Some("t-1"))), false)
        .unwrap();
    assert!(pool.owner(f).is_none() && pool.tokens().is_empty());
    zero_all(&mut pool);
    // The taker's own connection, without a token (clients before tokens).
    let g = take_as(&mut pool, 3);
    let claim = Claim {
        connection: 3,
        user: Returner::Uid(USER),
        token: None,
    };
    pool.return_file(pool.name(g).to_owned().as_str(), Some(&claim), false)
        .unwrap();
    assert_eq!(pool.counters().returns, 2);
}

#[test]
fn a_token_returns_a_file_only_for_its_takers_user_or_a_trusted_one() {
    let mut pool = PoolState::new(PAGE, 4, names(1));
    zero_all(&mut pool);
    let f = take_as(&mut pool, 1);
    let name = pool.name(f).to_owned();
    let claim = |user| Claim {
        connection: 2,
        user,
        token: Some("t-1"),
    };
    assert_eq!(
        pool.return_file(&name, Some(&claim(Returner::Uid(USER + 1))), false),
        Err(StateError::NotOwner(name.clone())),
        "the right token from another user"
    );
    assert_eq!(pool.state(f), &FileState::Held);
    pool.return_file(&name, Some(&claim(Returner::Trusted)), false)
        .unwrap();
    zero_all(&mut pool);
    let g = take_as(&mut pool, 1);
    pool.return_file(&name, Some(&claim(Returner::Uid(USER))), false)
        .unwrap();
    assert_eq!(g, f);
    // A take recorded without a uid (in-process, or before uids): the token alone.
    zero_all(&mut pool);
    let Ok(Take::Ready(h)) = pool.take(PAGE) else {
        panic!("a ready file")
    };
    let owner = Owner {
        connection: None,
        uid: None,
        token: "t-1".into(),
    };
    pool.set_owner(h, owner).unwrap();
    pool.return_file(&name, Some(&claim(Returner::Uid(USER + 1))), false)
        .unwrap();
    assert_eq!(pool.counters().returns_refused, 1);
}

#[test]
fn a_file_returned_while_in_use_is_orphaned_not_zeroed_and_zero_bytes_are_refused() {
    let mut pool = PoolState::new(PAGE, 4, names(1));
    zero_all(&mut pool);
    assert_eq!(pool.take(0), Err(StateError::ZeroBytes));
    let f = take_as(&mut pool, 1);
    let name = pool.name(f).to_owned();
    let mine = Claim {
        connection: 1,
        user: Returner::Uid(USER),
        token: None,
    };
    pool.return_file(&name, Some(&mine), true).unwrap();
    assert_eq!(pool.state(f), &FileState::Orphaned);
    assert_eq!(persisted_of(&pool, "f0"), Persisted::Orphaned);
    assert!(
        pool.next_job(u64::MAX).is_none(),
        "never zeroed while in use"
    );
    assert!(!pool.held_by(1));
    assert_eq!(
        pool.return_file(&name, Some(&mine), false),
        Err(StateError::NotOwner(name.clone())),
        "the connection gave it up; the token still returns it"
    );
    pool.reclaim(f).unwrap();
    assert_eq!(pool.counts().zeroable, 4);
    let c = pool.counters();
    assert_eq!(
        (c.returns, c.returns_in_use, c.orphans_reclaimed),
        (1, 1, 1)
    );
}

#[test]
fn tokens_survive_a_restart_and_untokened_held_files_return_as_before() {
    let mut pool = PoolState::new(PAGE, 4, names(2));
    zero_all(&mut pool);
    let f = take_as(&mut pool, 1);
    let name = pool.name(f).to_owned();
    let mut restarted = PoolState::new(
        PAGE,
        4,
        pool.persisted()
            .into_iter()
            .map(|(n, p)| (n.to_owned(), Some(p))),
    );
    restarted.restore_token(f, "t-1".into(), Some(USER));
    let stranger = Claim {
        connection: 1,
        user: Returner::Uid(USER),
        token: None,
    };
    assert_eq!(
        restarted.return_file(&name, Some(&stranger), false),
        Err(StateError::NotOwner(name.clone())),
        "connection ids do not survive a restart"
    );
    let with_token = Claim {
        token: Some("t-1"),
        ..stranger
    };
    restarted
        .return_file(&name, Some(&with_token), false)
        .unwrap();
    let held = vec![("a".to_owned(), Some(Persisted::Held))];
    let mut legacy = PoolState::new(PAGE, 4, held);
    legacy.return_file("a", Some(&stranger), false).unwrap();
}

#[test]
fn a_free_file_in_use_at_start_is_held_until_unused() {
    let mut pool = PoolState::new(PAGE, 4, names(2));
    let f = FileId(1);
    pool.hold_until_unused(f).unwrap();
    assert_eq!(pool.counts().orphaned, 4);
    assert_eq!(pool.next_job(u64::MAX).map(|j| j.file), Some(FileId(0)));
    assert!(
        pool.next_job(u64::MAX).is_none(),
        "never zeroed while in use"
    );
    assert_eq!(
        pool.hold_until_unused(f),
        Err(StateError::NotInState(f, "dirty"))
    );
    pool.reclaim(f).unwrap();
    assert_eq!(pool.next_job(u64::MAX).map(|j| j.file), Some(f));
}
