//! Helpers the integration tests of `zeronce` share (each test file uses some of them).
#![allow(dead_code)]

use std::time::Duration;

use zeronce::zeronce_mem::ProcessRss;
use zeronce::{DiscardPolicy, Order, ProcessMemory, ReportingConfig, ReportingSetup};

/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;

/// A reporting delay nobody waits for: the tests that use it flush by hand.
pub const NEVER: Duration = Duration::from_secs(3600);

/// The order `o` (valid in every test).
pub fn order(o: u8) -> Order {
    Order::new(o).unwrap()
}

/// Reporting after `delay`, without the watermark gate (the tests' RAM is under Linux's
/// low watermark plus one batch, 64 MiB).
pub fn reporting_config(delay: Duration) -> ReportingConfig {
    ReportingConfig {
        delay,
        watermark_gate: false,
        ..ReportingConfig::default()
    }
}

/// Process-mode reporting with `policy` after `delay` (see [`reporting_config`]), with
/// the host's zero hints.
pub fn reporting_setup(policy: DiscardPolicy, delay: Duration) -> ReportingSetup {
    ReportingSetup {
        config: reporting_config(delay),
        policy,
        ..ReportingSetup::default()
    }
}

/// `size` bytes of process memory without reporting, in verify mode.
pub fn plain(size: usize) -> ProcessMemory {
    ProcessMemory::builder()
        .size(size)
        .no_reporting()
        .verify(true)
        .build()
        .unwrap()
}

/// Polls `cond` every 5 ms, at most 20 s (bounded, no assertion on how long it took).
pub fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..4000 {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("never happened: {what}");
}

/// This process's anonymous resident bytes.
pub fn rss_anon() -> u64 {
    ProcessRss::read().expect("read /proc/self/status").anon
}
