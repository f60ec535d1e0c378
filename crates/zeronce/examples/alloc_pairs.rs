//! The loop `zeronce bench alloc` times through the front door, alone in a process, for
//! counting what one alloc+free pair of 2 MiB blocks costs with `valgrind --tool=callgrind`
//! or `perf` (the bench's figures are times against `buddy_system_allocator`; this is for
//! looking inside them). Batches of `BATCH` blocks of order 9 are allocated, then freed in
//! the order they came, `ITERS` times, on a 1 GiB `ProcessMemory` without reporting. A
//! batch of 8 stays within a thread's kept blocks; one of 64 goes past them (refills and
//! drains of eight blocks at a time).
//!
//! ```text
//! cargo build --release -p zeronce --example alloc_pairs
//! valgrind --tool=callgrind target/release/examples/alloc_pairs 64 5000
//! ```
//!
//! Instructions a pair = the total over `BATCH * ITERS` (the setup is ~0.6 M
//! instructions; `alloc_pairs 64 1` shows it).

use zeronce::{Order, ProcessMemory};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(match std::env::args().nth(i) {
            Some(s) => s.parse()?,
            None => default,
        })
    };
    let (batch, iters) = (arg(1, 64)?, arg(2, 5000)?);
    let pm = ProcessMemory::builder()
        .size(1 << 30)
        .no_reporting()
        .build()?;
    let order = Order::new(9)?;
    let mut blocks = Vec::with_capacity(batch);
    let start = std::time::Instant::now();
    for _ in 0..iters {
        for _ in 0..batch {
            blocks.push(pm.alloc(order)?);
        }
        for b in blocks.drain(..) {
            b.free()?;
        }
    }
    let pairs = (batch * iters).max(1);
    println!(
        "{pairs} pairs of 2 MiB blocks in batches of {batch}: {:.1} ns a pair",
        start.elapsed().as_nanos() as f64 / pairs as f64
    );
    Ok(())
}
