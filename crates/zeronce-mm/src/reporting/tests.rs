//! Engine tests against the real [`MemoryManager`] and a scripted device; time is a
//! parameter, nothing sleeps.

use super::*;
use crate::mock::{Answer, MockDevice};
use crate::{
    AllocRequest, FreeHint, FreeState, MemoryManager, MmConfig, NoopZeroer, Order, PageRange, Pfn,
    ZoneId,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 1024 pages, max order 4, reporting order 2: 64 free blocks of order 4, all dirty.
fn mm(watermark: u64) -> MemoryManager {
    let mut c = MmConfig::new(vec![PageRange::new(Pfn(0), 1024)]);
    c.max_order = Order::new(4).unwrap();
    c.reporting_order = Order::new(2).unwrap();
    c.low_watermark_pages = Some(watermark);
    MemoryManager::new(c, Arc::new(NoopZeroer)).unwrap()
}

fn cfg(capacity: usize, budget: BudgetPolicy) -> ReportingConfig {
    ReportingConfig {
        order: Order::new(2).unwrap(),
        capacity,
        delay: Duration::from_secs(2),
        budget,
        watermark_gate: true,
    }
}

/// A device of 1024 blocks per call answering `verdict`.
fn scripted(verdict: ZeroGuarantee) -> MockDevice<'static> {
    MockDevice::new(1024, verdict)
}

/// A fresh manager (no watermark), a scripted device and an engine.
fn setup(
    capacity: usize,
    budget: BudgetPolicy,
    verdict: ZeroGuarantee,
) -> (MemoryManager, MockDevice<'static>, ReportingEngine) {
    let dev = scripted(verdict);
    let e = ReportingEngine::new(cfg(capacity, budget), dev.capacity()).unwrap();
    (mm(0), dev, e)
}

/// A flush of at most `max_pages`, now.
fn flush(
    e: &ReportingEngine,
    m: &MemoryManager,
    dev: &mut impl ReportingDevice,
    max_pages: u64,
) -> PassReport {
    e.pass(m, dev, Instant::now(), PassKind::Flush { max_pages })
}

fn free_pages_in(m: &MemoryManager, state: FreeState) -> u64 {
    m.stats().free_pages.iter().map(|c| c.get(state)).sum()
}

#[test]
fn flush_reports_everything_and_zeroed_verdicts_make_known_zero() {
    let (m, mut dev, e) = setup(32, BudgetPolicy::Linux, ZeroGuarantee::Zeroed);
    let r = flush(&e, &m, &mut dev, u64::MAX);
    assert!(r.error.is_none());
    assert_eq!(r.stats.pages, 1024);
    assert_eq!(r.stats.calls, 2, "64 blocks in batches of 32");
    assert_eq!(free_pages_in(&m, FreeState::REPORTED_ZERO), 1024);
    m.check_invariants().unwrap();
    // Nothing left: a second flush reports nothing.
    let r = flush(&e, &m, &mut dev, u64::MAX);
    assert_eq!((r.stats.calls, r.stats.pages), (0, 0));
}

#[test]
fn flush_stops_at_its_page_limit_in_whole_blocks() {
    let (m, mut dev, e) = setup(32, BudgetPolicy::Linux, ZeroGuarantee::NotZeroed);
    let r = flush(&e, &m, &mut dev, 40);
    assert_eq!(r.stats.pages, 48, "40 pages round up to 3 blocks of 16");
    assert_eq!(free_pages_in(&m, FreeState::REPORTED_DIRTY), 48);
    assert_eq!(free_pages_in(&m, FreeState::DIRTY), 1024 - 48);
}

#[test]
fn an_error_puts_the_batch_back_unreported_and_stops_the_pass() {
    let (m, mut dev, e) = setup(8, BudgetPolicy::Unlimited, ZeroGuarantee::Zeroed);
    dev.push(Answer::Fail);
    let r = flush(&e, &m, &mut dev, u64::MAX);
    assert!(r.error.is_some());
    assert_eq!((r.stats.calls, r.stats.errors, r.stats.pages), (1, 1, 0));
    assert_eq!(
        free_pages_in(&m, FreeState::DIRTY),
        1024,
        "nothing lost, nothing reported"
    );
    assert_eq!(m.stats().isolated_pages, 0);
    m.check_invariants().unwrap();
}

#[test]
fn blocks_being_reported_cannot_be_allocated() {
    let m = Arc::new(mm(0));
    let mut overlaps = 0;
    let grabber = Arc::clone(&m);
    // Allocates everything still allocatable while the batch is out.
    let mut dev = MockDevice::new(32, ZeroGuarantee::Zeroed).on_report(|blocks, v| {
        while let Ok(a) = grabber.alloc(Order::new(2).unwrap(), AllocRequest::DIRTY) {
            overlaps += blocks
                .iter()
                .filter(|b| b.overlaps(&a.block.range()))
                .count();
        }
        v.fill(ZeroGuarantee::Zeroed);
        Ok(())
    });
    let e = ReportingEngine::new(cfg(4, BudgetPolicy::Unlimited), 32).unwrap();
    let r = flush(&e, &m, &mut dev, u64::MAX);
    drop(dev);
    assert_eq!(overlaps, 0);
    assert_eq!(
        r.stats.pages, 64,
        "the first batch of 4 order-4 blocks; the rest was taken"
    );
    m.check_invariants().unwrap();
}

#[test]
fn scheduled_pass_waits_for_the_delay_and_keeps_the_linux_budget() {
    // capacity 2: budget = ceil(64 / (2 * 16)) + 1 = 3 calls = 6 blocks per pass.
    let (m, mut dev, e) = setup(2, BudgetPolicy::Linux, ZeroGuarantee::Zeroed);
    let t0 = Instant::now();
    assert!(
        !e.notify_free(Order::new(1).unwrap()),
        "below the reporting order"
    );
    assert!(
        e.notify_free(Order::new(4).unwrap()),
        "IDLE → REQUESTED wakes"
    );
    assert!(!e.notify_free(Order::new(4).unwrap()));
    assert_eq!(
        e.next_wakeup(&dev),
        None,
        "not armed until the worker sees it"
    );
    e.arm(&m, t0);
    assert_eq!(e.next_wakeup(&dev), Some(t0 + Duration::from_secs(2)));
    assert!(e
        .run_due(&m, &mut dev, t0 + Duration::from_secs(1))
        .is_none());
    let r = e
        .run_due(&m, &mut dev, t0 + Duration::from_secs(2))
        .unwrap();
    assert_eq!(
        (r.stats.calls, r.stats.blocks, r.stats.budget_stops),
        (3, 6, 1)
    );
    // Budget spent → REQUESTED, next pass one delay later.
    assert_eq!(e.phase(), Phase::Requested);
    assert_eq!(e.next_wakeup(&dev), Some(t0 + Duration::from_secs(4)));
    let mut passes = 1;
    let mut now = t0 + Duration::from_secs(2);
    while e.phase() != Phase::Idle {
        now += Duration::from_secs(2);
        e.run_due(&m, &mut dev, now).unwrap();
        passes += 1;
        assert!(passes < 64);
    }
    assert_eq!(free_pages_in(&m, FreeState::REPORTED_ZERO), 1024);
    assert!(
        passes > 5,
        "Linux spreads reporting over many passes, got {passes}"
    );
    assert_eq!(e.next_wakeup(&dev), None);
    m.check_invariants().unwrap();
}

#[test]
fn adaptive_budget_lifts_only_when_nothing_reportable_was_allocated() {
    let run = |churn: bool| {
        let (m, mut dev, e) = setup(2, BudgetPolicy::Adaptive, ZeroGuarantee::Zeroed);
        let t0 = Instant::now();
        assert!(e.notify_free(Order::new(4).unwrap()));
        e.arm(&m, t0);
        if churn {
            let a = m
                .alloc(Order::new(2).unwrap(), AllocRequest::DIRTY)
                .unwrap();
            m.free(a.block, FreeHint::Dirty).unwrap();
        }
        e.run_due(&m, &mut dev, t0 + Duration::from_secs(2))
            .unwrap()
            .stats
            .blocks
    };
    assert_eq!(run(false), 64, "idle: everything in one pass");
    assert_eq!(run(true), 6, "churn: the Linux budget");
}

#[test]
fn a_zone_under_its_watermark_plus_one_batch_is_skipped() {
    // 1024 free pages: gated when low watermark + 2 blocks of order 2 (8 pages) > 1024.
    let m = mm(1024 - 8 + 1);
    let mut dev = scripted(ZeroGuarantee::Zeroed);
    let e = ReportingEngine::new(cfg(2, BudgetPolicy::Unlimited), dev.capacity()).unwrap();
    let r = flush(&e, &m, &mut dev, u64::MAX);
    assert_eq!((r.stats.gated_zones, r.stats.calls), (1, 0));
    let m = mm(1024 - 8);
    let r = flush(&e, &m, &mut dev, u64::MAX);
    assert_eq!((r.stats.gated_zones, r.stats.pages), (0, 1024));
}

#[test]
fn a_free_during_a_pass_reschedules_it() {
    let m = mm(0);
    let e = ReportingEngine::new(cfg(32, BudgetPolicy::Unlimited), 32).unwrap();
    let t0 = Instant::now();
    e.notify_free(Order::new(4).unwrap());
    e.arm(&m, t0);
    let mut dev = MockDevice::new(32, ZeroGuarantee::NotZeroed).on_report(|_, _| {
        assert!(
            !e.notify_free(Order::new(3).unwrap()),
            "ACTIVE: no wake needed"
        );
        Ok(())
    });
    e.run_due(&m, &mut dev, t0 + Duration::from_secs(2))
        .unwrap();
    assert_eq!(e.phase(), Phase::Requested);
    assert_eq!(e.next_wakeup(&dev), Some(t0 + Duration::from_secs(4)));
    assert_eq!(m.zone_info(ZoneId(0)).unwrap().isolated_pages, 0);
}

#[test]
fn allocation_takes_resident_blocks_before_reported_ones() {
    // Report half the memory (known zero), keep the other half resident and dirty.
    let (m, mut dev, e) = setup(32, BudgetPolicy::Linux, ZeroGuarantee::Zeroed);
    let r = flush(&e, &m, &mut dev, 512);
    assert_eq!(r.stats.pages, 512);
    let o2 = Order::new(2).unwrap();
    // A zero-request zeroes a resident dirty block rather than fault a reported one back
    // in; so does any other request; reported blocks come last.
    let a = m.alloc(o2, AllocRequest::ZEROED).unwrap();
    assert_eq!(a.prior, FreeState::DIRTY);
    let b = m.alloc(o2, AllocRequest::DIRTY).unwrap();
    assert_eq!(b.prior, FreeState::DIRTY);
    let mut priors = Vec::new();
    while let Ok(x) = m.alloc(o2, AllocRequest::ZEROED) {
        priors.push(x.prior);
    }
    let first_reported = priors.iter().position(|p| p.reported).unwrap();
    assert!(priors[..first_reported]
        .iter()
        .all(|p| *p == FreeState::DIRTY));
    assert!(priors[first_reported..]
        .iter()
        .all(|p| *p == FreeState::REPORTED_ZERO));
}

#[test]
fn a_reporter_refuses_an_order_it_could_never_report() {
    let m = Arc::new(mm(0));
    let c = ReportingConfig {
        order: Order::new(5).unwrap(),
        ..cfg(32, BudgetPolicy::Linux)
    };
    let err = Reporter::start(m, scripted(ZeroGuarantee::Zeroed), c).err();
    assert!(matches!(
        err,
        Some(ReportingConfigError::OrderAboveMax { .. })
    ));
}

#[test]
fn a_delay_too_long_for_the_clock_never_runs_and_never_panics() {
    // `Duration::MAX`: "only report on flush". `now + delay` would panic in the worker.
    let m = mm(0);
    let c = ReportingConfig {
        delay: Duration::MAX,
        ..cfg(32, BudgetPolicy::Linux)
    };
    let mut dev = scripted(ZeroGuarantee::Zeroed);
    let e = ReportingEngine::new(c, dev.capacity()).unwrap();
    let t0 = Instant::now();
    assert!(e.notify_free(Order::new(4).unwrap()));
    e.arm(&m, t0);
    assert_eq!(e.next_wakeup(&dev), None, "nothing to wake up for");
    assert!(e
        .run_due(&m, &mut dev, t0 + Duration::from_secs(1 << 40))
        .is_none());
    assert_eq!(flush(&e, &m, &mut dev, u64::MAX).stats.pages, 1024);
}

#[test]
fn a_device_that_panics_mid_report_loses_no_block() {
    let m = mm(0);
    let e = ReportingEngine::new(cfg(4, BudgetPolicy::Unlimited), 4).unwrap();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        flush(
            &e,
            &m,
            &mut MockDevice::new(4, ZeroGuarantee::Zeroed).otherwise(Answer::Panic),
            u64::MAX,
        )
    }));
    assert!(run.is_err());
    // The batch the device had went back unreported, as after a failed call.
    let info = m.zone_info(ZoneId(0)).unwrap();
    assert_eq!((info.isolated_pages, info.free_pages), (0, 1024));
    assert_eq!(free_pages_in(&m, FreeState::DIRTY), 1024);
    m.check_invariants().unwrap();
}

#[test]
fn a_settle_pass_offers_each_held_block_once_and_ends() {
    // Reported and held (not zero): more blocks than one call carries. A settle pass
    // where every hold is still running answers "not zero" for all of them; the blocks
    // put back must not be isolated again in the same pass (it never ended).
    let m = mm(0);
    let dev = MockDevice::new(4, ZeroGuarantee::NotZeroed);
    let (log, settled) = (dev.log(), dev.log());
    let mut dev = dev.on_settle(move |_, _| {
        assert!(log.settled().len() <= 1024, "the settle pass does not end");
        Ok(())
    });
    let e = ReportingEngine::new(cfg(4, BudgetPolicy::Unlimited), 4).unwrap();
    assert_eq!(flush(&e, &m, &mut dev, u64::MAX).stats.pages, 1024);
    assert_eq!(free_pages_in(&m, FreeState::REPORTED_DIRTY), 1024);
    let r = e.pass(&m, &mut dev, Instant::now(), PassKind::Settle);
    assert_eq!((r.stats.calls, r.stats.zeroed_pages), (16, 0));
    let mut offered = settled.settled();
    offered.sort_by_key(|b| b.start);
    offered.dedup();
    assert_eq!(offered.len(), 64, "each of the 64 held blocks offered once");
    assert_eq!(free_pages_in(&m, FreeState::REPORTED_DIRTY), 1024);
    // The settle pass is counted apart, so the reported pages are counted once.
    let st = e.stats();
    assert_eq!((st.total.pages, st.settled.pages), (2048, 1024));
    assert_eq!(st.total.pages - st.settled.pages, 1024);
    m.check_invariants().unwrap();
}
