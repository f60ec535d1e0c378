//! Property tests of the reporting engine on the real manager: a fake device answers
//! zero / not zero / error at random and allocates while it holds a batch; after every step
//! the docs/ARCHITECTURE.md §3 invariants hold, nothing is lost or handed out twice, and every block
//! handed out as zero reads zero (verify mode on, over fake memory that tracks contents).

mod common;

use common::FakeZeroer;
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zeronce_mm::mock::MockDevice;
use zeronce_mm::reporting::{
    BudgetPolicy, PassKind, ReportError, Reporter, ReportingConfig, ReportingEngine, ZeroGuarantee,
};
use zeronce_mm::{AllocRequest, Block, FreeHint, MemoryManager, MmConfig, Order, PageRange, Pfn};

const PAGES: u64 = 256;

/// What the device says for one block (or, first in a batch, `Error` for all of it).
#[derive(Clone, Copy, Debug)]
enum Answer {
    Zeroed,
    NotZeroed,
    Error,
}

/// Allocated blocks, shared by the test and the device.
type Live = Arc<Mutex<Vec<Block>>>;

/// Hands out a block: it must not overlap a live one; a zero-request must read zero. The
/// owner then writes to it.
fn take(live: &Live, mem: &FakeZeroer, block: Block, zeroed: bool) {
    let mut l = live.lock().unwrap();
    assert!(
        l.iter().all(|b| !b.range().overlaps(&block.range())),
        "{block} handed out twice"
    );
    assert!(
        !zeroed || mem.reads_zero(block.range()),
        "{block} handed out as zero but is not"
    );
    mem.scribble(block.range());
    l.push(block);
}

/// The host: "discards" (zeroes the fake memory of) blocks it answers `Zeroed` for, and
/// allocates while the batch is out (it must never get a block of the batch). Answers
/// come from `answers`, round and round.
fn random_device(
    answers: Vec<Answer>,
    mem: &FakeZeroer,
    mm: &Arc<MemoryManager>,
    live: &Live,
) -> MockDevice<'static> {
    let (mem, mm, live) = (mem.clone(), Arc::clone(mm), Arc::clone(live));
    let mut next = answers.into_iter().cycle();
    MockDevice::new(4, ZeroGuarantee::NotZeroed).on_report(move |blocks, verdicts| {
        // Concurrent allocation while the batch is isolated.
        if let Ok(a) = mm.alloc(Order::ZERO, AllocRequest::ZEROED) {
            assert!(
                blocks.iter().all(|b| !b.overlaps(&a.block.range())),
                "isolated block allocated"
            );
            take(&live, &mem, a.block, true);
        }
        let mut answer = || next.next().expect("at least one answer");
        if let Answer::Error = answer() {
            return Err(ReportError::new("random failure"));
        }
        for (b, v) in blocks.iter().zip(verdicts.iter_mut()) {
            *v = match answer() {
                Answer::Zeroed => {
                    mem.0.lock().unwrap().dirty[b.start.0 as usize..b.end().0 as usize].fill(false);
                    ZeroGuarantee::Zeroed
                }
                _ => ZeroGuarantee::NotZeroed,
            };
        }
        Ok(())
    })
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { order: u8, zeroed: bool },
    Free { idx: usize, zero: bool },
    Flush { max_pages: u64 },
    Tick { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..=5, any::<bool>()).prop_map(|(order, zeroed)| Op::Alloc { order, zeroed }),
        4 => (any::<usize>(), prop::bool::weighted(0.2)).prop_map(|(idx, zero)| Op::Free { idx, zero }),
        1 => (1u64..=PAGES).prop_map(|max_pages| Op::Flush { max_pages }),
        2 => (0u64..3000).prop_map(|ms| Op::Tick { ms }),
    ]
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![3 => Just(Answer::Zeroed), 2 => Just(Answer::NotZeroed), 1 => Just(Answer::Error)]
}

fn budget() -> impl Strategy<Value = BudgetPolicy> {
    prop_oneof![
        Just(BudgetPolicy::Linux),
        Just(BudgetPolicy::Adaptive),
        Just(BudgetPolicy::Unlimited)
    ]
}

/// A manager of `PAGES` fake pages (start dirty), max order 5, reporting order 3, verify on.
fn manager(mem: &FakeZeroer) -> Arc<MemoryManager> {
    let mut cfg = MmConfig::new(vec![PageRange::new(Pfn(0), PAGES)]);
    cfg.max_order = Order::new(5).unwrap();
    cfg.reporting_order = Order::new(3).unwrap();
    cfg.verify = true;
    cfg.low_watermark_pages = Some(0);
    Arc::new(MemoryManager::new(cfg, Arc::new(mem.clone())).unwrap())
}

fn config(budget: BudgetPolicy) -> ReportingConfig {
    ReportingConfig {
        order: Order::new(3).unwrap(),
        capacity: 4,
        delay: Duration::from_secs(2),
        budget,
        watermark_gate: true,
    }
}

/// Nothing lost: allocated (as the test knows it) + free = total, nothing left isolated.
fn check_accounting(mm: &MemoryManager, live: &Live) {
    mm.check_invariants().unwrap();
    let s = mm.stats();
    let owned: u64 = live.lock().unwrap().iter().map(|b| b.order.pages()).sum();
    assert_eq!(s.isolated_pages, 0);
    assert_eq!(s.allocated_pages, owned);
    assert_eq!(s.free_pages_total() + owned, PAGES);
    assert_eq!(s.verify_failures, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn reporting_keeps_every_rule(
        ops in prop::collection::vec(op(), 1..80),
        answers in prop::collection::vec(answer(), 1..16),
        budget in budget(),
    ) {
        let mem = FakeZeroer::new(PAGES, true);
        let mm = manager(&mem);
        let live: Live = Arc::default();
        let engine = Arc::new(ReportingEngine::new(config(budget), 4).unwrap());
        let e = Arc::clone(&engine);
        let order = Order::new(3).unwrap();
        let _ = mm.set_report_notifier(Box::new(move |_| { e.notify_free(order); }));
        let mut dev = random_device(answers, &mem, &mm, &live);
        let mut now = Instant::now();
        for op in ops {
            match op {
                Op::Alloc { order, zeroed } => {
                    let req = AllocRequest { zeroed, hint: None };
                    if let Ok(a) = mm.alloc(Order::new(order).unwrap(), req) {
                        take(&live, &mem, a.block, zeroed);
                    }
                }
                Op::Free { idx, zero } => {
                    let block = {
                        let mut l = live.lock().unwrap();
                        if l.is_empty() { continue; }
                        let i = idx % l.len();
                        l.swap_remove(i)
                    };
                    let hint = if zero {
                        // The owner zeroes it first (like a deflated host-zeroed page).
                        mem.0.lock().unwrap().dirty[block.pfn.0 as usize..block.range().end().0 as usize].fill(false);
                        FreeHint::KnownZero
                    } else {
                        FreeHint::Dirty
                    };
                    mm.free(block, hint).unwrap();
                }
                Op::Flush { max_pages } => {
                    let r = engine.pass(&*mm, &mut dev, now, PassKind::Flush { max_pages });
                    prop_assert_eq!(r.stats.put_back_errors, 0);
                }
                Op::Tick { ms } => {
                    now += Duration::from_millis(ms);
                    engine.arm(&*mm, now);
                    if let Some(r) = engine.run_due(&*mm, &mut dev, now) {
                        prop_assert_eq!(r.stats.put_back_errors, 0);
                    }
                }
            }
            check_accounting(&mm, &live);
        }
        // Everything back: the whole range is free again, in whatever states.
        for b in std::mem::take(&mut *live.lock().unwrap()) {
            mm.free(b, FreeHint::Dirty).unwrap();
        }
        check_accounting(&mm, &live);
        // Every page the manager now calls known zero reads zero.
        for pfn in 0..PAGES {
            if let Some((b, s)) = mm.free_state_of(Pfn(pfn)) {
                prop_assert!(!s.known_zero || mem.reads_zero(b.range()), "{} claimed zero", b);
            }
        }
    }
}

/// The worker thread and two allocating threads at once; then everything is accounted for.
#[test]
fn worker_and_two_threads_never_break_a_rule() {
    let mem = FakeZeroer::new(PAGES, true);
    let mm = manager(&mem);
    let live: Live = Arc::default();
    let answers = vec![
        Answer::Zeroed,
        Answer::NotZeroed,
        Answer::Zeroed,
        Answer::Error,
        Answer::Zeroed,
    ];
    let dev = random_device(answers, &mem, &mm, &live);
    let log = dev.log();
    let cfg = ReportingConfig {
        delay: Duration::from_micros(200),
        ..config(BudgetPolicy::Linux)
    };
    let reporter = Reporter::start(Arc::clone(&mm), dev, cfg).unwrap();
    let notifier = reporter.notifier();
    let _ = mm.set_report_notifier(Box::new(move |_| notifier.freed(Order::new(3).unwrap())));
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (mm, mem, live, stop) = (&mm, &mem, &live, &stop);
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let order = Order::new((x % 6) as u8).unwrap();
                    let zeroed = x & 64 != 0;
                    if let Ok(a) = mm.alloc(order, AllocRequest { zeroed, hint: None }) {
                        take(live, mem, a.block, zeroed);
                    }
                    if x & 1 == 0 {
                        let b = {
                            let mut l = live.lock().unwrap();
                            let n = l.len();
                            (n > 0).then(|| l.swap_remove((x >> 8) as usize % n))
                        };
                        if let Some(b) = b {
                            mm.free(b, FreeHint::Dirty).unwrap();
                        }
                    }
                }
            });
        }
        // Churn until the worker has run 20 passes and something was reported (bounded
        // wait, no timing claim: on a loaded machine the churn can keep every block of
        // reporting order allocated for a while); user flushes race with them meanwhile.
        for i in 0..4000 {
            if reporter.stats().passes >= 20 && log.report_calls() > 0 {
                break;
            }
            if i % 4 == 0 {
                let r = reporter.flush(64);
                assert_eq!(r.stats.put_back_errors, 0);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let batches = log.report_calls();
    assert!(
        reporter.stats().passes >= 20,
        "the worker ran only {:?}",
        reporter.stats()
    );
    drop(reporter);
    check_accounting(&mm, &live);
    assert!(batches > 0, "nothing was reported");
}
