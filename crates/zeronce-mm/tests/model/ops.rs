//! The random operations and configurations the model test draws.

use proptest::prelude::*;
use zeronce_mm::{FreeState, ReportedNotZero};

/// One random step. Selectors (`u16`) pick among what exists at run time, modulo its count.
#[derive(Clone, Debug)]
pub enum Op {
    Alloc {
        via_cache: bool,
        order: u8,
        zeroed: bool,
        hint: u16,
        scribble: bool,
    },
    Free {
        via_cache: bool,
        pick: u16,
        known_zero: bool,
    },
    DoubleFree {
        via_cache: bool,
        pick: u16,
    },
    BadFree {
        via_cache: bool,
        pfn: u16,
        order: u8,
    },
    Drain,
    WrongShape {
        pick: u16,
        delta: u8,
    },
    Isolate {
        zone: u8,
        min_order: u8,
        max_blocks: u8,
        settle: bool,
    },
    PutBack {
        pick: u16,
        verdict: u8,
        honest: bool,
    },
    FreeIsolated {
        pick: u16,
    },
    Mark {
        start: u16,
        len: u16,
        honest: bool,
    },
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 0u8..7, any::<bool>(), any::<u16>(), any::<bool>())
            .prop_map(|(via_cache, order, zeroed, hint, scribble)| Op::Alloc { via_cache, order, zeroed, hint, scribble }),
        4 => (any::<bool>(), any::<u16>(), any::<bool>())
            .prop_map(|(via_cache, pick, known_zero)| Op::Free { via_cache, pick, known_zero }),
        1 => (any::<bool>(), any::<u16>()).prop_map(|(via_cache, pick)| Op::DoubleFree { via_cache, pick }),
        1 => (any::<bool>(), any::<u16>(), 0u8..8)
            .prop_map(|(via_cache, pfn, order)| Op::BadFree { via_cache, pfn, order }),
        1 => Just(Op::Drain),
        1 => (any::<u16>(), 1u8..4).prop_map(|(pick, delta)| Op::WrongShape { pick, delta }),
        2 => (0u8..3, 0u8..6, 1u8..6, prop::bool::weighted(0.25))
            .prop_map(|(zone, min_order, max_blocks, settle)| Op::Isolate { zone, min_order, max_blocks, settle }),
        2 => (any::<u16>(), 0u8..3, prop::bool::weighted(0.85))
            .prop_map(|(pick, verdict, honest)| Op::PutBack { pick, verdict, honest }),
        1 => any::<u16>().prop_map(|pick| Op::FreeIsolated { pick }),
        1 => (any::<u16>(), 1u16..64, prop::bool::weighted(0.7))
            .prop_map(|(start, len, honest)| Op::Mark { start, len, honest }),
    ]
}

/// A random configuration: zones as (gap before, pages), max order, initial state, what
/// backs reported blocks not known zero.
#[derive(Clone, Debug)]
pub struct Setup {
    pub zones: Vec<(u64, u64)>,
    pub max_order: u8,
    pub initial: FreeState,
    pub reported_not_zero: ReportedNotZero,
}

pub fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::collection::vec((0u64..9, 1u64..80), 1..=3),
        0u8..=5,
        prop::sample::select(FreeState::ALL.to_vec()),
        prop::sample::select(vec![ReportedNotZero::Discarded, ReportedNotZero::Resident]),
    )
        .prop_map(|(zones, max_order, initial, reported_not_zero)| Setup {
            zones,
            max_order,
            initial,
            reported_not_zero,
        })
}
