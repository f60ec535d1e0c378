//! The reporting worker's health: it survives a device that panics (restart with
//! back-off), says so, and surfaces every false "zeroed" verify mode catches.

mod common;

use common::{manager, o};
use std::sync::Arc;
use std::time::Duration;
use zeronce_mm::mock::{Answer, MockDevice};
use zeronce_mm::reporting::{BudgetPolicy, Reporter, ReportingConfig, ZeroGuarantee};
use zeronce_mm::{AllocRequest, FreeHint};

fn config() -> ReportingConfig {
    ReportingConfig {
        order: o(2),
        capacity: 4,
        delay: Duration::from_millis(1),
        budget: BudgetPolicy::Unlimited,
        watermark_gate: false,
    }
}

#[test]
fn the_worker_survives_device_panics_and_says_so() {
    let (mm, _mem) = manager(256, 4, false);
    let mm = Arc::new(mm);
    // Panics in its first two calls, then answers "not zeroed".
    let dev = MockDevice::new(4, ZeroGuarantee::NotZeroed).then([Answer::Panic, Answer::Panic]);
    let reporter = Reporter::start(Arc::clone(&mm), dev, config()).unwrap();
    // Wait (bounded, no timing claim) until the worker got past both panics.
    for _ in 0..1000 {
        if reporter.stats().total.blocks > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let h = reporter.health();
    assert!(h.worker_alive, "{h:?}");
    assert_eq!(h.panics, 2, "{h:?}");
    assert!(h
        .last_panic
        .as_deref()
        .unwrap_or("")
        .contains("device panic 1"));
    assert!(
        reporter.stats().total.blocks > 0,
        "reporting resumed after the panics: {h:?}"
    );
    drop(reporter);
    mm.check_invariants().unwrap();
    assert_eq!(mm.stats().isolated_pages, 0, "no block lost");
    assert_eq!(mm.stats().free_pages_total(), 256);
}

#[test]
fn every_caught_lie_is_in_the_report_and_the_health() {
    // Verify mode; the memory is dirty and the device answers "zeroed" without zeroing.
    let (mm, _mem) = manager(256, 4, true);
    let mm = Arc::new(mm);
    // Keep one page allocated so the rest cannot merge into one block.
    let _a = mm.alloc(o(0), AllocRequest::DIRTY).unwrap();
    // Answers "zeroed" without zeroing.
    let dev = MockDevice::new(4, ZeroGuarantee::Zeroed);
    let cfg = ReportingConfig {
        delay: Duration::from_secs(3600),
        ..config()
    };
    let reporter = Reporter::start(Arc::clone(&mm), dev, cfg).unwrap();
    let r = reporter.flush(u64::MAX);
    assert!(r.stats.blocks > 1, "{r:?}");
    assert_eq!(r.put_back_errors.len() as u64, r.stats.blocks, "every lie");
    assert_eq!(reporter.health().lies_caught, r.stats.blocks);
    let s = mm.stats();
    assert_eq!(s.verify_failures, r.stats.blocks);
    mm.free(_a.block, FreeHint::Dirty).unwrap();
    mm.check_invariants().unwrap();
}
