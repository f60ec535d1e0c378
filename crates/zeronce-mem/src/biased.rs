//! [`BiasedLock`]: a try-lock that the one thread using it takes with plain stores.
//!
//! A per-CPU slot is taken and given back at every allocation and free of the fast path.
//! With a test-and-set lock that is one locked instruction per take (the give-back is a
//! plain store), and on x86 a locked instruction waits for the store buffer to drain: on
//! the 2-vCPU guests zeronce is measured on, it was a third of an alloc+free pair that
//! stays on the slot. Almost always the thread taking a slot is the one that took it
//! last, so the slot is *biased* to that thread, as the JVM biased its monitors:
//!
//! - **The favoured thread** enters with a plain store of its own `inside` flag, a
//!   compiler fence and two loads (`locked`, then `favoured` again), and leaves with a
//!   plain store. No locked instruction, no fence instruction.
//! - **Everyone else** takes `locked` with a swap, as a test-and-set lock. If a thread is
//!   favoured, the taker then runs `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which
//!   puts a full memory barrier into every running thread of the process, and waits until
//!   the favoured thread is not `inside`.
//!
//! Why that excludes (the asymmetric Dekker protocol, as Folly's `asymmetricHeavyBarrier`
//! and liburcu's membarrier flavour use it): the favoured thread stores `inside` then
//! loads `locked`; the taker stores `locked` then loads `inside`. The membarrier is, in
//! the favoured thread's program order, a full barrier somewhere. If the favoured thread
//! stored `inside` before it, the taker's load after the syscall sees `inside` and waits;
//! if after it, the favoured thread's load of `locked` sees the taker's store and it backs
//! off. A thread that is not running passes a full barrier when it is switched back in.
//!
//! `favoured` only changes while `locked` is held, so a taker reads it once it holds the
//! lock. A taker that is not a drainer ([`BiasedLock::try_lock`]) takes the favour away
//! (two threads use the slot); [`BiasedLock::lock`], the drainers' way in, leaves it.
//! A thread that took the lock [`BiasedLock::rebias_after`] times in a row with nobody
//! else between becomes the favoured one, and each revocation doubles that count, so
//! threads that take turns on a slot cost at most one membarrier per 64 Ki takes.
//!
//! Where `membarrier` cannot be registered (an old kernel, a seccomp filter, Miri), no
//! thread is ever favoured and the lock is a plain test-and-set lock.

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{
    compiler_fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

/// Takes in a row after which a taker becomes the favoured thread, at first.
const FIRST_REBIAS: u32 = 64;
/// The most the count doubles to.
const MOST_REBIAS: u32 = 1 << 16;

/// A lock around `T` whose favoured thread takes it with plain stores (module docs).
pub struct BiasedLock<T> {
    /// Held by a taker that is not the favoured thread inside.
    locked: AtomicBool,
    /// The favoured thread is inside: written only by that thread.
    inside: AtomicBool,
    /// The favoured thread's token, 0 for none; changes only while `locked` is held.
    favoured: AtomicU64,
    /// The last taker of `locked` and how many takes in a row it made (under `locked`).
    last: AtomicU64,
    /// See `last`.
    run: AtomicU32,
    /// Takes in a row that make a taker favoured (under `locked`).
    rebias: AtomicU32,
    /// What the lock guards.
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread at a time (module docs), so sharing
// it between threads is sharing a `Mutex<T>`: sound when `T` may be sent between threads.
unsafe impl<T: Send> Sync for BiasedLock<T> {}

impl<T> BiasedLock<T> {
    /// An unlocked lock around `data`, favouring no thread.
    pub const fn new(data: T) -> Self {
        BiasedLock {
            locked: AtomicBool::new(false),
            inside: AtomicBool::new(false),
            favoured: AtomicU64::new(0),
            last: AtomicU64::new(0),
            run: AtomicU32::new(0),
            rebias: AtomicU32::new(FIRST_REBIAS),
            data: UnsafeCell::new(data),
        }
    }

    /// Takes the lock if no other thread holds it (nor this one: it is not reentrant).
    /// A thread that is not favoured takes the favour away from the thread that is.
    #[inline(always)]
    pub fn try_lock(&self) -> Option<BiasedGuard<'_, T>> {
        let me = this_thread();
        if me != 0 && self.favoured.load(Relaxed) == me {
            return self.enter_favoured(me);
        }
        self.try_take(me, Role::User)
    }

    /// Takes the lock, waiting out its holder, and leaves the favour where it is: the way
    /// in of a thread that visits every slot now and then (a drain).
    pub fn lock(&self) -> BiasedGuard<'_, T> {
        let me = this_thread();
        loop {
            if me != 0 && self.favoured.load(Relaxed) == me {
                if let Some(g) = self.enter_favoured(me) {
                    return g;
                }
            } else if let Some(g) = self.try_take(me, Role::Visitor) {
                return g;
            }
            std::thread::yield_now();
        }
    }

    /// Whether the calling thread is the favoured one.
    pub fn favours_me(&self) -> bool {
        let me = this_thread();
        me != 0 && self.favoured.load(Relaxed) == me
    }

    /// Takes in a row that make a taker favoured now.
    pub fn rebias_after(&self) -> u32 {
        self.rebias.load(Relaxed)
    }

    /// The favoured thread's way in: plain stores (module docs).
    #[inline(always)]
    fn enter_favoured(&self, me: u64) -> Option<BiasedGuard<'_, T>> {
        // Only this thread writes `inside`: set, it is this thread's own guard (no reentry).
        if self.inside.load(Relaxed) {
            return None;
        }
        self.inside.store(true, Relaxed);
        // The light half of the asymmetric fence: a taker's membarrier makes it a full one.
        compiler_fence(SeqCst);
        // `locked` first: if it was given back since this thread last looked, the acquire
        // makes the favour's change (made under it) visible to the load after it.
        if !self.locked.load(Acquire) && self.favoured.load(Relaxed) == me {
            return Some(BiasedGuard::new(self, Side::Favoured));
        }
        self.inside.store(false, Release);
        None
    }

    /// Everyone else's way in: the swap, then the favoured thread waited out.
    #[inline(never)]
    fn try_take(&self, me: u64, role: Role) -> Option<BiasedGuard<'_, T>> {
        if self.locked.swap(true, Acquire) {
            return None;
        }
        let favoured = self.favoured.load(Relaxed);
        if favoured != 0 && favoured != me {
            heavy_barrier();
            if role == Role::User && self.inside.load(Acquire) {
                // Inside for one operation: give way, as to any holder.
                self.locked.store(false, Release);
                return None;
            }
            // A visitor waits: the favoured thread stays inside for one operation.
            while self.inside.load(Acquire) {
                std::thread::yield_now();
            }
            if role == Role::User {
                self.revoke();
            }
        }
        if role == Role::User {
            self.count_take(me);
        }
        Some(BiasedGuard::new(self, Side::Locked))
    }

    /// Takes the favour away (under `locked`), and makes the next one harder to earn.
    fn revoke(&self) {
        self.favoured.store(0, Relaxed);
        let next = self.rebias.load(Relaxed).saturating_mul(2).min(MOST_REBIAS);
        self.rebias.store(next, Relaxed);
    }

    /// Counts a take by `me` (under `locked`); favours `me` after enough in a row.
    fn count_take(&self, me: u64) {
        if me == 0 {
            return;
        }
        let run = if self.last.load(Relaxed) == me {
            self.run.load(Relaxed).saturating_add(1)
        } else {
            self.last.store(me, Relaxed);
            1
        };
        self.run.store(run, Relaxed);
        if run >= self.rebias.load(Relaxed) && heavy_barrier_ready() {
            // Seen by every later taker, which reads it after its acquire of `locked`.
            self.favoured.store(me, Relaxed);
        }
    }
}

/// Who takes the lock on the shared side.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A thread that uses the slot: takes the favour away, counts towards its own.
    User,
    /// A drainer: waits, leaves the favour.
    Visitor,
}

/// Which way the guard's holder came in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    /// The favoured thread's plain stores.
    Favoured,
    /// The swap of `locked`.
    Locked,
}

/// The lock held; gives it back when dropped. Not `Send`: the favoured side's flag is
/// its thread's, and it is how that thread knows it is inside already.
pub struct BiasedGuard<'a, T> {
    lock: &'a BiasedLock<T>,
    side: Side,
    _not_send: PhantomData<*const ()>,
}

impl<'a, T> BiasedGuard<'a, T> {
    #[inline(always)]
    fn new(lock: &'a BiasedLock<T>, side: Side) -> Self {
        BiasedGuard {
            lock,
            side,
            _not_send: PhantomData,
        }
    }

    /// Whether the holder came in as the favoured thread (for tests and counters).
    pub fn is_favoured(&self) -> bool {
        self.side == Side::Favoured
    }
}

impl<T> Deref for BiasedGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard is the one holder of the lock (module docs), so no `&mut T`
        // exists elsewhere while it lives.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for BiasedGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for BiasedGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: the next holder sees every write made under this one.
        match self.side {
            Side::Favoured => self.lock.inside.store(false, Release),
            Side::Locked => self.lock.locked.store(false, Release),
        }
    }
}

thread_local! {
    /// The calling thread's token, 0 until first asked.
    static TOKEN: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's token: never 0, never reused by another thread of the process
/// (0 while the thread's locals are being destroyed: such a thread is never favoured).
#[inline(always)]
fn this_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    TOKEN
        .try_with(|t| {
            if t.get() == 0 {
                t.set(NEXT.fetch_add(1, Relaxed));
            }
            t.get()
        })
        .unwrap_or(0)
}

/// `membarrier` registration: unknown, registered, or not available.
static BARRIER: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const READY: u8 = 1;
const UNAVAILABLE: u8 = 2;

/// Whether [`heavy_barrier`] works, registering this process for it the first time.
fn heavy_barrier_ready() -> bool {
    match BARRIER.load(Relaxed) {
        READY => true,
        UNAVAILABLE => false,
        _ => {
            let ok = register_barrier();
            BARRIER.store(if ok { READY } else { UNAVAILABLE }, Relaxed);
            ok
        }
    }
}

#[cfg(not(miri))]
fn register_barrier() -> bool {
    use rustix::thread::{membarrier, MembarrierCommand};
    membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
}

#[cfg(miri)]
fn register_barrier() -> bool {
    false
}

/// A full memory barrier in every running thread of the process (module docs). Only
/// called with a thread favoured, which [`heavy_barrier_ready`] allowed; the registration
/// is the process's (a `fork` child inherits it). Should the kernel refuse anyway, there
/// is no sound way on: abort, as an allocator does on a broken invariant.
#[cfg(not(miri))]
fn heavy_barrier() {
    use rustix::thread::{membarrier, MembarrierCommand};
    if membarrier(MembarrierCommand::PrivateExpedited).is_err()
        && (!register_barrier() || membarrier(MembarrierCommand::PrivateExpedited).is_err())
    {
        let msg = b"zeronce: membarrier failed after it was registered; aborting\n";
        let _ = std::io::Write::write_all(&mut std::io::stderr(), msg);
        std::process::abort();
    }
}

#[cfg(miri)]
fn heavy_barrier() {
    std::sync::atomic::fence(SeqCst);
}

#[cfg(test)]
mod tests;
