//! The allocator behind the C functions, in safe code: its settings, zeronce's process
//! mode for large blocks, the counters, the `fork` handlers and the exit report. The
//! C shims (`ffi.rs`) route by size and address and call mimalloc for the rest.

use std::alloc::Layout;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use zeronce_lib::ProcessBackend;
use zeronce_mem::{in_backend, LargeAlloc};

use crate::commit::CommitGuess;
use crate::config::{Config, Host};
use crate::routes::ROUTES;
use crate::stderr::{keep_stderr_for_report, write_report};

/// Arenas a process may have: its own, and one more in each generation of `fork`
/// children (a child cannot use its parent's: see [`Runtime::fork_child`]). Past the last
/// generation, large allocations come from mimalloc.
const GENERATIONS: usize = 4;

/// Settings, the large-block backends (one per `fork` generation), counters.
pub struct Runtime {
    config: Config,
    backends: [ProcessBackend; GENERATIONS],
    /// The backend of this process: `backends[generation]`; the ones before it are its
    /// ancestors' (inherited blocks, never allocated from again).
    generation: AtomicUsize,
    counters: Counters,
    /// The kernel's overcommit heuristic, for sizes zeronce's and mimalloc's reserved
    /// mappings would otherwise grant past RAM and swap.
    commit: CommitGuess,
}

/// What the exit report counts (the small side only under `ZERONCE_SHOW_STATS`: a shared
/// counter on every small allocation would cost more than the allocation).
#[derive(Default)]
struct Counters {
    large_allocs: AtomicU64,
    large_bytes: AtomicU64,
    /// `realloc`s that grew a zeronce block in place, and the bytes they added.
    large_grows: AtomicU64,
    grown_bytes: AtomicU64,
    /// Sizes from the threshold up that zeronce declined (larger than its largest block, a
    /// `fork` child, its arena full or not created): each a mapping of its own (mimalloc's
    /// past the ones the library lists, see `ffi/huge.rs`).
    declined_allocs: AtomicU64,
    declined_bytes: AtomicU64,
    small_allocs: AtomicU64,
    small_bytes: AtomicU64,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

thread_local! {
    /// Set while this thread reads the settings: its own allocations meanwhile go to
    /// mimalloc instead of waiting for itself.
    static INITIALISING: Cell<bool> = const { Cell::new(false) };
}

/// The runtime, created (settings read) by the first call of any thread; `None` only on
/// the thread creating it, while it does.
#[inline]
pub fn get() -> Option<&'static Runtime> {
    match RUNTIME.get() {
        Some(r) => Some(r),
        None => init(),
    }
}

/// The runtime if it exists (a pointer freed before it does is mimalloc's).
#[inline]
pub fn current() -> Option<&'static Runtime> {
    RUNTIME.get()
}

#[cold]
fn init() -> Option<&'static Runtime> {
    let entered = INITIALISING.try_with(|c| !c.replace(true)).unwrap_or(false);
    if !entered {
        return None;
    }
    let r = RUNTIME.get_or_init(|| {
        ROUTES.seed_free_mark(crate::ffi::aux_random());
        Runtime::new(Config::from_env())
    });
    let _ = INITIALISING.try_with(|c| c.set(false));
    if !r.config.show_stats {
        // Small allocations need nothing more of the runtime (the report would count them).
        ROUTES.set_small_below(r.threshold());
    }
    Some(r)
}

impl Runtime {
    fn new(config: Config) -> Runtime {
        if config.show_stats {
            keep_stderr_for_report();
        }
        // Each creates its arena only at its first large allocation.
        let backends = std::array::from_fn(|_| {
            let backend = ProcessBackend::new().threshold(config.threshold);
            // Under the zero-once lifecycle the hold is the reporting delay.
            let backend = match config.host {
                Host::ZeroThenReport => backend.zero_then_report(config.delay),
                Host::Discard(policy) => backend.policy(policy).reporting_delay(config.delay),
            };
            let backend = backend.verify(config.verify).scan_freed(config.scan);
            // Unset, the backend's default: huge pages unless the host takes free memory
            // back (`zeronce::reports_free_memory_to_host`).
            let backend = match config.thp {
                Some(on) => backend.thp(on),
                None => backend,
            };
            match config.zeroer {
                Some(z) => backend.zeroer(z),
                None => backend,
            }
        });
        Runtime {
            config,
            backends,
            generation: AtomicUsize::new(0),
            counters: Counters::default(),
            commit: CommitGuess::new(),
        }
    }

    /// This process's backend, and the ones it inherited (oldest first).
    #[inline]
    fn lineage(&self) -> &[ProcessBackend] {
        &self.backends[..=self.generation.load(Relaxed)]
    }

    #[inline]
    fn backend(&self) -> &ProcessBackend {
        &self.backends[self.generation.load(Relaxed)]
    }

    /// The backend whose range holds `addr` (no lock).
    #[inline]
    fn owner(&self, addr: usize) -> Option<&ProcessBackend> {
        self.lineage().iter().rev().find(|b| b.owns(addr))
    }

    /// Sizes from this one up are offered to zeronce.
    #[inline]
    pub fn threshold(&self) -> usize {
        self.backends[0].threshold_bytes()
    }

    /// Whether an allocation of `size` bytes must fail as glibc's would: more than RAM and
    /// swap together under the kernel's default overcommit heuristic (see [`CommitGuess`]).
    #[inline]
    pub fn refuses(&self, size: usize) -> bool {
        self.commit.refuses(size)
    }

    /// Counts a small allocation (only when the exit report is asked for).
    #[inline]
    pub fn count_small(&self, size: usize) {
        if self.config.show_stats {
            self.counters.small_allocs.fetch_add(1, Relaxed);
            self.counters.small_bytes.fetch_add(size as u64, Relaxed);
        }
    }

    /// The address of a zeronce block of at least `size` bytes aligned to `align`
    /// (reading zero if `zeroed`), or `None`: zeronce declined (counted), the caller maps
    /// it.
    pub fn large_alloc(&self, size: usize, align: usize, zeroed: bool) -> Option<usize> {
        let backend = self.backend();
        let served = Layout::from_size_align(size, align)
            .ok()
            .and_then(|layout| {
                let g = in_backend(|| backend.alloc(layout, zeroed))?;
                (g.len() >= size && g.addr() % align == 0).then_some(g.addr())
            });
        if let Some(addr) = served.filter(|&a| !ROUTES.may_be_large(a)) {
            // The first block of this range: the fast route for `free` must know the
            // range before the block leaves this thread.
            let (base, len) = backend.range().unwrap_or((addr, size));
            ROUTES.cover(base, len);
        }
        let (n, bytes) = match served {
            Some(_) => (&self.counters.large_allocs, &self.counters.large_bytes),
            None => (
                &self.counters.declined_allocs,
                &self.counters.declined_bytes,
            ),
        };
        n.fetch_add(1, Relaxed);
        bytes.fetch_add(size as u64, Relaxed);
        served
    }

    /// Whether `addr` lies in a zeronce range (no lock).
    #[inline]
    pub fn owns(&self, addr: usize) -> bool {
        self.owner(addr).is_some()
    }

    /// Frees the zeronce block at `addr`; `false` if it is not a live block.
    pub fn large_free(&self, addr: usize) -> bool {
        let Some(backend) = self.owner(addr) else {
            return false;
        };
        // Through the re-entry guard when this thread is not in the backend yet (its
        // nested allocations then go to mimalloc); directly when it is (a block freed by
        // the backend's own code must still reach it).
        let mut f = Some(|| backend.dealloc(addr));
        let guarded = in_backend(|| f.take().map(|f| f()));
        match (guarded, f.take()) {
            (Some(freed), _) => freed,
            (None, Some(f)) => catch_unwind(AssertUnwindSafe(f)).unwrap_or(true),
            // It panicked: the block is in an unknown state; not the caller's fault.
            (None, None) => true,
        }
    }

    /// The usable bytes of the zeronce block at `addr`, `None` if it is not a live block.
    pub fn large_usable(&self, addr: usize) -> Option<usize> {
        let backend = self.owner(addr)?;
        catch_unwind(AssertUnwindSafe(|| backend.usable_size(addr)))
            .ok()
            .flatten()
    }

    /// Grows (or shrinks) the zeronce block at `addr`, of `before` usable bytes, in place
    /// to at least `size` bytes.
    pub fn large_grow(&self, addr: usize, before: usize, size: usize) -> bool {
        let Some(backend) = self.owner(addr) else {
            return false;
        };
        let grown = in_backend(|| backend.grow(addr, size)).is_some_and(|g| g.len() >= size);
        if grown && size > before {
            self.counters.large_grows.fetch_add(1, Relaxed);
            self.counters
                .grown_bytes
                .fetch_add((size - before) as u64, Relaxed);
        }
        grown
    }

    /// Gives back now the memory zeronce holds and no allocation uses (see
    /// [`ProcessBackend::trim`]); whether anything went back. `malloc_trim`'s large half.
    pub fn trim(&self) -> bool {
        let backend = self.backend();
        in_backend(|| Some(backend.trim())).unwrap_or(false)
    }

    /// Bytes of live large blocks now (sizes rounded up to pages) and at the most.
    pub fn large_live(&self) -> (u64, u64) {
        let backend = self.backend();
        (backend.live_bytes(), backend.peak_live_bytes())
    }

    /// The report's lines: at exit under `ZERONCE_SHOW_STATS`, and for `malloc_stats`.
    pub fn report(&self) -> String {
        let c = &self.counters;
        let small = if self.config.show_stats {
            format!(
                "{} in {} allocations",
                bytes(c.small_bytes.load(Relaxed)),
                c.small_allocs.load(Relaxed)
            )
        } else {
            "not counted (ZERONCE_SHOW_STATS=1 counts them)".to_string()
        };
        let mut out = format!(
            "zeronce: large (zeronce) {} in {} allocations, {} more in {} reallocs grown in place; declined {} in {} (each a mapping of its own; requested: some may have failed); small (mimalloc) {small}\n",
            bytes(c.large_bytes.load(Relaxed)),
            c.large_allocs.load(Relaxed),
            bytes(c.grown_bytes.load(Relaxed)),
            c.large_grows.load(Relaxed),
            bytes(c.declined_bytes.load(Relaxed)),
            c.declined_allocs.load(Relaxed),
        );
        let (committed, peak) = crate::ffi::mimalloc_committed();
        out += &format!(
            "zeronce: mimalloc committed now {}, peak {} (small blocks, and declined large ones past the listed mappings)\n",
            bytes(committed as u64),
            bytes(peak as u64)
        );
        let backend = self.backend();
        let live = format!(
            "live now {}, peak {}",
            bytes(backend.live_bytes()),
            bytes(backend.peak_live_bytes())
        );
        if backend.is_forked_child() {
            // The last generation's child: the manager is never called in a fork child
            // (see ProcessBackend::fork_child).
            out += &format!("zeronce: large arena: {live} (inherited by a fork child)\n");
        } else if let Some(pm) = backend.memory() {
            let s = pm.stats();
            out += &format!(
                "zeronce: memsets skipped {} ({} of {} zeroed allocations); zeroed in the background {}, on allocation {}; reported to the kernel {}\n",
                bytes(s.mm.bytes_zeroing_skipped),
                s.mm.zero_requests_skipped,
                s.mm.zero_requests,
                bytes(s.zeroing.background),
                bytes(s.zeroing.alloc_path),
                bytes(s.device.map_or(0, |d| d.discarded_bytes)),
            );
            out += &format!(
                "zeronce: large arena: resident now {}; {live}\n",
                bytes(pm.resident_bytes())
            );
            // The arena's own peak residency is not tracked (it would cost every
            // allocation a shared counter); the process's peak bounds it.
            if let Ok(hwm) = zeronce_mem::peak_rss() {
                out += &format!(
                    "zeronce: process peak RSS (VmHWM, large and small together) {}\n",
                    bytes(hwm)
                );
            }
        } else {
            out += "zeronce: large arena: none (no allocation reached the threshold, or its range could not be reserved: see `ulimit -v`)\n";
        }
        out
    }

    /// Prints the report if `ZERONCE_SHOW_STATS` asked for it.
    pub fn report_at_exit(&self) {
        if self.config.show_stats {
            write_report(self.report().as_bytes());
        }
    }

    /// `pthread_atfork` prepare: every backend's table is made consistent for the child.
    pub fn fork_prepare(&'static self) {
        self.lineage().iter().for_each(ProcessBackend::fork_prepare);
    }

    /// `pthread_atfork` parent.
    pub fn fork_parent(&'static self) {
        self.lineage().iter().for_each(ProcessBackend::fork_parent);
    }

    /// `pthread_atfork` child. The parent's arenas are the child's only for the blocks it
    /// inherited (their threads are gone, their locks may be held by threads that are
    /// gone): the child's large allocations come from the next generation's backend, which
    /// creates an arena, with its own reporting and zeroing threads, at the first of them.
    pub fn fork_child(&'static self) {
        let lineage = self.lineage();
        lineage.iter().for_each(ProcessBackend::fork_child);
        if lineage.len() < GENERATIONS {
            self.generation.store(lineage.len(), Relaxed);
        }
    }
}

/// `n` bytes for people: `256 MiB`, `1.5 GiB`, `12 KiB`, `100 B`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn byte_counts_read_like_a_person_writes_them() {
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes(12 << 10), "12.0 KiB");
        assert_eq!(bytes(256 << 20), "256.0 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
    }
}
