//! Process mode in a few lines: 1 GiB of THP-backed memory whose freed blocks go back to
//! the kernel and come back known zero.
//!
//! `cargo run --release -p zeronce --example process_mode`

use zeronce::{Order, ProcessMemory, ReportingSetup};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pm = ProcessMemory::builder()
        .size(1 << 30)
        .reporting(ReportingSetup::default())
        .build()?;
    let order = Order::new(9)?; // 2 MiB blocks

    // A working set of 256 MiB, written.
    let mut blocks = Vec::new();
    for _ in 0..128 {
        let mut b = pm.alloc(order)?;
        b.as_mut_slice().fill(0x5A);
        blocks.push(b);
    }
    println!(
        "written:   RSS of the RAM {:>5} MiB",
        pm.resident_bytes() >> 20
    );

    // Freed: reported after the delay (2 s), or right now with flush.
    drop(blocks);
    let report = pm.flush(u64::MAX);
    println!(
        "flushed:   RSS of the RAM {:>5} MiB ({} MiB reported, {} MiB known zero)",
        pm.resident_bytes() >> 20,
        (report.stats.pages * 4096) >> 20,
        (report.stats.zeroed_pages * 4096) >> 20,
    );

    // Zeroed blocks again: the host zeroed them, so the allocator writes nothing.
    let again: Vec<_> = (0..128)
        .map(|_| pm.alloc_zeroed(order))
        .collect::<Result<_, _>>()?;
    let skipped = again
        .iter()
        .filter(|b| b.allocation().zeroing == zeronce::zeronce_mm::Zeroing::Skipped);
    println!(
        "allocated: {} of {} zeroed blocks needed no zeroing",
        skipped.count(),
        again.len()
    );
    let s = pm.stats();
    println!(
        "stats:     {} MiB zeroed by the allocator, {} MiB zeroing skipped",
        s.mm.bytes_zeroed >> 20,
        s.mm.bytes_zeroing_skipped >> 20
    );
    Ok(())
}
