//! A block reused for a size that is not a power of two keeps its resident tail while the
//! allocation is young (a buffer freed soon after would refault it at the next larger
//! size), and gives it back in whole huge pages once the allocation has lived for the hold
//! (a discard inside a huge page would split it). Its own test binary: nothing else
//! allocates from the range while the test reads what is resident.

use std::alloc::System;
use std::time::Duration;

use zeronce::{ProcessBackend, ZeronceAlloc};

const HOLD: Duration = Duration::from_millis(200);

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

#[test]
fn a_resident_tail_stays_while_young_and_goes_in_whole_huge_pages_after_the_hold() {
    let mut v = vec![0u8; 8 * MIB];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    let addr = v.as_ptr() as usize;
    assert_eq!(resident(addr, 8 * MIB), 8 * MIB, "all 8 MiB were touched");
    drop(v);
    // Not zeroed: the dirty block just freed is the one to take.
    let w: Vec<u8> = Vec::with_capacity(5 * MIB);
    assert_eq!(
        w.as_ptr() as usize,
        addr,
        "the test needs the 5 MiB request to reuse the 8 MiB block just freed"
    );
    let tail = resident(addr + 5 * MIB, 3 * MIB);
    assert_eq!(
        tail,
        3 * MIB,
        "the young allocation's tail was given back at once: {} KiB of 3 MiB resident",
        tail >> 10
    );
    std::thread::sleep(HOLD * 3);
    // The next large call after the hold gives the tails that are due back.
    drop(vec![0u8; 2 * MIB]);
    let past = resident(addr + 6 * MIB, 2 * MIB);
    assert_eq!(
        past,
        0,
        "the tail's whole huge page [6, 8) MiB stayed after the hold: {} KiB resident",
        past >> 10
    );
    let end = resident(addr + 4 * MIB, 2 * MIB);
    assert_eq!(
        end,
        2 * MIB,
        "the huge page holding the size's end, [4, 6) MiB, was cut: {} KiB resident",
        end >> 10
    );
    drop(w);
    // The part of that huge page past the size was never vouched zero: a zeroed buffer
    // over it reads zero.
    let z = vec![0u8; 8 * MIB];
    assert!(
        z.iter().all(|&b| b == 0),
        "a zeroed 8 MiB buffer reads zero"
    );
}

#[test]
fn a_shrink_in_place_gives_the_rest_back_at_once_in_whole_huge_pages() {
    let mut v = vec![7u8; 64 * MIB];
    let addr = v.as_ptr() as usize;
    assert_eq!(
        resident(addr, 64 * MIB),
        64 * MIB,
        "all 64 MiB were written"
    );
    v.truncate(3 * MIB);
    v.shrink_to_fit();
    assert_eq!(v.as_ptr() as usize, addr, "the shrink stayed in place");
    assert!(
        v.iter().step_by(4096).all(|&b| b == 7),
        "the kept part kept its data"
    );
    let rest = resident(addr + 4 * MIB, 60 * MIB);
    assert_eq!(
        rest,
        0,
        "past the huge page holding the new size, {} KiB of 60 MiB stayed resident",
        rest >> 10
    );
    assert_eq!(
        resident(addr, 4 * MIB),
        4 * MIB,
        "the used huge pages stay whole"
    );
    // Grown again in place, the given-back part reads zero until written.
    v.resize(32 * MIB, 0);
    assert!(v[3 * MIB..].iter().all(|&b| b == 0));
}
