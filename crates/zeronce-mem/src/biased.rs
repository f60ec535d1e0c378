//! [`BiasedLock`]: a try-lock that the one thread using it takes with plain stores.
//!
//! A per-CPU slot is taken and given back at every allocation and free of the fast path.
//! With a test-and-set lock that is one locked instruction per take (the give-back is a
//! plain store), and on x86 a locked instruction waits for the store buffer to drain: on
//! the 2-vCPU guests zeronce is measured on, it was a third of an alloc+free pair that
//! stays on the slot. Almost always the thread taking a slot is the one that took it
//! last, so the slot is *biased* to that thread, as the JVM biased its monitors:
//!
//! - **The favoured thread** enters with a load of its own `inside` flag (set: it is
//!   inside already), a plain store of it, a compiler fence and two loads (`locked`, then
//!   `favoured` again), and leaves with a plain store. No locked instruction, no fence
//!   instruction.
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
//! (two threads use the slot); [`BiasedLock::lock`], the drainers' way in, leaves it (and
//! pays one membarrier a visit while a thread is favoured). A user that finds the
//! favoured thread inside (after a short spin: preempted there) gives way, but ends the
//! favour anyway, marking it *revoking*: from then on no thread enters favoured (an entry
//! fenced after the marker's membarrier sees `locked` or the marker's release of it, and
//! with it the mark), and the next taker only waits for `inside` to clear (the marker saw
//! it set after its membarrier, and the next taker's acquire of `locked` comes after that
//! read), so one membarrier ends a favour however long its thread stays preempted.
//!
//! **One writer of `inside`.** The argument needs `inside` written by one thread only,
//! but a thread whose favour ended may still be between its load of `favoured` (its own
//! token) and its stores to `inside`, preempted there; were the favour given to another
//! thread meanwhile, its late "not inside" could land while the new one is inside. So
//! each favour has an `owner`, and the favour goes to no other thread until the owner has
//! been seen past that point: reading `favoured` not its own while it holds `locked`, or
//! ending (a thread-exit hook clears what it owns, and the thread is never favoured
//! again). That hook keeps a reference to the lock, so only a `'static` lock favours
//! ([`BiasedLock::try_lock_unfavoured`] is the plain test-and-set way in for the others).
//! An owner that lives on without taking the lock the shared way again keeps the lock
//! from favouring anyone else while it lives (for the per-CPU slots nothing is lost: the
//! owner is a live thread on the slot, so no other is alone there).
//!
//! **`fork`.** A child inherits every flag. A lock favoured to a parent thread that did
//! not fork is never favoured again in the child; one whose `inside` was set in the
//! parent (a thread inside, or backing off) stays taken in the child, as a test-and-set
//! lock taken across a `fork` does. zeronce's global allocators hold callers' large calls
//! out of the slots across a `fork` (their fork gate), so no caller leaves a slot taken or
//! half-entered in the child; a slot favoured to a parent thread that did not fork only
//! loses its bias there.
//!
//! A thread that took the lock [`BiasedLock::rebias_after`] times in a row (visits not
//! counted) becomes the favoured one, if no other thread owns the favour and the
//! caller's `alone` test agrees ([`BiasedLock::try_lock_favouring_if`]). Each revocation
//! doubles that count, so users that take turns on a lock cost at most one membarrier
//! per 64 Ki takes.
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
/// Spins a user that revokes the favour waits for the favoured thread to leave (a few
/// microseconds at most; the favoured thread holds the lock for one list operation).
const USER_SPINS: u32 = 200;
/// `favoured` while the favour is being taken away from a thread that may still be
/// inside: no thread enters favoured, and the next taker waits for `inside` to clear
/// without a membarrier (never a thread's token: those count up from 1).
const REVOKING: u64 = u64::MAX;

/// A lock around `T` whose favoured thread takes it with plain stores (module docs).
pub struct BiasedLock<T> {
    /// Held by a taker that is not the favoured thread inside.
    locked: AtomicBool,
    /// The favoured thread is inside: written only by the `owner` thread (by nobody while
    /// `owner` is 0).
    inside: AtomicBool,
    /// The one thread that may be favoured, 0 for any. A thread whose favour ended may
    /// still be between its load of `favoured` (its own token) and its stores to `inside`
    /// (preempted there), so the favour goes to no other thread until this one has been
    /// seen past that point: taking the lock on the shared side (under `locked`), or
    /// ending (its thread-exit hook, [`OWNS`], clears it).
    owner: AtomicU64,
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
            owner: AtomicU64::new(0),
            favoured: AtomicU64::new(0),
            last: AtomicU64::new(0),
            run: AtomicU32::new(0),
            rebias: AtomicU32::new(FIRST_REBIAS),
            data: UnsafeCell::new(data),
        }
    }

    /// Takes the lock if no other thread holds it (nor this one: it is not reentrant).
    /// A thread that is not favoured takes the favour away from the thread that is. Only
    /// a `'static` lock favours: its owner's thread-exit hook must be able to reach it.
    #[inline(always)]
    pub fn try_lock(&'static self) -> Option<BiasedGuard<'static, T>> {
        self.try_lock_favouring_if(|| true)
    }

    /// [`BiasedLock::try_lock`], where the calling thread may earn the favour only if
    /// `alone()` says so when it has taken the lock enough times in a row (a per-CPU slot
    /// favours a thread only while no other live thread shares the slot: threads that
    /// take turns on one slot would pass the favour back and forth, a membarrier each).
    #[inline(always)]
    pub fn try_lock_favouring_if(
        &'static self,
        alone: fn() -> bool,
    ) -> Option<BiasedGuard<'static, T>> {
        let me = this_thread();
        if self.favours(me) {
            return self.enter_favoured(me);
        }
        let favouring = Favouring {
            alone,
            owner: &self.owner,
        };
        self.try_take(me, Role::User(Some(favouring)))
    }

    /// Takes the lock if no other thread holds it, and never favours the caller: a plain
    /// test-and-set lock (for a lock that is not `'static`).
    #[inline]
    pub fn try_lock_unfavoured(&self) -> Option<BiasedGuard<'_, T>> {
        self.try_take(this_thread(), Role::User(None))
    }

    /// Takes the lock, waiting out its holder, and leaves the favour where it is (a favour
    /// being revoked it finishes revoking): the way in of a thread that visits every slot
    /// now and then (a drain).
    pub fn lock(&self) -> BiasedGuard<'_, T> {
        let me = this_thread();
        loop {
            if self.favours(me) {
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
        self.favours(this_thread())
    }

    /// Whether the thread of token `me` is the favoured one (0: a thread that has none).
    #[inline(always)]
    fn favours(&self, me: u64) -> bool {
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
    #[inline]
    fn try_take(&self, me: u64, role: Role) -> Option<BiasedGuard<'_, T>> {
        if self.locked.swap(true, Acquire) {
            return None;
        }
        let favoured = self.favoured.load(Relaxed);
        if me != 0 && favoured != me && self.owner.load(Relaxed) == me {
            // Under `locked` this thread read `favoured` as not its own (only it writes
            // its token there): it writes `inside` no more until it is favoured again.
            self.owner.store(0, Relaxed);
        }
        if favoured != 0 && favoured != me {
            if favoured != REVOKING {
                // The favoured thread may be inside unseen: the heavy half of the fence.
                heavy_barrier();
            }
            // (After `REVOKING` no thread enters favoured; the one that may still be
            // inside was seen there by the taker that wrote it, and this taker's acquire
            // of `locked` comes after that read, so `inside` reads true or its release.)
            let out = match role {
                // A user waits a little (the favoured thread is inside for one operation
                // unless preempted there), then gives way as to any holder. The favour
                // ends either way, so the next taker needs no membarrier.
                Role::User(..) => self.left_soon(),
                Role::Visitor => {
                    while self.inside.load(Acquire) {
                        std::thread::yield_now();
                    }
                    true
                }
            };
            if matches!(role, Role::User(..)) || favoured == REVOKING {
                self.end_favour(if out { 0 } else { REVOKING });
            }
            if !out {
                self.locked.store(false, Release);
                return None;
            }
        }
        if let Role::User(Some(favouring)) = role {
            self.count_take(me, favouring);
        }
        Some(BiasedGuard::new(self, Side::Locked))
    }

    /// Whether the favoured thread is not inside, or leaves within a short spin (it is
    /// inside for one operation unless it was preempted there).
    fn left_soon(&self) -> bool {
        for _ in 0..USER_SPINS {
            if !self.inside.load(Acquire) {
                return true;
            }
            std::hint::spin_loop();
        }
        !self.inside.load(Acquire)
    }

    /// Takes the favour away (under `locked`): `0` once the favoured thread is known to
    /// be out, [`REVOKING`] while it may still be inside; the first end of a favour makes
    /// the next one harder to earn.
    fn end_favour(&self, to: u64) {
        if self.favoured.load(Relaxed) != REVOKING {
            let next = self.rebias.load(Relaxed).saturating_mul(2).min(MOST_REBIAS);
            self.rebias.store(next, Relaxed);
        }
        self.favoured.store(to, Relaxed);
    }

    /// Counts a take by `me` (under `locked`); favours `me` after enough in a row, if
    /// no other thread owns the favour, `alone()` agrees and `me`'s exit hook can take
    /// this lock's `owner` word.
    fn count_take(&self, me: u64, Favouring { alone, owner }: Favouring) {
        if me == 0 || me == ENDED {
            return;
        }
        let run = if self.last.load(Relaxed) == me {
            self.run.load(Relaxed).saturating_add(1)
        } else {
            self.last.store(me, Relaxed);
            1
        };
        if run < self.rebias.load(Relaxed) {
            self.run.store(run, Relaxed);
        } else if self.owner.load(Acquire) == 0
            && alone()
            && heavy_barrier_ready()
            && owned_until_exit(owner, me)
        {
            // Seen by every later taker, which reads them after its acquire of `locked`.
            self.owner.store(me, Relaxed);
            self.favoured.store(me, Relaxed);
        } else {
            // Asked again after as many takes more, not at each.
            self.run.store(0, Relaxed);
        }
    }
}

/// Who takes the lock on the shared side.
#[derive(Clone, Copy)]
enum Role {
    /// A thread that uses the slot: takes the favour away. With the `alone` test and the
    /// lock's `owner` word as `'static` (a lock that may favour), its takes count towards
    /// its own favour; without, nothing is counted (a plain test-and-set take).
    User(Option<Favouring>),
    /// A drainer: waits, leaves the favour.
    Visitor,
}

/// What a take needs to count towards a favour: the caller's `alone` test and the lock's
/// `owner` word, reached as `'static` (the owner's exit hook keeps it).
#[derive(Clone, Copy)]
struct Favouring {
    alone: fn() -> bool,
    owner: &'static AtomicU64,
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
    /// The calling thread's token, 0 until first asked, [`ENDED`] once its exit hook ran.
    static TOKEN: Cell<u64> = const { Cell::new(0) };
    /// The `owner` words of the locks whose favour this thread owns, cleared when it ends.
    static OWNS: Owns = const { Owns([const { Cell::new(None) }; OWNS_MOST]) };
}

/// [`TOKEN`] of a thread whose exit hook ran: it is never favoured again (not
/// [`REVOKING`], nor a token [`this_thread`] hands out).
const ENDED: u64 = u64::MAX - 1;

/// Locks a thread may own the favour of at once (one slot per kind of slot); a cell whose
/// lock's favour went to another owner is used again.
const OWNS_MOST: usize = 4;

/// A thread's owned `owner` words (see [`BiasedLock`]'s `owner`).
struct Owns([Cell<Option<&'static AtomicU64>>; OWNS_MOST]);

impl Drop for Owns {
    /// The thread ends: from now on it is never favoured (its token reads as [`ENDED`]),
    /// so it writes no `inside` again, and the favour of its locks may go to others.
    fn drop(&mut self) {
        let me = TOKEN.try_with(|t| t.replace(ENDED)).unwrap_or(0);
        for word in self.0.iter().filter_map(Cell::get) {
            // Only if still this thread's: a taker under `locked` may have cleared it.
            // Release: the next owner (its acquire in `count_take`) sees this thread's last
            // `inside = false` before it stores its own.
            let _ = word.compare_exchange(me, 0, Release, Relaxed);
        }
    }
}

/// Records `word` for the exit hook of the calling thread (`me`); `false` (do not favour
/// it) when the thread's locals are going or it owns as many already.
fn owned_until_exit(word: &'static AtomicU64, me: u64) -> bool {
    OWNS.try_with(|owns| {
        let free = owns.0.iter().find(|c| {
            c.get()
                .is_none_or(|w| std::ptr::eq(w, word) || w.load(Relaxed) != me)
        });
        free.map(|c| c.set(Some(word))).is_some()
    })
    .unwrap_or(false)
}

/// The calling thread's token: never 0, never reused by another thread of the process;
/// [`ENDED`] once its exit hook ran, which no favour ever names.
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
