//! A recording [`Discarder`] for tests, fuzzing and examples: no system calls; it records
//! every call, can pretend regions have any backing, can fail on request, and emulates
//! the zeroing of ops that guarantee zero by writing zeros through vm-memory.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::discard::DiscardError;
use crate::{Backing, DiscardOp};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::device::InterruptSignal;
use crate::discard::Discarder;

/// One recorded discard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscardCall {
    /// Start.
    pub gpa: GuestAddress,
    /// Length.
    pub len: u64,
    /// The op.
    pub op: DiscardOp,
    /// The backing it was told.
    pub backing: Backing,
}

/// A [`Discarder`] that records calls (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct RecordingDiscarder {
    /// Backing to report per region start; regions not listed are private anonymous.
    pub backings: HashMap<u64, Backing>,
    /// Discards starting at one of these addresses fail with an OS error.
    pub fail_at: HashSet<u64>,
    /// Whether to write zeros over ranges whose op guarantees zero (emulating the kernel).
    pub emulate_zeroing: bool,
    /// Every successful or failed discard, in order.
    pub calls: Vec<DiscardCall>,
    /// Every prefault, in order.
    pub prefaults: Vec<(GuestAddress, u64)>,
}

impl RecordingDiscarder {
    /// A recorder that also emulates zeroing.
    pub fn zeroing() -> RecordingDiscarder {
        RecordingDiscarder {
            emulate_zeroing: true,
            ..RecordingDiscarder::default()
        }
    }

    /// Total bytes in recorded calls.
    pub fn bytes(&self) -> u64 {
        self.calls.iter().map(|c| c.len).sum()
    }
}

impl<M: GuestMemoryBackend + ?Sized> Discarder<M> for RecordingDiscarder {
    fn backing(&mut self, _mem: &M, region_start: GuestAddress) -> Result<Backing, DiscardError> {
        Ok(self
            .backings
            .get(&region_start.0)
            .copied()
            .unwrap_or(Backing::PrivateAnonymous))
    }

    fn discard(
        &mut self,
        mem: &M,
        gpa: GuestAddress,
        len: u64,
        op: DiscardOp,
        backing: Backing,
    ) -> Result<(), DiscardError> {
        self.calls.push(DiscardCall {
            gpa,
            len,
            op,
            backing,
        });
        if self.fail_at.contains(&gpa.0) {
            return Err(DiscardError::Backend(Box::new(std::io::Error::other(
                format!("{op} failed (injected)"),
            ))));
        }
        // The device must never hand a discarder a range outside guest RAM.
        assert!(
            mem.check_range(gpa, len as usize),
            "device asked to discard {gpa:?}+{len:#x} outside guest memory"
        );
        // ... nor one spanning two regions (two mappings: the real bridge refuses it).
        let region = mem.find_region(gpa).expect("checked above");
        assert!(
            gpa.0 - region.start_addr().0 + len <= region.len(),
            "device asked to discard {gpa:?}+{len:#x} across the end of its region"
        );
        if self.emulate_zeroing && op.guarantees_zero(backing) {
            let zeros = vec![0u8; 64 * 1024];
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(zeros.len() as u64);
                mem.write_slice(&zeros[..n as usize], GuestAddress(gpa.0 + done))
                    .map_err(|_| DiscardError::NotInGuestMemory { gpa: gpa.0, len })?;
                done += n;
            }
        }
        Ok(())
    }

    fn prefault(&mut self, _mem: &M, gpa: GuestAddress, len: u64) -> Result<(), DiscardError> {
        self.prefaults.push((gpa, len));
        Ok(())
    }
}

/// Guest memory whose contents a hostile guest changes while the device reads it: `hook`
/// runs on the inner memory at every region lookup, with the address looked up, and
/// every guest memory access of the device makes one (reads of `avail.idx`, available
/// entries, descriptors, buffers). A hook may change `avail.idx`, the rings or buffers
/// between two reads of one call.
pub struct HookedMemory<M, F> {
    inner: M,
    hook: RefCell<F>,
}

impl<M, F: FnMut(&M, GuestAddress)> HookedMemory<M, F> {
    /// `inner` with `hook` run at every lookup (not re-entered by the hook's own accesses
    /// when it uses `inner`).
    pub fn new(inner: M, hook: F) -> Self {
        HookedMemory {
            inner,
            hook: RefCell::new(hook),
        }
    }

    /// The memory without the hook.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    fn run_hook(&self, addr: GuestAddress) {
        if let Ok(mut hook) = self.hook.try_borrow_mut() {
            hook(&self.inner, addr);
        }
    }
}

impl<M: GuestMemoryBackend, F: FnMut(&M, GuestAddress)> GuestMemoryBackend for HookedMemory<M, F> {
    type R = M::R;

    fn num_regions(&self) -> usize {
        self.inner.num_regions()
    }

    fn find_region(&self, addr: GuestAddress) -> Option<&M::R> {
        self.run_hook(addr);
        self.inner.find_region(addr)
    }

    fn iter(&self) -> impl Iterator<Item = &M::R> {
        self.inner.iter()
    }
}

/// An [`InterruptSignal`] that records what it was asked to signal.
#[derive(Debug, Default)]
pub struct RecordingInterrupt {
    used: std::sync::Mutex<Vec<u16>>,
    config_changes: std::sync::atomic::AtomicU64,
}

impl RecordingInterrupt {
    /// Queue indices signalled since the last call, in order.
    pub fn take_used(&self) -> Vec<u16> {
        std::mem::take(&mut *self.used.lock().expect("not poisoned"))
    }

    /// Configuration-change signals so far.
    pub fn config_changes(&self) -> u64 {
        self.config_changes
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl InterruptSignal for RecordingInterrupt {
    fn signal_used_queue(&self, queue_index: u16) {
        self.used.lock().expect("not poisoned").push(queue_index);
    }

    fn signal_config_change(&self) {
        self.config_changes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}
