//! Thread caches of freed small blocks in front of mimalloc, and a transfer cache that
//! moves them between threads a batch at a time: for blocks that one thread allocates and
//! another frees (a consumer freeing what a producer made).
//!
//! mimalloc alone sends each such free back to the block's owner with an atomic step, and
//! the owner walks the blocks it gets back one by one: in the small-objects benchmark's
//! producer/consumer pairs, 1.10–1.17 of tcmalloc's wall time. Here a thread that frees
//! [`FREES_IN_A_ROW`] blocks without allocating keeps what it frees, up to
//! [`CACHED_MAX`] bytes, on a list of its [`Class`]. Past the class's limit it hands a
//! batch to the transfer cache (one short lock); a thread whose list is empty takes a
//! batch from there before it asks mimalloc, and a `malloc` of a class takes the last
//! block on its list. No atomic operation on a list.
//!
//! Everything else stays mimalloc's: a thread that allocates as much as it frees gives its
//! blocks to mimalloc's free lists, which hand them out again page by page. A cache that
//! kept those too (tcmalloc's way: every free onto the thread's list, the last freed
//! handed out first) made single-threaded programs slower (lua 7 %, perl 16 %, a churn
//! loop 56 %): their blocks ended up spread over more pages. Until a second thread
//! allocates or frees ([`threads_share_blocks`]), the caches are not looked at at all.
//!
//! What a cached block holds: its first word links the list, its second keeps the free
//! mark `free` wrote (see [`crate::routes`]), so a second free of a cached block is still
//! told. Bounds: a thread keeps at most [`KEPT`] blocks a class (400 KiB all
//! classes full); the transfer cache at most [`DEPTH`] batches a class (3.2 MiB all
//! full); past that, blocks go back to mimalloc. A thread's cache goes back to mimalloc
//! when the thread ends (a `pthread` key's destructor), and every cache the caller can
//! reach at `malloc_trim`. A `fork` child keeps the forking thread's cache; the other
//! threads' caches, like those threads, are not in the child.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering::*};

use libmimalloc_sys as mi;

use super::spin::SpinLock;
use crate::classes::{Class, BATCH, CACHED_MAX, CLASSES, KEPT};

/// Batches of one class the transfer cache holds at most.
const DEPTH: usize = 16;

/// Frees in a row, without a `malloc` between them, after which a thread keeps what it
/// frees (see the module docs).
const FREES_IN_A_ROW: u32 = 64;

/// Where a thread's cache stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Never used: its end is not watched yet.
    New,
    /// In use; its end gives it back.
    Open,
    /// Given back (the thread is ending), or its end could not be watched: blocks go
    /// straight to mimalloc.
    Closed,
}

/// One thread's lists (see the module docs).
struct ThreadCache {
    state: Cell<State>,
    /// Frees since this thread's last `malloc` of a cached size, up to [`FREES_IN_A_ROW`].
    frees_in_a_row: Cell<u32>,
    /// Blocks on all its lists: the sum of `counts`, kept so that an allocation finds
    /// "nothing kept" in one load.
    held: Cell<usize>,
    /// Each class's last freed block (null: none), linked through first words.
    heads: [Cell<*mut c_void>; CLASSES],
    /// Each class's list length.
    counts: [Cell<usize>; CLASSES],
}

thread_local! {
    /// No destructor: reached without a registration check (its end is watched by
    /// [`EXIT_KEY`]), valid until the thread is gone.
    static CACHE: ThreadCache = const {
        ThreadCache {
            state: Cell::new(State::New),
            frees_in_a_row: Cell::new(0),
            held: Cell::new(0),
            heads: [const { Cell::new(null_mut()) }; CLASSES],
            counts: [const { Cell::new(0) }; CLASSES],
        }
    };
}

/// Where [`CACHE`] lies from the thread pointer, the same in every thread (0: not known
/// yet). The library's thread-locals are in the static TLS block: its dynamic section
/// says `STATIC_TLS` (mimalloc's thread-locals use the initial-exec model, and a test
/// checks the flag), so the loader places them at one offset from every thread's
/// pointer, or refuses to load the library. Rust reaches a thread-local of a shared
/// library through `__tls_get_addr`, a call each time; the offset makes it a load and an
/// add, as C's initial-exec model does (measured on a C prototype of these caches: the
/// small-objects benchmark 20 % faster with the initial-exec model).
static OFFSET: AtomicUsize = AtomicUsize::new(0);

/// The thread pointer (x86-64: `%fs:0`, the thread control block's pointer to itself).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn thread_pointer() -> Option<usize> {
    let tp: usize;
    // SAFETY: reads the thread control block's first word, which every thread has.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp,
            options(nostack, readonly, preserves_flags, pure));
    }
    Some(tp)
}

/// The thread pointer (AArch64: `TPIDR_EL0`).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn thread_pointer() -> Option<usize> {
    let tp: usize;
    // SAFETY: reads a register every thread has.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp,
            options(nostack, nomem, preserves_flags, pure));
    }
    Some(tp)
}

/// Elsewhere: none known; [`CACHE`] is reached the standard way.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn thread_pointer() -> Option<usize> {
    None
}

/// Who allocates: 0 before any thread did, [`SHARED`] once a second thread did (from then
/// on the caches are used), else the thread pointer of the only thread that did.
static ALLOCATING: AtomicUsize = AtomicUsize::new(0);

/// [`ALLOCATING`] once a second thread came: no thread pointer is odd.
const SHARED: usize = 1;

/// Whether blocks may move between threads: a second thread has come (see the module
/// docs). A load, the thread pointer and a compare.
#[inline(always)]
fn threads_share_blocks() -> bool {
    let allocating = ALLOCATING.load(Relaxed);
    if allocating == SHARED {
        return true;
    }
    match thread_pointer() {
        Some(tp) if tp == allocating => false,
        Some(tp) => note_thread(allocating, tp),
        None => false,
    }
}

/// A thread other than the one seen allocating (`seen`): the first, or the second.
#[cold]
fn note_thread(seen: usize, tp: usize) -> bool {
    if seen == 0 {
        match ALLOCATING.compare_exchange(0, tp, Relaxed, Relaxed) {
            Ok(_) => return false,
            Err(now) if now == tp => return false,
            Err(_) => {}
        }
    }
    ALLOCATING.store(SHARED, Relaxed);
    true
}

/// Runs `f` on this thread's cache.
#[inline(always)]
fn with_mine<R>(f: impl FnOnce(&ThreadCache) -> R) -> R {
    let offset = OFFSET.load(Relaxed);
    if offset != 0 {
        if let Some(tp) = thread_pointer() {
            let cache = tp.wrapping_add(offset) as *const ThreadCache;
            // SAFETY: this thread's `CACHE`, at the offset every thread shares (see
            // `OFFSET`); it lives as long as the thread, and `f` cannot keep it.
            return f(unsafe { &*cache });
        }
    }
    CACHE.with(|cache| {
        learn_offset(cache);
        f(cache)
    })
}

/// Records where `cache`, this thread's, lies from the thread pointer.
#[cold]
fn learn_offset(cache: &ThreadCache) {
    if let Some(tp) = thread_pointer() {
        OFFSET.store(
            (cache as *const ThreadCache as usize).wrapping_sub(tp),
            Relaxed,
        );
    }
}

/// A cached block's next link.
///
/// # Safety
/// `p` is a cached block.
#[inline(always)]
unsafe fn next(p: *mut c_void) -> *mut c_void {
    // SAFETY: a cached block holds at least two words, the first its link.
    unsafe { p.cast::<*mut c_void>().read() }
}

/// Sets a free block's next link.
///
/// # Safety
/// `p` is a free block of at least a word that this thread holds.
#[inline(always)]
unsafe fn set_next(p: *mut c_void, next: *mut c_void) {
    // SAFETY: the caller's promise.
    unsafe { p.cast::<*mut c_void>().write(next) }
}

/// A block for a request of `size` bytes (at least 1) from this thread's cache or the
/// transfer cache (its second word still the free mark), or null: ask mimalloc. Ends the
/// thread's run of frees.
#[inline(always)]
pub(super) fn take(size: usize) -> *mut c_void {
    if size > CACHED_MAX || !threads_share_blocks() {
        return null_mut();
    }
    with_mine(|cache| {
        cache.frees_in_a_row.set(0);
        if cache.held.get() == 0 && HELD_BATCHES.load(Relaxed) == 0 {
            // Nothing kept anywhere: what every allocation of a thread that passes no
            // blocks to others finds, in two loads.
            return null_mut();
        }
        let class = Class::of_request(size);
        let i = class.index();
        let head = cache.heads[i].get();
        if head.is_null() {
            return refill(cache, class);
        }
        // SAFETY: a block on this thread's list.
        cache.heads[i].set(unsafe { next(head) });
        cache.counts[i].set(cache.counts[i].get() - 1);
        cache.held.set(cache.held.get() - 1);
        head
    })
}

/// An empty list's next block: a batch from the transfer cache, its first block the one
/// handed out and the rest this thread's list.
#[inline(never)]
fn refill(cache: &ThreadCache, class: Class) -> *mut c_void {
    // A closed cache must not gather blocks its ending thread would never give back.
    if cache.state.get() != State::Open && !open(cache) {
        return null_mut();
    }
    let Some(batch) = TRANSFER[class.index()].take() else {
        return null_mut();
    };
    // SAFETY: a batch of `BATCH` blocks, now this thread's.
    cache.heads[class.index()].set(unsafe { next(batch) });
    cache.counts[class.index()].set(BATCH - 1);
    cache.held.set(cache.held.get() + BATCH - 1);
    batch
}

/// Counts a free of this thread: `true` when it comes after [`FREES_IN_A_ROW`] others
/// without an allocation between (the block is to be kept: [`keep`]), `false` when it is
/// mimalloc's.
#[inline(always)]
pub(super) fn in_a_run_of_frees() -> bool {
    if !threads_share_blocks() {
        return false;
    }
    with_mine(|cache| {
        let in_a_row = cache.frees_in_a_row.get();
        if in_a_row < FREES_IN_A_ROW {
            cache.frees_in_a_row.set(in_a_row + 1);
            return false;
        }
        true
    })
}

/// Keeps the freed block `p` in this thread's cache; `false` when it is not a cached size
/// (or the cache is closed) and must go to mimalloc.
///
/// # Safety
/// `p` is a mimalloc block the caller no longer uses, marked free.
pub(super) unsafe fn keep(p: *mut c_void) -> bool {
    // SAFETY: a mimalloc block (the caller's promise).
    let Some(class) = Class::of_block(unsafe { mi::mi_usable_size(p) }) else {
        return false;
    };
    with_mine(|cache| {
        if cache.state.get() != State::Open && !open(cache) {
            return false;
        }
        let i = class.index();
        // SAFETY: the freed block is now this thread's (the caller's promise).
        unsafe { set_next(p, cache.heads[i].get()) };
        cache.heads[i].set(p);
        let count = cache.counts[i].get() + 1;
        cache.counts[i].set(count);
        cache.held.set(cache.held.get() + 1);
        if count > KEPT {
            spill(cache, class);
        }
        true
    })
}

/// Hands the last [`BATCH`] blocks freed of `class` to the transfer cache (to
/// mimalloc when it is full).
#[inline(never)]
fn spill(cache: &ThreadCache, class: Class) {
    let i = class.index();
    let batch = cache.heads[i].get();
    let mut tail = batch;
    for _ in 1..BATCH {
        // SAFETY: the list holds more than a batch.
        tail = unsafe { next(tail) };
    }
    // SAFETY: `tail` is on this thread's list.
    cache.heads[i].set(unsafe { next(tail) });
    // SAFETY: as above; the batch ends here.
    unsafe { set_next(tail, null_mut()) };
    cache.counts[i].set(cache.counts[i].get() - BATCH);
    cache.held.set(cache.held.get() - BATCH);
    if !TRANSFER[i].put(batch) {
        // SAFETY: a list of free blocks nobody else holds.
        unsafe { release(batch) };
    }
}

/// Gives every block of the list starting at `p` (null-terminated) to mimalloc.
///
/// # Safety
/// `p` is null or a list of free mimalloc blocks that the caller holds.
unsafe fn release(mut p: *mut c_void) {
    while !p.is_null() {
        // SAFETY: the caller's promise; `next` is read before the block is given back.
        unsafe {
            let after = next(p);
            mi::mi_free(p);
            p = after;
        }
    }
}

/// Gives this thread's whole cache to mimalloc.
fn release_mine(cache: &ThreadCache) {
    cache.held.set(0);
    for class in Class::all() {
        let i = class.index();
        let head = cache.heads[i].replace(null_mut());
        cache.counts[i].set(0);
        // SAFETY: this thread's list, off the cache now.
        unsafe { release(head) };
    }
}

/// The `pthread` key whose destructor gives a thread's cache back (0: not created yet;
/// else the key + 1).
static EXIT_KEY: AtomicUsize = AtomicUsize::new(0);

/// Watches the end of this thread, the cache's first use: `true` when the cache is open.
#[cold]
fn open(cache: &ThreadCache) -> bool {
    if cache.state.get() == State::Closed {
        return false;
    }
    // Closed until the key's value is set: setting it may allocate (a `calloc` for keys
    // past the first 32), which must not come back here.
    cache.state.set(State::Closed);
    let at = CACHE.with(|c| c as *const ThreadCache);
    if !std::ptr::eq(at, cache) {
        // Not in the static TLS block after all (see `OFFSET`): a bug of this library.
        crate::stderr::write_stderr(b"zeronce: thread-local storage is not static\n");
        std::process::abort();
    }
    let Some(key) = exit_key() else {
        return false;
    };
    // SAFETY: a key of this process; any non-null value makes the destructor run.
    if unsafe { libc::pthread_setspecific(key, std::ptr::NonNull::<c_void>::dangling().as_ptr()) }
        != 0
    {
        return false;
    }
    cache.state.set(State::Open);
    true
}

/// The key, created by the first thread to need it.
fn exit_key() -> Option<libc::pthread_key_t> {
    let known = EXIT_KEY.load(Acquire);
    if known != 0 {
        return Some((known - 1) as libc::pthread_key_t);
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is valid for a write; the destructor has the signature wanted and lives
    // as long as the process.
    if unsafe { libc::pthread_key_create(&mut key, Some(at_thread_exit)) } != 0 {
        return None;
    }
    match EXIT_KEY.compare_exchange(0, key as usize + 1, AcqRel, Acquire) {
        Ok(_) => Some(key),
        Err(winner) => {
            // Another thread created one first: use it, drop ours.
            // SAFETY: our key, never given a value.
            unsafe { libc::pthread_key_delete(key) };
            Some((winner - 1) as libc::pthread_key_t)
        }
    }
}

/// The key's destructor: the ending thread's cache goes back to mimalloc and stays closed
/// (what the thread frees after this goes straight to mimalloc).
extern "C" fn at_thread_exit(_: *mut c_void) {
    // A destroyed thread-local is never reported for this one (no destructor of its own).
    let _ = CACHE.try_with(|cache| {
        cache.state.set(State::Closed);
        release_mine(cache);
    });
}

/// One class's batches in transit between threads.
#[repr(align(128))] // one class a line pair: threads of other classes do not share it
struct Transfer {
    lock: SpinLock,
    /// Batches held, also read without the lock to skip an empty one.
    len: AtomicUsize,
    /// Each a list of exactly the class's batch of blocks; the first `len` are held.
    batches: UnsafeCell<[*mut c_void; DEPTH]>,
}

// SAFETY: `batches` is read and written only under `lock`.
unsafe impl Sync for Transfer {}

/// The process's transfer cache, a slot a class.
static TRANSFER: [Transfer; CLASSES] = [const { Transfer::new() }; CLASSES];

/// Batches the transfer cache holds, all classes (changed with them, read without a lock:
/// a hint that lets an allocation skip the cache when it is 0).
static HELD_BATCHES: AtomicUsize = AtomicUsize::new(0);

impl Transfer {
    const fn new() -> Self {
        Transfer {
            lock: SpinLock::new(),
            len: AtomicUsize::new(0),
            batches: UnsafeCell::new([null_mut(); DEPTH]),
        }
    }

    /// Holds `batch`; `false` when full (the caller keeps it).
    fn put(&self, batch: *mut c_void) -> bool {
        if self.len.load(Relaxed) == DEPTH {
            return false;
        }
        self.lock.lock();
        let len = self.len.load(Relaxed);
        let held = len < DEPTH;
        if held {
            // SAFETY: under the lock.
            unsafe { (*self.batches.get())[len] = batch };
            self.len.store(len + 1, Relaxed);
            HELD_BATCHES.fetch_add(1, Relaxed);
        }
        self.lock.unlock();
        held
    }

    /// A batch, the caller's from now on; `None` when empty.
    fn take(&self) -> Option<*mut c_void> {
        if self.len.load(Relaxed) == 0 {
            return None;
        }
        self.lock.lock();
        let len = self.len.load(Relaxed);
        let batch = (len > 0).then(|| {
            self.len.store(len - 1, Relaxed);
            HELD_BATCHES.fetch_sub(1, Relaxed);
            // SAFETY: under the lock.
            unsafe { (*self.batches.get())[len - 1] }
        });
        self.lock.unlock();
        batch
    }
}

/// `malloc_trim`: the calling thread's cache and the whole transfer cache go back to
/// mimalloc (other threads' caches stay theirs).
pub(super) fn release_reachable() {
    let _ = CACHE.try_with(release_mine);
    for slot in &TRANSFER {
        while let Some(batch) = slot.take() {
            // SAFETY: a batch taken off the transfer cache, now the caller's.
            unsafe { release(batch) };
        }
    }
}

/// `fork` prepare: holds every transfer lock, so that the child finds none taken by a
/// thread it does not have.
pub(super) fn lock_all() {
    TRANSFER.iter().for_each(|slot| slot.lock.lock());
}

/// `fork` parent and child: releases what [`lock_all`] holds.
pub(super) fn unlock_all() {
    TRANSFER.iter().for_each(|slot| slot.lock.unlock());
}
