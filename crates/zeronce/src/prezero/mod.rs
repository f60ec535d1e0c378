//! Huge-page pool with user-controlled pre-zeroing (docs/ARCHITECTURE.md §6, the hugetlb pre-zeroing series) over real
//! memory of this process.
//!
//! A [`HugePagePool`] maps its pages in one [`GuestRam`] — anonymous THP, a memfd, or a
//! hugetlb memfd when huge pages are reserved (a clear [`zeronce_mem::RamError::NoHugePages`]
//! otherwise) — and keeps the pure [`HugePool`] state (which page is free, known zero,
//! in use, being zeroed) behind a mutex. It owns its pages outright, like the kernel's
//! hugetlb pool: a standalone pool, not carved from a [`crate::ProcessMemory`] whose
//! reporting engine would want the same memory back.
//!
//! * [`HugePagePool::alloc`]: a zero-request gets a pre-zeroed page without writing a
//!   byte; only when none is left is a dirty page zeroed inline (counted).
//! * [`HugePagePool::prezero`]: zeroes up to N zeroable pages **on the caller's thread**
//!   (non-temporal kernels), so the caller decides CPU placement, priority, cgroup, and
//!   can stop it ([`CancelToken`], checked between pages); zeroing happens outside the
//!   pool lock, so allocation goes on meanwhile (pages being zeroed are simply not
//!   allocatable; an allocator that finds nothing else waits for them).
//! * [`HugePagePool::notifications`] / `AsFd`: an eventfd, readable when zeroable pages
//!   appeared (at most one event per `min_event_interval` per node, trailing event
//!   included) — put it in epoll/poll and call `prezero` when it fires, as in the hugetlb
//!   pre-zeroing series' pseudocode. See `examples/prezero.rs`.

mod notify;
mod page;

pub use notify::CancelToken;
pub use page::PoolPage;

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use zeronce_mem::{BackingKind, GuestRam, HugePageSize, SharedRam};
use zeronce_mm::hugepool::{HugePool, HugePoolError, PoolCounters, PoolCounts};
use zeronce_mm::{Order, PageRange, Pfn, Zeroer, ZoneId, PAGE_SIZE};

pub use crate::error::{OsError, PrezeroError};

use crate::error::BuildError;
use crate::zeroing::RamZeroer;
use notify::{EventFd, InstantClock, PoolState};

/// Builder of a [`HugePagePool`]; see [`HugePagePool::builder`].
#[derive(Clone, Debug)]
pub struct Builder {
    pages: u64,
    page_size: HugePageSize,
    backing: BackingKind,
    nodes: usize,
    populate: bool,
    min_event_interval: Duration,
}

impl Builder {
    /// Number of huge pages (default 64).
    pub fn pages(mut self, pages: u64) -> Self {
        self.pages = pages;
        self
    }

    /// Huge page size (default 2 MiB; a hugetlb backing sets its own).
    pub fn page_size(mut self, size: HugePageSize) -> Self {
        self.page_size = size;
        self
    }

    /// What backs the pages (default: anonymous memory with THP).
    pub fn backing(mut self, kind: BackingKind) -> Self {
        if let BackingKind::Hugetlb(size) = kind {
            self.page_size = size;
        }
        self.backing = kind;
        self
    }

    /// Splits the pages evenly over `nodes` pool nodes (default 1), each with its own
    /// zeroable count and event rate limit. Memory is not bound to NUMA nodes.
    pub fn nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }

    /// Fault every page in at build time (default `true`), so the kernel's own zeroing
    /// happens here and pages start resident and known zero. `false`: pages start known
    /// zero but not resident (first touch faults).
    pub fn populate(mut self, on: bool) -> Self {
        self.populate = on;
        self
    }

    /// Least time between two events of one node (default 100 ms).
    pub fn min_event_interval(mut self, interval: Duration) -> Self {
        self.min_event_interval = interval;
        self
    }

    /// Maps the memory and starts the trailing-event thread.
    pub fn build(self) -> Result<HugePagePool, BuildError> {
        if self.pages == 0 || self.nodes == 0 || self.pages < self.nodes as u64 {
            return Err(BuildError::EmptyPool {
                pages: self.pages,
                nodes: self.nodes,
            });
        }
        let page_bytes = self.page_size.bytes();
        let order = Order::new((page_bytes as u64 / PAGE_SIZE).trailing_zeros() as u8)
            .expect("2 MiB and 1 GiB are valid orders");
        let ram = GuestRam::new(page_bytes * self.pages as usize, self.backing)?;
        let ram = SharedRam::new(ram);
        if self.populate {
            let mut all = ram.claim(0, ram.len()).map_err(PrezeroError::from)?;
            all.touch(PAGE_SIZE as usize);
        }
        let mut pool = HugePool::new(order);
        let events = EventFd::new().map_err(|errno| {
            PrezeroError::from(OsError {
                call: "eventfd",
                errno,
            })
        })?;
        pool.set_event_hook(events.hook(), InstantClock::new(), self.min_event_interval);
        let per_node = self.pages / self.nodes as u64;
        let mut start = 0;
        for node in 0..self.nodes {
            let count = if node + 1 == self.nodes {
                self.pages - start
            } else {
                per_node
            };
            let range = PageRange::new(Pfn(start * order.pages()), count * order.pages());
            pool.add_range(ZoneId(node), range, true)
                .map_err(PrezeroError::from)?;
            start += count;
        }
        let state = Arc::new(PoolState::new(pool));
        let timer_state = Arc::clone(&state);
        let timer = std::thread::Builder::new()
            .name("zeronce-prezero-events".into())
            .spawn(move || timer_state.run_timer())
            .map_err(|e| {
                PrezeroError::from(OsError {
                    call: "thread spawn",
                    errno: Errno::from_io_error(&e).unwrap_or(Errno::AGAIN),
                })
            })?;
        tracing::debug!(pages = self.pages, page_bytes, backing = ?self.backing, "huge-page pool built");
        Ok(HugePagePool {
            inner: Arc::new(PoolInner {
                zeroer: RamZeroer::new(Arc::clone(&ram)),
                ram,
                state,
                events,
                page_bytes,
            }),
            timer: Some(timer),
        })
    }
}

/// What the pool's handles share.
#[derive(Debug)]
struct PoolInner {
    state: Arc<PoolState>,
    ram: Arc<SharedRam>,
    zeroer: RamZeroer,
    events: Arc<EventFd>,
    page_bytes: usize,
}

/// A huge-page pool over real memory; see the module docs. `Send + Sync`: share it by
/// reference or `Arc`; allocated pages ([`PoolPage`]) may outlive it.
#[derive(Debug)]
pub struct HugePagePool {
    inner: Arc<PoolInner>,
    timer: Option<JoinHandle<()>>,
}

/// What one [`HugePagePool::prezero`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrezeroReport {
    /// Pages zeroed.
    pub pages: u64,
    /// Bytes zeroed.
    pub bytes: u64,
    /// Wall time of the call.
    pub elapsed: Duration,
    /// Stopped by the cancellation token before the request was met.
    pub cancelled: bool,
    /// Zeroable pages left in the pool when it returned.
    pub zeroable_left: u64,
}

impl PrezeroReport {
    /// Zeroing throughput in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

impl HugePagePool {
    /// A builder: 64 × 2 MiB pages, anonymous THP, one node, populated, events at most
    /// every 100 ms.
    pub fn builder() -> Builder {
        Builder {
            pages: 64,
            page_size: HugePageSize::Size2M,
            backing: BackingKind::Anonymous { thp: true },
            nodes: 1,
            populate: true,
            min_event_interval: Duration::from_millis(100),
        }
    }

    /// Bytes per page.
    pub fn page_bytes(&self) -> usize {
        self.inner.page_bytes
    }

    /// What backs the pages.
    pub fn backing(&self) -> BackingKind {
        self.inner.ram.kind()
    }

    /// Allocates a page on any node; with `zeroed` it reads zero (pre-zeroed if any page
    /// is, else zeroed inline here).
    pub fn alloc(&self, zeroed: bool) -> Result<PoolPage, PrezeroError> {
        self.alloc_on(None, zeroed)
    }

    /// As [`HugePagePool::alloc`], on `node` only (`None`: any). If every free page is
    /// being zeroed, waits for a zeroer to finish one (the hugetlb pre-zeroing series' `hpage_wait_zeroing`).
    pub fn alloc_on(&self, node: Option<ZoneId>, zeroed: bool) -> Result<PoolPage, PrezeroError> {
        let state = &self.inner.state;
        let mut pool = state.lock();
        let allocation = loop {
            match pool.alloc(node, zeroed) {
                Err(HugePoolError::Exhausted { zeroing, .. }) if zeroing > 0 => {
                    pool = zeronce_mm::sync::wait(&state.ready, pool);
                }
                other => break other?,
            }
        };
        drop(pool);
        PoolPage::new(Arc::clone(&self.inner), allocation)
    }

    /// Zeroes up to `max_pages` zeroable pages (any node, fullest first) on the calling
    /// thread, one page at a time, checking `cancel` between pages.
    pub fn prezero(&self, max_pages: u64, cancel: &CancelToken) -> PrezeroReport {
        self.prezero_on(None, max_pages, cancel)
    }

    /// As [`HugePagePool::prezero`], on `node` only (`None`: any).
    pub fn prezero_on(
        &self,
        node: Option<ZoneId>,
        max_pages: u64,
        cancel: &CancelToken,
    ) -> PrezeroReport {
        let start = Instant::now();
        let mut report = PrezeroReport::default();
        while report.pages < max_pages {
            if cancel.is_cancelled() {
                report.cancelled = true;
                break;
            }
            if !self.prezero_one(node) {
                break;
            }
            report.pages += 1;
        }
        report.bytes = report.pages * self.inner.page_bytes as u64;
        report.elapsed = start.elapsed();
        report.zeroable_left = self.zeroable_total();
        tracing::debug!(?report, "prezero");
        report
    }

    /// Zeroes up to `max_pages` pages with `threads` scoped threads (spawned by, and so
    /// inheriting the CPU affinity, priority and cgroup of, the calling thread).
    pub fn prezero_parallel(
        &self,
        max_pages: u64,
        threads: usize,
        cancel: &CancelToken,
    ) -> PrezeroReport {
        let start = Instant::now();
        let threads = threads.max(1) as u64;
        let reports: Vec<PrezeroReport> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|i| {
                    let share = max_pages / threads + u64::from(i < max_pages % threads);
                    s.spawn(move || self.prezero(share, cancel))
                })
                .collect();
            workers.into_iter().filter_map(|w| w.join().ok()).collect()
        });
        PrezeroReport {
            pages: reports.iter().map(|r| r.pages).sum(),
            bytes: reports.iter().map(|r| r.bytes).sum(),
            elapsed: start.elapsed(),
            cancelled: reports.iter().any(|r| r.cancelled),
            zeroable_left: self.zeroable_total(),
        }
    }

    /// Takes one zeroable page, zeroes it outside the lock, puts it back known zero.
    fn prezero_one(&self, node: Option<ZoneId>) -> bool {
        let state = &self.inner.state;
        let ticket = {
            let mut pool = state.lock();
            let node = node.or_else(|| {
                (0..pool.node_count())
                    .map(ZoneId)
                    .max_by_key(|&n| pool.zeroable(n))
            });
            let Some(ticket) = node.and_then(|n| pool.take_zeroable(n, 1).pop()) else {
                return false;
            };
            ticket
        };
        self.inner.zeroer.zero(ticket.page().range(), None);
        let mut pool = state.lock();
        if let Err(e) = pool.finish_zeroing(ticket, true) {
            tracing::error!(%e, "finishing a page this pool handed out failed");
        }
        drop(pool);
        state.ready.notify_all();
        true
    }

    /// Zeroable pages of `node`.
    pub fn zeroable(&self, node: ZoneId) -> u64 {
        self.inner.state.lock().zeroable(node)
    }

    /// Zeroable pages of every node.
    pub fn zeroable_total(&self) -> u64 {
        self.inner.state.lock().zeroable_total()
    }

    /// Page counts by state.
    pub fn counts(&self) -> PoolCounts {
        self.inner.state.lock().counts()
    }

    /// Counters (allocations served pre-zeroed / zeroed inline, pages pre-zeroed, events).
    pub fn counters(&self) -> PoolCounters {
        self.inner.state.lock().counters()
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.inner.state.lock().node_count()
    }

    /// The eventfd: readable when zeroable pages appeared; read it (or call
    /// [`HugePagePool::take_notifications`]) to rearm.
    pub fn notifications(&self) -> BorrowedFd<'_> {
        self.inner.events.as_fd()
    }

    /// Reads and resets the eventfd: events since the last read (0: none).
    pub fn take_notifications(&self) -> u64 {
        self.inner.events.take()
    }

    /// Waits until the eventfd is readable or `timeout` passes (`None`: no limit);
    /// whether it is readable.
    pub fn wait_notification(&self, timeout: Option<Duration>) -> Result<bool, PrezeroError> {
        self.inner.events.wait(timeout).map_err(|errno| {
            PrezeroError::from(OsError {
                call: "poll",
                errno,
            })
        })
    }

    /// Checks the pure pool's invariants (tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.state.lock().check_invariants()
    }

    /// Whether the page at `pfn` reads zero (claims it: not while allocated).
    #[cfg(test)]
    fn reads_zero(&self, pfn: Pfn) -> bool {
        let range = PageRange::new(pfn, self.inner.page_bytes as u64 / PAGE_SIZE);
        self.inner.zeroer.is_zero(range)
    }
}

impl AsFd for HugePagePool {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.notifications()
    }
}

impl Drop for HugePagePool {
    fn drop(&mut self) {
        self.inner.state.stop_timer();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
