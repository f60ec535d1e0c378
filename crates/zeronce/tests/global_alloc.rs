//! `ZeronceAlloc` as this test binary's global allocator: large allocations from zeronce,
//! small ones from `System`, zeroed ones read zero, `realloc` grows in place, threads,
//! sizes that are not powers of two cost their size in RSS.

mod common;
use common::rss_anon;

use std::alloc::{Layout, System};
use std::time::Duration;

use zeronce::{ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<System> = ZeronceAlloc::new(
    System,
    ProcessBackend::new()
        .range_bytes(1 << 30)
        .zero_then_report(Duration::from_millis(50)),
);

const MIB: usize = 1 << 20;

fn ours(p: *const u8) -> bool {
    use zeronce::zeronce_mem::LargeAlloc;
    GLOBAL.large().owns(p as usize)
}

#[test]
fn large_zeroed_vectors_come_from_zeronce_and_read_zero() {
    for round in 0..4 {
        let mut v = vec![0u8; 8 * MIB];
        assert!(ours(v.as_ptr()), "an 8 MiB vector is zeronce's");
        assert!(v.iter().all(|&b| b == 0), "round {round}");
        v.fill(0xAB);
        drop(v);
    }
    let small = vec![0u8; 64 * 1024];
    assert!(!ours(small.as_ptr()), "64 KiB goes to System");
    let pm = GLOBAL
        .large()
        .memory()
        .expect("created by the first large allocation");
    assert!(pm.stats().mm.zero_requests > 0);
}

#[test]
fn realloc_grows_in_place_and_keeps_contents() {
    // Each test runs in its own process: this is the first block, its buddies are free.
    let mut v: Vec<u8> = Vec::with_capacity(4 * MIB);
    v.resize(4 * MIB, 7);
    let p = v.as_ptr();
    assert!(ours(p));
    v.reserve_exact(12 * MIB);
    assert_eq!(v.as_ptr(), p, "grown in place");
    assert!(v.capacity() >= 16 * MIB);
    assert!(v.iter().step_by(4096).all(|&b| b == 7));
    v.resize(16 * MIB, 1);
    // Shrinking below the threshold moves it to System, contents kept.
    v.truncate(1000);
    v.shrink_to_fit();
    assert!(!ours(v.as_ptr()));
    assert!(v.iter().all(|&b| b == 7));
}

#[test]
fn a_grant_grows_in_place_when_its_upper_buddy_is_free() {
    let backend = GLOBAL.large();
    use zeronce::zeronce_mem::LargeAlloc;
    let layout = Layout::from_size_align(2 * MIB, 4096).unwrap();
    let g = backend.alloc(layout, false).expect("served");
    // Its buddy may be taken by another test's allocation: retry with fresh grants.
    let mut held = vec![g];
    let grown = loop {
        let last = *held.last().unwrap();
        if let Some(big) = backend.grow(last.addr(), 4 * MIB) {
            break big;
        }
        held.push(backend.alloc(layout, false).expect("served"));
        assert!(held.len() < 256, "no block ever had a free buddy");
    };
    assert_eq!(grown.addr(), held.last().unwrap().addr(), "grown in place");
    assert!(grown.len() >= 4 * MIB);
    for g in held {
        backend.dealloc(g.addr());
    }
}

#[test]
fn threads_allocate_and_free_concurrently() {
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                for i in 0..50usize {
                    let n = (2 + (i * 7 + t as usize) % 9) * MIB + 123;
                    let mut v = vec![0u8; n];
                    assert!(v.iter().step_by(4096).all(|&b| b == 0));
                    v[n - 1] = t;
                    v.fill(t + 1);
                    assert_eq!(v[n / 2], t + 1);
                }
            });
        }
    });
}

#[test]
fn a_size_that_is_not_a_power_of_two_costs_its_size_in_rss() {
    // 33 MiB rounds up to a 64 MiB block; only the 33 MiB written may be resident.
    let before = rss_anon();
    let mut v = vec![0u8; 33 * MIB];
    assert!(ours(v.as_ptr()));
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    let grew = rss_anon().saturating_sub(before);
    assert!(
        grew < 48 * MIB as u64,
        "RSS grew by {} MiB for 33 MiB",
        grew >> 20
    );
    drop(v);
}
