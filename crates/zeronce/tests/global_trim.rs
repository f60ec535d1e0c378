//! `ProcessBackend::trim` (what `malloc_trim` calls): a freed block and a young live
//! block's resident tail go back to the kernel at once, without waiting for the hold, and
//! both read zero when handed out again. Its own test binary: nothing else allocates from
//! the range while the test reads what is resident.

use std::alloc::System;
use std::time::Duration;

use zeronce::{ProcessBackend, ZeronceAlloc};

/// Long enough that nothing goes back by itself while the test runs.
const HOLD: Duration = Duration::from_secs(600);

#[global_allocator]
static GLOBAL: ZeronceAlloc<System> = ZeronceAlloc::new(
    System,
    ProcessBackend::new()
        .range_bytes(1 << 30)
        .zero_then_report(HOLD),
);

const MIB: usize = 1 << 20;

/// Bytes of `[addr, addr + len)` of the range held in memory.
fn resident(addr: usize, len: usize) -> usize {
    let pm = GLOBAL.large().memory().expect("the range exists");
    let offset = addr - pm.ram().base_addr();
    pm.ram().resident_bytes(offset, len).expect("mincore")
}

fn touched(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    v
}

#[test]
fn trim_gives_a_freed_block_and_a_young_tail_back_at_once() {
    assert!(!GLOBAL.large().trim(), "nothing to trim before the arena");
    // The block to free, and one whose 8 MiB block is reused for 5 MiB (a resident tail).
    let freed = touched(16 * MIB);
    let (freed_addr, freed_len) = (freed.as_ptr() as usize, freed.len());
    let reused = touched(8 * MIB);
    let tail_addr = reused.as_ptr() as usize;
    drop(reused);
    let young: Vec<u8> = Vec::with_capacity(5 * MIB);
    assert_eq!(
        young.as_ptr() as usize,
        tail_addr,
        "the test needs the 5 MiB request to reuse the 8 MiB block just freed"
    );
    drop(freed);
    assert_eq!(
        resident(freed_addr, freed_len),
        freed_len,
        "held for {HOLD:?}"
    );
    assert_eq!(resident(tail_addr + 6 * MIB, 2 * MIB), 2 * MIB);

    assert!(GLOBAL.large().trim(), "trim gave something back");
    assert_eq!(
        resident(freed_addr, freed_len),
        0,
        "the freed block went back"
    );
    assert_eq!(
        resident(tail_addr + 6 * MIB, 2 * MIB),
        0,
        "the young tail's whole huge page went back"
    );
    assert_eq!(
        resident(tail_addr + 4 * MIB, 2 * MIB),
        2 * MIB,
        "the huge page holding the size's end stays"
    );
    // A second trim finds nothing more.
    assert!(!GLOBAL.large().trim(), "nothing left to trim");
    drop(young);
    // What went back reads zero when handed out again.
    let z = vec![0u8; 16 * MIB];
    assert!(z.iter().all(|&b| b == 0));
}
