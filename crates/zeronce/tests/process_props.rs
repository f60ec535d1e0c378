//! Property test on real memory: random allocations (zeroed or not), writes, frees,
//! flushes and settles, for each host policy, with verify mode on. Every zeroed block
//! reads zero, nothing is lost, and the manager's invariants hold after every step.

mod common;
use common::{reporting_setup, NEVER};

use proptest::prelude::*;
use std::time::Duration;
use zeronce::zeronce_mem::BackingKind;
use zeronce::{DiscardPolicy, Order, PageBlock, ProcessMemory, ReportingSetup};

const SIZE: usize = 16 << 20;

#[derive(Clone, Debug)]
enum Op {
    Alloc { order: u8, zeroed: bool, byte: u8 },
    Free(usize),
    Flush(u64),
    Settle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![Just(0u8), Just(3), Just(9), Just(10)], any::<bool>(), 1u8..).prop_map(|(order, zeroed, byte)| Op::Alloc { order, zeroed, byte }),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (1u64..8192).prop_map(Op::Flush),
        1 => Just(Op::Settle),
    ]
}

fn policy() -> impl Strategy<Value = DiscardPolicy> {
    prop_oneof![
        Just(DiscardPolicy::Immediate),
        Just(DiscardPolicy::Hold(Duration::ZERO)),
        Just(DiscardPolicy::Hold(Duration::from_secs(3600))),
        Just(DiscardPolicy::Lazy),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn process_memory_keeps_its_promises(ops in prop::collection::vec(op(), 1..40), policy in policy(), fresh in any::<bool>()) {
        let pm = ProcessMemory::builder()
            .size(SIZE)
            .backing(BackingKind::Anonymous { thp: true })
            .verify(true)
            .fresh_is_zero(fresh)
            .reporting(ReportingSetup {
                ..reporting_setup(policy, NEVER)
            })
            .build()
            .unwrap();
        let mut live: Vec<PageBlock> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { order, zeroed, byte } => {
                    let order = Order::new(order).unwrap();
                    let r = if zeroed { pm.alloc_zeroed(order) } else { pm.alloc(order) };
                    if let Ok(mut b) = r {
                        if zeroed {
                            prop_assert!(b.as_slice().iter().all(|&x| x == 0), "{} not zero", b.block());
                        }
                        b.as_mut_slice().fill(byte);
                        live.push(b);
                    }
                }
                Op::Free(i) => {
                    if !live.is_empty() {
                        let n = live.len();
                        live.swap_remove(i % n).free().unwrap();
                    }
                }
                Op::Flush(pages) => {
                    let r = pm.flush(pages);
                    prop_assert!(r.error.is_none() && r.stats.put_back_errors == 0);
                }
                Op::Settle => {
                    let r = pm.settle();
                    prop_assert!(r.error.is_none() && r.stats.put_back_errors == 0);
                }
            }
            pm.manager().check_invariants().unwrap();
            let s = pm.stats().mm;
            let owned: u64 = live.iter().map(|b| b.block().order.pages()).sum();
            prop_assert_eq!(s.allocated_pages, owned);
            // The background worker may hold a batch isolated right now (never lost).
            prop_assert_eq!(
                s.free_pages_total() + s.isolated_pages + owned,
                SIZE as u64 / 4096
            );
            prop_assert_eq!(s.verify_failures, 0);
        }
    }
}
