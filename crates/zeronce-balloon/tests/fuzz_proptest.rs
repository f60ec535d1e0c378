//! The fuzz target's logic (`zeronce_balloon::fuzzing::run`, also driven by
//! `fuzz/fuzz_targets/queue_handlers.rs`) under proptest, bounded for CI: a fixed number
//! of cases of random bytes, plus structured inputs that steer towards deep paths.

use proptest::prelude::*;
use zeronce_balloon::fuzzing::{run, FuzzOutcome};

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        max_shrink_iters: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Arbitrary bytes: the harness must not panic (its invariants hold).
    #[test]
    fn random_bytes(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        run(&data);
    }

    /// Bytes built from op codes that add chains and notify, so most cases reach the
    /// queue handlers instead of ending in config accesses.
    #[test]
    fn chains_then_notifications(
        head in proptest::collection::vec(any::<u8>(), 4..6),
        ops in proptest::collection::vec((0u8..3, proptest::collection::vec(any::<u8>(), 24)), 1..40),
    ) {
        let mut data = head;
        data[3] |= 0x3f; // ack most features
        for (op, arg) in ops {
            // 0 → add chain, 3 → notify, 1 → raw descriptor.
            data.push([0u8, 3, 1][usize::from(op)]);
            data.extend(arg);
        }
        run(&data);
    }
}

#[test]
fn structured_inputs_reach_the_handlers() {
    // Not vacuous: a hand-made input pops chains and discards something.
    let mut data = vec![0u8, 0, 0, 0x3f];
    for q in 0..4u8 {
        // add chain on queue q: 1 writable buffer inside region 1 of 8 KiB
        data.extend([0, q, 0, 4, 0, 0, 2, 1, 1]);
        data.extend([3, q]);
    }
    let out: FuzzOutcome = run(&data);
    assert!(out.chains >= 1, "{out:?}");
    assert!(out.notifications >= 4, "{out:?}");
}

#[test]
fn random_inputs_are_not_vacuous() {
    // A fixed pseudo-random stream: across 200 inputs the handlers must pop chains,
    // refuse malformed ones and perform discards.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut total = FuzzOutcome::default();
    for _ in 0..200 {
        let data: Vec<u8> = (0..1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let o = run(&data);
        total.chains += o.chains;
        total.malformed += o.malformed;
        total.discards += o.discards;
        total.notifications += o.notifications;
    }
    eprintln!("200 random inputs: {total:?}");
    assert!(
        total.chains > 50 && total.malformed > 10 && total.discards > 0,
        "{total:?}"
    );
}
