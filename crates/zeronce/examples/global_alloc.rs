//! A program that switches its global allocator to zeronce in two lines (the `use` and
//! the `static`): it checksums "files" read into fresh zeroed buffers, the pattern of a
//! decompressor or a hasher. Buffers of 2 MiB and more come from zeronce.
//!
//! It runs the files twice and prints zeronce's counters for each run:
//! - back to back: each buffer is freed and the next one asked for at once. The block
//!   just freed is the one handed out again (resident memory is preferred over fresh
//!   pages, whose first touch faults them in and has the kernel zero them), and the
//!   background zeroer has had no time to reach it: the allocation zeroes it itself, a
//!   memset of resident memory. Only the first buffer, fresh memory, skips it (and any
//!   chunk the zeroer reached before the allocation did).
//! - with a pause after each free (standing for the program's other work): the background
//!   zeroer (one thread at nice 10) zeroes the freed block meanwhile, and the next
//!   `vec![0u8; n]` skips the memset and the faults. (The first file of this run follows
//!   the last free of the previous one at once, and is zeroed on the allocation path.)
//!   On a machine whose cores are busy the nice-10 zeroer may not get the CPU in time;
//!   the counters say what happened.
//!
//! `cargo run --release -p zeronce --example global_alloc -- [files] [MiB per file] [pause ms]`

use std::time::{Duration, Instant};

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

/// zeronce's counters that this example reports, in MiB. A zero-request skips the memset
/// of what is known zero: whole blocks the allocator knows zero (`known_zero`), or the
/// 2 MiB chunks of a block that the background zeroer zeroed after the block merged with
/// untouched neighbours (`zeroed_before`: the allocator then thinks the merged block
/// dirty, the zero map knows better).
#[derive(Clone, Copy, Default)]
struct Counters {
    zero_requests: u64,
    known_zero: u64,
    zeroed_before: u64,
    background: u64,
    alloc_path: u64,
}

fn counters() -> Counters {
    GLOBAL
        .large()
        .memory()
        .map_or_else(Counters::default, |pm| {
            let s = pm.stats();
            Counters {
                zero_requests: s.mm.zero_requests,
                // The manager's skipped bytes include what the zero map knew.
                known_zero: s
                    .mm
                    .bytes_zeroing_skipped
                    .saturating_sub(s.zeroing.skipped_by_map)
                    >> 20,
                zeroed_before: s.zeroing.skipped_by_map >> 20,
                background: s.zeroing.background >> 20,
                alloc_path: s.zeroing.alloc_path >> 20,
            }
        })
}

/// Hashes `files` files of `mib` MiB, pausing `pause` after each; prints the counters
/// of this run.
fn run(name: &str, files: u64, mib: usize, pause: Duration) -> u64 {
    let before = counters();
    let start = Instant::now();
    let mut digest = 0u64;
    for r in 0..files {
        digest ^= read_and_hash(r, mib << 20);
        std::thread::sleep(pause);
    }
    let elapsed = start.elapsed();
    let c = counters();
    println!(
        "{name}: {files} files of {mib} MiB in {elapsed:.2?} ({pause:?} pause each); \
         {} zero-requests: memset on the allocation path {} MiB, skipped {} MiB (known \
         zero {} MiB, zeroed in the background before {} MiB); the background zeroer \
         zeroed {} MiB",
        c.zero_requests - before.zero_requests,
        c.alloc_path - before.alloc_path,
        (c.known_zero - before.known_zero) + (c.zeroed_before - before.zeroed_before),
        c.known_zero - before.known_zero,
        c.zeroed_before - before.zeroed_before,
        c.background - before.background,
    );
    digest
}

fn main() {
    let mut args = std::env::args().skip(1);
    let files: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let pause_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let a = run("back to back", files, mib, Duration::ZERO);
    let b = run("with pauses ", files, mib, Duration::from_millis(pause_ms));
    assert_eq!(a, b, "the same files hash the same");
    println!("digest {a:016x}");
}
