//! The `unsafe` half of a global allocator that sends large allocations to a safe backend
//! and the rest to an inner allocator ([`SplitAlloc`]). zeronce's process-mode backend
//! (`zeronce::ZeronceAlloc`) implements [`LargeAlloc`] in safe code; the `unsafe impl
//! GlobalAlloc` and every pointer operation are here.
//!
//! Rules kept for every [`GlobalAlloc`] call: nothing panics across it (a panicking
//! backend call counts as "not served"), a thread never re-enters the backend (its own
//! nested allocations, e.g. while the backend initialises, go to the inner allocator), and
//! every pointer is given back to whoever handed it out (the backend says which addresses
//! are its own; it answers without allocating).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Memory a [`LargeAlloc`] hands out: the first byte of an exclusively claimed range of
/// at least the requested size. Only built from a [`crate::RamRange`] (or a slice) the
/// backend holds, and keeps, until [`LargeAlloc::dealloc`] of the same address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    addr: usize,
    len: usize,
}

impl Grant {
    /// The bytes of `bytes` (held by the backend until their address is deallocated).
    pub fn of(bytes: &mut [u8]) -> Grant {
        Grant {
            addr: bytes.as_mut_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// Its address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The safe backend of a [`SplitAlloc`]. Contract (what the `unsafe impl` relies on): a
/// [`Grant`] returned by `alloc` or `grow` stays valid and exclusive to the caller until
/// `dealloc` of its address, and `owns` is true for every address of a live grant (it may
/// be true for the whole range grants come from: `dealloc` then tells a foreign address).
/// Implementations must not allocate in `owns`.
pub trait LargeAlloc: Sync {
    /// Sizes from this one up are offered to the backend.
    fn threshold(&self) -> usize;
    /// A grant of at least `layout.size()` bytes aligned to `layout.align()`, reading zero
    /// if `zeroed`; `None`: not served here (the inner allocator is asked).
    fn alloc(&self, layout: Layout, zeroed: bool) -> Option<Grant>;
    /// Whether `addr` lies where this backend's grants are (cheap, no lock: it routes a
    /// free to its allocator).
    fn owns(&self, addr: usize) -> bool;
    /// Ends the grant at `addr`; `false` if `addr` (owned) is not the address of a live
    /// grant: a double free, or a pointer never handed out.
    fn dealloc(&self, addr: usize) -> bool;
    /// The bytes the caller of the live grant at `addr` may use (at least the size asked
    /// for); `None` if `addr` is not the address of a live grant.
    fn usable_size(&self, addr: usize) -> Option<usize>;
    /// Makes the grant at `addr` (owned) at least `new_size` bytes without moving it;
    /// `None` if it cannot (the caller moves it).
    fn grow(&self, addr: usize, new_size: usize) -> Option<Grant>;
}

thread_local! {
    /// Set while this thread runs backend code.
    static IN_BACKEND: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as backend code on this thread, unless it already is (or thread-local storage
/// is gone, during thread exit): `None` then, or if `f` panicked. Every call into a
/// [`LargeAlloc`] that may allocate goes through it, so the backend's own allocations
/// (and a C `malloc` interposer's) reach the inner allocator instead of re-entering it.
pub fn in_backend<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    let entered = IN_BACKEND.try_with(|b| !b.replace(true)).unwrap_or(false);
    if !entered {
        return None;
    }
    let r = catch_unwind(AssertUnwindSafe(f)).ok().flatten();
    let _ = IN_BACKEND.try_with(|b| b.set(false));
    r
}

/// A global allocator: sizes from `large.threshold()` up go to `large`, the rest (and
/// whatever `large` declines) to `inner`.
#[derive(Debug)]
pub struct SplitAlloc<A, L> {
    inner: A,
    large: L,
}

impl<A, L> SplitAlloc<A, L> {
    /// Splits between `inner` and `large`.
    pub const fn new(inner: A, large: L) -> Self {
        SplitAlloc { inner, large }
    }

    /// The backend.
    pub fn large(&self) -> &L {
        &self.large
    }

    /// The inner allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }
}

impl<A: GlobalAlloc, L: LargeAlloc> SplitAlloc<A, L> {
    fn owns(&self, ptr: *mut u8) -> bool {
        // `owns` never allocates; no re-entry guard needed (and none may be taken: a
        // nested dealloc must still find its owner).
        catch_unwind(AssertUnwindSafe(|| self.large.owns(ptr as usize))).unwrap_or(false)
    }

    fn large_alloc(&self, layout: Layout, zeroed: bool) -> Option<*mut u8> {
        if layout.size() < self.large.threshold() {
            return None;
        }
        let g = in_backend(|| self.large.alloc(layout, zeroed))?;
        (g.len >= layout.size() && g.addr % layout.align() == 0).then_some(g.addr as *mut u8)
    }
}

// SAFETY: every pointer handed out comes either from `inner` (a `GlobalAlloc`, called with
// the same layouts and returned to it) or from a `LargeAlloc` grant, which by the trait's
// contract is valid, exclusive, large and aligned enough (checked above) until its
// `dealloc`; `owns` routes each pointer back to its allocator. Nothing unwinds out.
unsafe impl<A: GlobalAlloc, L: LargeAlloc> GlobalAlloc for SplitAlloc<A, L> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.large_alloc(layout, false) {
            Some(p) => p,
            // SAFETY: forwarded with the caller's guarantees on `layout`.
            None => unsafe { self.inner.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.large_alloc(layout, true) {
            Some(p) => p,
            // SAFETY: as `alloc`.
            None => unsafe { self.inner.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.owns(ptr) {
            // A thread inside the backend may free one of its grants (e.g. during a
            // panic): the backend is re-entered for deallocation only through this path.
            // A `false` (not a live grant) cannot be told to a `GlobalAlloc` caller.
            let addr = ptr as usize;
            let _ = catch_unwind(AssertUnwindSafe(|| self.large.dealloc(addr)));
        } else {
            // SAFETY: not a grant, so it came from `inner` with this layout.
            unsafe { self.inner.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let ours = self.owns(ptr);
        if ours && new_size >= self.large.threshold() {
            let addr = ptr as usize;
            if in_backend(|| self.large.grow(addr, new_size)).is_some() {
                return ptr;
            }
        }
        if !ours && new_size < self.large.threshold() {
            // SAFETY: `ptr` came from `inner` with `layout`; the caller's guarantees hold.
            return unsafe { self.inner.realloc(ptr, layout, new_size) };
        }
        // Moving between the two, or a grant that cannot grow in place: copy.
        // SAFETY: `new_size` is non-zero and, rounded to `align`, fits `isize` (caller).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a valid layout, as above.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` is live with `layout`, and no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}
