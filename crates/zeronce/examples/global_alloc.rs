//! A program that switches its global allocator to zeronce in two lines (the `use` and
//! the `static`): it checksums "files" read into fresh zeroed buffers, the pattern of a
//! decompressor or a hasher. Buffers of 2 MiB and more come from zeronce: freed ones are
//! zeroed in the background and handed out again without a memset, or given back to the
//! kernel after 2 s idle.
//!
//! `cargo run --release -p zeronce --example global_alloc -- [rounds] [MiB per buffer]`

use std::time::Instant;

use zeronce::{ProcessBackend, ZeronceAlloc};

#[global_allocator]
static GLOBAL: ZeronceAlloc<std::alloc::System> =
    ZeronceAlloc::new(std::alloc::System, ProcessBackend::new());

/// "Reads a file" of `len` bytes into a fresh zeroed buffer and returns its FNV-1a hash.
fn read_and_hash(seed: u64, len: usize) -> u64 {
    let mut buf = vec![0u8; len];
    // Fill like a read would: every byte written once.
    let mut x = seed.wrapping_mul(2).wrapping_add(1);
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    buf.chunks(8).fold(0xcbf2_9ce4_8422_2325, |h, c| {
        let word = c.iter().fold(0u64, |w, &b| w << 8 | u64::from(b));
        (h ^ word).wrapping_mul(0x100_0000_01b3)
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let start = Instant::now();
    let mut digest = 0u64;
    for r in 0..rounds {
        digest ^= read_and_hash(r, mib << 20);
    }
    let elapsed = start.elapsed();
    println!("{rounds} buffers of {mib} MiB in {elapsed:.2?}, digest {digest:016x}");
    if let Some(pm) = GLOBAL.large().memory() {
        let s = pm.stats();
        println!(
            "zeronce: {} zero-requests, {} skipped; zeroed {} MiB in the background, {} MiB on the allocation path",
            s.mm.zero_requests,
            s.mm.zero_requests_skipped,
            s.zeroing.background >> 20,
            s.zeroing.alloc_path >> 20,
        );
    }
}
