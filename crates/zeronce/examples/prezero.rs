//! Background pre-zeroing as in the hugetlb pre-zeroing series' pseudocode: a worker thread at low
//! priority waits on the pool's eventfd and zeroes whatever became zeroable; the main
//! thread frees dirty pages and later allocates zeroed ones without zeroing them.
//!
//! `cargo run --release -p zeronce --example prezero`
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use zeronce::{CancelToken, HugePagePool};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = Arc::new(
        HugePagePool::builder()
            .pages(64) // 128 MiB of 2 MiB pages (anonymous THP)
            .min_event_interval(Duration::from_millis(20))
            .build()?,
    );
    let stop = CancelToken::new();

    let worker = {
        let (pool, stop) = (Arc::clone(&pool), stop.clone());
        std::thread::spawn(move || -> u64 {
            // Only this thread: on Linux the nice value is per thread. Placement (e.g.
            // sched_setaffinity) and cgroup would be set here the same way.
            if let Err(e) = rustix::process::setpriority_process(None, 19) {
                eprintln!("worker: could not lower priority: {e}");
            }
            let mut zeroed = 0;
            let tick = Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            while !stop.is_cancelled() {
                // epoll_wait in the hugetlb pre-zeroing series; poll here (the fd goes into any event loop).
                let mut fds = [PollFd::new(&*pool, PollFlags::IN)];
                if matches!(poll(&mut fds, Some(&tick)), Ok(n) if n > 0) {
                    pool.take_notifications();
                    // "echo max > zeroable_hugepages", interruptible between pages.
                    let report = pool.prezero(u64::MAX, &stop);
                    zeroed += report.pages;
                    if report.pages == 0 {
                        continue;
                    }
                    println!(
                        "worker: pre-zeroed {} pages at {:.1} GB/s, {} left",
                        report.pages,
                        report.gb_per_s(),
                        report.zeroable_left
                    );
                }
            }
            zeroed
        })
    };

    // The application: use every page, write it, give it back dirty.
    let pages: Vec<_> = (0..64)
        .map(|_| pool.alloc(false))
        .collect::<Result<_, _>>()?;
    for mut page in pages {
        page.as_mut_slice().fill(0x5a);
        page.free()?;
    }
    println!(
        "main: freed 64 dirty pages; zeroable now {}",
        pool.zeroable_total()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.zeroable_total() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }

    // Later, a "VM start": every page zeroed, none zeroed on this path.
    let start = Instant::now();
    let mut pages: Vec<_> = (0..64)
        .map(|_| pool.alloc(true))
        .collect::<Result<_, _>>()?;
    for page in &mut pages {
        page.touch(4096);
    }
    let took = start.elapsed();
    let c = pool.counters();
    println!(
        "main: 64 zeroed pages in {:.2} ms ({} pre-zeroed, {} zeroed inline)",
        took.as_secs_f64() * 1e3,
        c.allocs_prezeroed,
        c.allocs_zeroed_inline
    );
    drop(pages);
    stop.cancel();
    println!(
        "worker: {} pages pre-zeroed in total",
        worker.join().unwrap_or(0)
    );
    Ok(())
}
