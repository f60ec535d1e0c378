//! The untouched tail of a block reused dirty for a size that is not a power of two is not
//! zeroed after the free: it was never written, so it still reads zero, and zeroing it
//! would only fault it in (a kernel clear of every page, then the zeroer's own stores).
//! Before, a block handed out dirty counted all of its pages written, and the zeroer
//! faulted in a 17 MiB buffer's 15 MiB tail at every free (a `malloc-large`-style loop ran
//! several times slower under the default lifecycle than with the zeroer off). Its own test
//! binary: nothing else allocates from the range while the test reads what is resident.

use std::alloc::System;
use std::time::Duration;

use zeronce::{CancelToken, ProcessBackend, ZeroerConfig, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<System> = ZeronceAlloc::new(
    System,
    ProcessBackend::new()
        .range_bytes(1 << 30)
        .zero_then_report(Duration::from_secs(60))
        // No zeroer thread: the test runs the zeroing pass itself, when it wants it.
        .zeroer(ZeroerConfig {
            threads: 0,
            nice: None,
            bytes_per_sec: None,
        }),
);

const MIB: usize = 1 << 20;

/// Bytes of `[addr, addr + len)` of the range held in memory.
fn resident(addr: usize, len: usize) -> usize {
    let pm = GLOBAL.large().memory().expect("the range exists");
    let offset = addr - pm.ram().base_addr();
    pm.ram().resident_bytes(offset, len).expect("mincore")
}

/// A 17 MiB buffer (a 32 MiB block), every page of it written.
fn written_buffer() -> Vec<u8> {
    let mut v = Vec::with_capacity(17 * MIB);
    v.resize(17 * MIB, 1u8);
    v
}

#[test]
fn the_zeroer_leaves_the_untouched_tail_of_a_dirty_reused_block_unbacked() {
    let first = written_buffer();
    let addr = first.as_ptr() as usize;
    drop(first);
    // Not zeroed yet (no zeroer thread): the dirty block just freed is the one to take.
    let second = written_buffer();
    assert_eq!(
        second.as_ptr() as usize,
        addr,
        "the test needs the second buffer to reuse the first one's block"
    );
    drop(second);
    let tail = (addr + 18 * MIB, 14 * MIB);
    assert_eq!(resident(tail.0, tail.1), 0, "nobody wrote the tail");
    let pm = GLOBAL.large().memory().expect("the range exists");
    let zeroed = pm.prezero(u64::MAX, &CancelToken::new());
    assert!(
        zeroed >= 17 * MIB as u64,
        "the pass zeroes the written part: {zeroed} bytes"
    );
    let after = resident(tail.0, tail.1);
    assert_eq!(
        after,
        0,
        "the zeroing pass faulted in {} KiB of the untouched tail",
        after >> 10
    );
    // And the block reads zero where it was written: a zeroed request skips the memset.
    let again = vec![0u8; 17 * MIB];
    assert_eq!(
        again.as_ptr() as usize,
        addr,
        "the zeroed block is taken again"
    );
    assert!(again.iter().all(|&b| b == 0));
}

#[test]
fn a_tail_written_after_a_grow_in_place_is_zeroed_before_a_zeroed_request_takes_it() {
    let first = written_buffer();
    let addr = first.as_ptr() as usize;
    drop(first);
    let mut grown = written_buffer();
    assert_eq!(
        grown.as_ptr() as usize,
        addr,
        "the dirty block is taken again"
    );
    // Within the 32 MiB block: grows in place, and the caller writes the grown part.
    grown.reserve_exact(13 * MIB);
    grown.resize(30 * MIB, 7u8);
    assert_eq!(grown.as_ptr() as usize, addr, "the realloc grew in place");
    drop(grown);
    let pm = GLOBAL.large().memory().expect("the range exists");
    pm.prezero(u64::MAX, &CancelToken::new());
    let zeroed = vec![0u8; 30 * MIB];
    assert_eq!(
        zeroed.as_ptr() as usize,
        addr,
        "the zeroed block is taken again"
    );
    let dirty = zeroed.iter().filter(|&&b| b != 0).count();
    assert_eq!(
        dirty, 0,
        "{dirty} bytes of a zeroed request did not read zero"
    );
}
