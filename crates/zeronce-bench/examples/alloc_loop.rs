//! One allocator's loop of `zeronce bench alloc` on one thread, for instruction counts:
//! `alloc_loop front|bsa|manager ORDER BATCH ITERS` runs one warm-up iteration, then
//! ITERS iterations of BATCH allocations of ORDER followed by their frees, and prints
//! nanoseconds a pair. Under callgrind, count one allocator's loop with
//! `valgrind --tool=callgrind --toggle-collect='alloc_loop::front' alloc_loop front 9 64 200`
//! (instructions a pair = the total / (BATCH × (ITERS + 1))).
use buddy_system_allocator::FrameAllocator;
use std::hint::black_box;
use std::sync::Arc;
use zeronce::ProcessMemory;
use zeronce_mm::{
    AllocRequest, FreeHint, MemoryManager, MmConfig, NoopZeroer, Order, PageRange, Pfn, PAGE_SIZE,
};

const PAGES: u64 = 1 << 18;

#[inline(never)]
fn front(pm: &ProcessMemory, order: Order, batch: usize, iters: usize) {
    let mut v = Vec::with_capacity(batch);
    for _ in 0..iters {
        for _ in 0..batch {
            v.push(pm.alloc(order).unwrap());
        }
        for b in v.drain(..) {
            black_box(b).free().unwrap();
        }
    }
}

#[inline(never)]
fn bsa(fa: &mut FrameAllocator<11>, count: usize, batch: usize, iters: usize) {
    let mut v = Vec::with_capacity(batch);
    for _ in 0..iters {
        for _ in 0..batch {
            v.push(fa.alloc(count).unwrap());
        }
        for b in v.drain(..) {
            fa.dealloc(black_box(b), count);
        }
    }
}

#[inline(never)]
fn manager(mm: &MemoryManager, order: Order, batch: usize, iters: usize) {
    let mut v = Vec::with_capacity(batch);
    for _ in 0..iters {
        for _ in 0..batch {
            v.push(mm.alloc(order, AllocRequest::DIRTY).unwrap().block);
        }
        for b in v.drain(..) {
            mm.free(black_box(b), FreeHint::Dirty).unwrap();
        }
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let order = Order::new(a[2].parse().unwrap()).unwrap();
    let batch: usize = a[3].parse().unwrap();
    let iters: usize = a[4].parse().unwrap();
    // One warm-up iteration, then `iters` timed: nanoseconds a pair.
    let timed = |run: &mut dyn FnMut(usize)| {
        run(1);
        let t = std::time::Instant::now();
        run(iters);
        eprintln!(
            "{:.1} ns/pair",
            t.elapsed().as_nanos() as f64 / (batch * iters) as f64
        );
    };
    match a[1].as_str() {
        "front" => {
            let pm = ProcessMemory::builder()
                .size((PAGES * PAGE_SIZE) as usize)
                .no_reporting()
                .build()
                .unwrap();
            timed(&mut |n| front(&pm, order, batch, n));
        }
        "bsa" => {
            let mut fa = FrameAllocator::<11>::new();
            fa.add_frame(0, PAGES as usize);
            timed(&mut |n| bsa(&mut fa, order.pages() as usize, batch, n));
        }
        _ => {
            let mm = MemoryManager::new(
                MmConfig::new(vec![PageRange::new(Pfn(0), PAGES)]),
                Arc::new(NoopZeroer),
            )
            .unwrap();
            timed(&mut |n| manager(&mm, order, batch, n));
        }
    }
}
