//! The fuzz target's logic (`zeronce_balloon::fuzzing::run`, also driven by
//! `fuzz/fuzz_targets/queue_handlers.rs`) under proptest, bounded for CI: a fixed number
//! of cases of random bytes, plus structured inputs that steer towards deep paths.

use proptest::prelude::*;
use zeronce_balloon::fuzzing::{run, FuzzOutcome};
use zeronce_balloon::MalformedKind;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        max_shrink_iters: 2000,
        failure_persistence: None,
        // A fixed stream in CI, so a run is reproducible; cargo-fuzz (RELIABILITY.md) is
        // where new inputs are searched for.
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x2026_1130),
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

/// An input that once failed the harness (a file of `tests/fuzz_regressions/`): it must
/// now run clean. Both were oracle bugs, found by random proptest seeds and shrunk.
fn replay(name: &str) {
    let path = format!(
        "{}/tests/fuzz_regressions/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    run(&data);
}

/// A held inflate (hold policy) whose head the guest publishes again with another
/// request on PFN 0 (a ring page): the device refuses the second as in flight and later
/// completes the held one, bit 0 set for its own PFN. The oracle had recorded the second
/// request's promise for the head and checked it against the held one's bitmap
/// ("inflate bit 0 promised PFN 0x0 zero; it is not"). A promise is now recorded only
/// when the head had no pop outstanding and this notification popped it once.
#[test]
fn regression_a_republished_held_head_keeps_the_held_promise() {
    replay("republished_held_head.bin");
}

/// The guest moves `avail.idx` far ahead and then back behind the ring's old end: the
/// device pops stale entries (head 0 twice, one refused as in flight) that the oracle,
/// counting availabilities when the guest wrote them, had never counted ("descriptor 0
/// returned more often than it was made available"). Availabilities are now counted
/// when the device reads the entry.
#[test]
fn regression_avail_idx_moved_back_over_stale_entries() {
    replay("avail_idx_back_over_stale_entries.bin");
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

/// The fixed pseudo-random stream of inputs the non-vacuity checks use.
fn stream(n: usize, len: usize) -> impl Iterator<Item = Vec<u8>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n).map(move |_| {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

/// Classes of the hardening rounds an input can be made to reach, and how a run shows it.
fn reaches(o: &FuzzOutcome) -> Vec<&'static str> {
    let k = |kind: MalformedKind| o.kinds[kind.index()] > 0;
    let mut v = Vec::new();
    for (name, hit) in [
        ("invalid_head", k(MalformedKind::InvalidHead)),
        ("descriptor_in_flight", k(MalformedKind::DescriptorInFlight)),
        ("discard_overlap", k(MalformedKind::DiscardOverlap)),
        ("indirect", k(MalformedKind::IndirectDescriptor)),
        ("stats_overflow", k(MalformedKind::StatsOverflow)),
        ("more_than_a_queue", o.more > 0),
        ("zero_promise", o.promises_checked > 0),
        ("mutation_during_call", o.mutations > 0),
        ("hint_discard", o.pages_hinted > 0),
        ("hint_command_id", k(MalformedKind::HintCommandId)),
    ] {
        if hit {
            v.push(name);
        }
    }
    v
}

/// The guest rewrites descriptors and buffers (PFN arrays, statistics words) while the
/// device reads them: in the fixed stream such writes land, every invariant still holds
/// (the oracle checks each promise against the PFN the device read, old or new), and
/// promises are still checked on those runs.
#[test]
fn guest_rewrites_during_calls_are_exercised() {
    let (mut mutations, mut checked) = (0, 0);
    for data in stream(400, 1024) {
        let o = run(&data);
        if o.mutations > 0 {
            mutations += o.mutations;
            checked += o.promises_checked;
        }
    }
    eprintln!("mutations applied: {mutations}, promises checked on those runs: {checked}");
    assert!(mutations > 20, "{mutations} mutations applied");
    assert!(checked > 0, "no promise checked in a run with mutations");
}

#[test]
fn random_inputs_are_not_vacuous() {
    // A fixed pseudo-random stream: across 400 inputs the handlers must pop chains,
    // refuse malformed ones, perform discards, check zero promises against memory, and
    // reach every class the harness detects. With ZERONCE_FUZZ_SEEDS=<dir> the first
    // input reaching each class is written there (the cargo-fuzz seed corpus).
    let mut total = FuzzOutcome::default();
    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();
    for data in stream(400, 1024) {
        let o = run(&data);
        for class in reaches(&o) {
            if !seeds.iter().any(|(c, _)| *c == class) {
                seeds.push((class, data.clone()));
            }
        }
        total.chains += o.chains;
        total.malformed += o.malformed;
        total.discards += o.discards;
        total.notifications += o.notifications;
        total.promises_checked += o.promises_checked;
        total.more += o.more;
        total.mutations += o.mutations;
    }
    eprintln!("400 random inputs: {total:?}");
    let found: Vec<&str> = seeds.iter().map(|(c, _)| *c).collect();
    eprintln!("classes reached: {found:?}");
    assert!(
        total.chains > 50 && total.malformed > 10 && total.discards > 0,
        "{total:?}"
    );
    assert!(total.promises_checked > 0, "{total:?}");
    for class in [
        "invalid_head",
        "descriptor_in_flight",
        "indirect",
        "more_than_a_queue",
        "mutation_during_call",
        "hint_discard",
        "hint_command_id",
    ] {
        assert!(found.contains(&class), "{class} never reached: {found:?}");
    }
    if let Ok(dir) = std::env::var("ZERONCE_FUZZ_SEEDS") {
        for (class, data) in &seeds {
            std::fs::write(format!("{dir}/{class}"), data).expect("write seed");
        }
    }
}
