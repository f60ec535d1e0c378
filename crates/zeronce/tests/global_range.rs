//! The default `ZeronceAlloc` reserves tens of GiB of address space, and that costs
//! nothing until used: creating its `ProcessMemory` (range, frame table, claim map,
//! threads) adds almost nothing to `RssAnon`. Its own test binary, so that the first large
//! allocation here is the one that creates the arena.

mod common;
use common::{rss_anon, MIB};

use std::alloc::System;

use zeronce::{ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<System> = ZeronceAlloc::new(System, ProcessBackend::new());

#[test]
fn an_empty_allocator_over_64_gib_costs_next_to_no_rss() {
    assert!(GLOBAL.large().memory().is_none(), "not created yet");
    let before = rss_anon();
    // The first allocation over the threshold creates the arena; a capacity is never
    // written, so the block itself adds no RSS.
    let v: Vec<u8> = Vec::with_capacity(2 << 20);
    let after = rss_anon();
    let pm = GLOBAL
        .large()
        .memory()
        .expect("created by the first large allocation");
    assert_eq!(pm.ram().len(), 64 << 30, "the default range");
    let delta = after.saturating_sub(before);
    println!("RssAnon {before} -> {after} bytes: +{delta} for a 64 GiB range");
    assert!(
        delta < 4 * MIB,
        "creating the allocator over 64 GiB cost {} KiB of RssAnon (its frame table alone \
         would be 192 MiB if it were backed)",
        delta >> 10
    );
    drop(v);
}
