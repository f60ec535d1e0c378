//! [`Builder`]: what building a process-mode and a VM-mode memory share (the RAM and the
//! manager's settings), one setter each. Each mode adds its own setters and `build` on
//! `Builder<ItsMode>`, where its mode type holds what only it has.

use zeronce_mem::BackingKind;
use zeronce_mm::{Order, ReportedNotZero, DEFAULT_MAX_ORDER};

/// Builder of a process-mode memory (`ProcessBuilder`, from `ProcessMemory::builder`) or a
/// VM-mode memory (`VmBuilder`, from `VmMemory::builder`): the setters both share are
/// here, `M` holds what only that mode has.
#[derive(Clone, Debug)]
pub struct Builder<M> {
    pub(crate) size: usize,
    pub(crate) backing: BackingKind,
    pub(crate) manager: ManagerSettings,
    /// What only this mode has.
    pub(crate) mode: M,
}

/// The manager settings both modes take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ManagerSettings {
    /// Largest block order.
    pub(crate) max_order: Order,
    /// Verify mode: skipped zeroing and zero claims are checked by reading memory.
    pub(crate) verify: bool,
    /// Never-touched memory counts as known zero and reported.
    pub(crate) fresh_is_zero: bool,
    /// What backs reported blocks the host did not promise zero (decided by the host
    /// policy, not by the caller).
    pub(crate) reported_not_zero: ReportedNotZero,
}

impl Default for ManagerSettings {
    /// Max order 10 (4 MiB), no verify mode, fresh memory known zero.
    fn default() -> Self {
        ManagerSettings {
            max_order: DEFAULT_MAX_ORDER,
            verify: false,
            fresh_is_zero: true,
            reported_not_zero: ReportedNotZero::Discarded,
        }
    }
}

impl<M> Builder<M> {
    /// A builder of `size` bytes over `backing`, default manager settings.
    pub(crate) fn with(size: usize, backing: BackingKind, mode: M) -> Self {
        Builder {
            size,
            backing,
            manager: ManagerSettings::default(),
            mode,
        }
    }

    /// Bytes of RAM (default 1 GiB; in VM mode the ring area included); a multiple of the
    /// backing's page size.
    pub fn size(mut self, bytes: usize) -> Self {
        self.size = bytes;
        self
    }

    /// What backs the RAM (default: private anonymous with THP in process mode, a memfd
    /// in VM mode, which needs file-backed RAM).
    pub fn backing(mut self, kind: BackingKind) -> Self {
        self.backing = kind;
        self
    }

    /// Largest block order (default 10, 4 MiB).
    pub fn max_order(mut self, order: Order) -> Self {
        self.manager.max_order = order;
        self
    }

    /// Verify mode: every skipped zeroing and zero claim is checked by reading memory. In
    /// VM mode those reads fault discarded pages back into the memfd (shmem and hugetlbfs
    /// allocate on a read fault), so the memfd does not shrink in verify mode.
    pub fn verify(mut self, on: bool) -> Self {
        self.manager.verify = on;
        self
    }

    /// Whether never-touched memory counts as known zero and reported (default `true`:
    /// it is not resident and reads zero). `false` makes the allocator zero it like any
    /// dirty memory (baselines).
    pub fn fresh_is_zero(mut self, on: bool) -> Self {
        self.manager.fresh_is_zero = on;
        self
    }
}
