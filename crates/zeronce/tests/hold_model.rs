//! Hold policy against the real manager, the process device and the engine, time as a
//! parameter: random allocations (written to), dirty frees, flushes, settles and clock
//! ticks. Every zero-request reads zero (verify mode on) and, once everything is freed
//! and every hold is over, every page was discarded and is known zero (no block stays
//! held and resident for good, no settle pass loops).

use std::sync::Arc;
use std::time::{Duration, Instant};
use zeronce::zeronce_mem::{BackingKind, GuestRam, SharedRam};
use zeronce::zeronce_mm::reporting::{
    BudgetPolicy, PassKind, ReportingConfig, ReportingDevice, ReportingEngine,
};
use zeronce::zeronce_mm::{
    AllocError, AllocRequest, Block, FreeHint, FreeState, MemoryManager, MmConfig, Order,
    PageRange, Pfn,
};
use zeronce::{DiscardPolicy, ProcessDevice, RamZeroer};

const PAGES: u64 = 2048;

#[test]
fn hold_policy_is_truthful_and_every_hold_ends_in_a_discard() {
    let o = |n| Order::new(n).unwrap();
    for seed in 1..60u64 {
        let ram = SharedRam::new(
            GuestRam::new(
                (PAGES * 4096) as usize,
                BackingKind::Anonymous { thp: false },
            )
            .unwrap(),
        );
        let mut cfg = MmConfig::new(vec![PageRange::new(Pfn(0), PAGES)]);
        cfg.max_order = o(6);
        cfg.reporting_order = o(4);
        cfg.verify = true;
        cfg.initial_state = FreeState::REPORTED_ZERO;
        let mm = MemoryManager::new(cfg, Arc::new(RamZeroer::new(ram.clone()))).unwrap();
        let hold = DiscardPolicy::Hold(Duration::from_secs(10));
        let mut dev = ProcessDevice::new(ram.clone(), hold, true).unwrap();
        let rc = ReportingConfig {
            order: o(4),
            capacity: 4,
            delay: Duration::from_secs(2),
            budget: BudgetPolicy::Unlimited,
            watermark_gate: false,
        };
        let e = ReportingEngine::new(rc, dev.capacity()).unwrap();
        let mut now = Instant::now();
        let mut held: Vec<Block> = vec![];
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 6 {
                0 | 1 => {
                    let zeroed = x & (1 << 20) != 0;
                    let req = AllocRequest { zeroed, hint: None };
                    match mm.alloc(o(((x >> 8) % 7) as u8), req) {
                        Ok(a) => {
                            let b = a.block;
                            let mut r = ram
                                .claim(b.pfn.byte_offset() as usize, b.order.bytes() as usize)
                                .unwrap();
                            assert!(!zeroed || r.is_zero(), "seed {seed}: {a:?} not zero");
                            r.as_mut_slice()[0] = 7;
                            held.push(b);
                        }
                        Err(AllocError::OutOfMemory(_)) => {}
                        Err(err) => panic!("seed {seed}: {err}"),
                    }
                }
                2 if !held.is_empty() => {
                    let b = held.swap_remove((x >> 30) as usize % held.len());
                    mm.free(b, FreeHint::Dirty).unwrap();
                }
                3 => {
                    let kind = PassKind::Flush {
                        max_pages: (x >> 12) % 512,
                    };
                    assert_eq!(e.pass(&mm, &mut dev, now, kind).stats.put_back_errors, 0);
                }
                4 if dev.hold_expiry().is_some_and(|t| t <= now) => {
                    let r = e.pass(&mm, &mut dev, now, PassKind::Settle);
                    assert_eq!(r.stats.put_back_errors, 0, "seed {seed}");
                }
                _ => now += Duration::from_secs((x >> 40) % 7),
            }
        }
        for b in held.drain(..) {
            mm.free(b, FreeHint::Dirty).unwrap();
        }
        let flush = PassKind::Flush {
            max_pages: u64::MAX,
        };
        assert_eq!(e.pass(&mm, &mut dev, now, flush).stats.put_back_errors, 0);
        for _ in 0..3 {
            now += Duration::from_secs(11);
            if dev.hold_expiry().is_some_and(|t| t <= now) {
                e.pass(&mm, &mut dev, now, PassKind::Settle);
            }
        }
        mm.check_invariants().unwrap();
        let s = mm.stats();
        assert_eq!(s.verify_failures, 0, "seed {seed}");
        let zero: u64 = s.free_pages.iter().map(|c| c.reported_zero).sum();
        assert_eq!(zero, PAGES, "seed {seed}: {:?}", dev.stats());
        assert_eq!(dev.stats().held_bytes, 0, "seed {seed}");
    }
}
