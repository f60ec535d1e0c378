//! Discard policies, the [`Discarder`] effect trait, and the execution of discard plans.
//!
//! Queue handlers only *plan* (pure: which guest ranges, which op, which promise); a
//! [`Discarder`] performs the effects. [`MmapDiscarder`] is the real one (through
//! `zeronce-mem`'s vm-memory bridge, where the `unsafe` lives); `mock::RecordingDiscarder`
//! (feature `test-utils`) records calls for tests.
//!
//! # Policies and what bits 6 / 7 can honestly promise
//!
//! | policy | op | when | zero promise |
//! |---|---|---|---|
//! | [`DiscardPolicy::Immediate`] | best op for the backing (DONTNEED / punch hole) | before the descriptor is used | iff the op guarantees zero for the backing and succeeded |
//! | [`DiscardPolicy::Hold`] | same | at the first [`crate::BalloonDevice::tick`] after the deadline; **the descriptor is held until then** | same, decided at completion |
//! | [`DiscardPolicy::Lazy`] | `MADV_FREE` (private anonymous); best op elsewhere (the fallback of [`DiscardPolicy::op_for`]) | before the descriptor is used | never |
//!
//! Why `Hold` holds the descriptor instead of acknowledging at once and discarding later:
//! once a reporting buffer is used, the guest puts the pages back on its free lists and may
//! allocate and write them at any time, so a later discard would destroy live guest data,
//! and "no promise" would not make that safe. Holding the descriptor is the only honest
//! way: the guest cannot reuse reported pages (or deflate inflated ones, spec: "MUST NOT
//! request deflation … before the device has acknowledged the inflate request") until the
//! device uses the buffer, and by then the discard has happened and its promise is exact.
//! The cost is that the guest's reporting / balloon worker waits up to the delay. At most
//! a queue's worth of requests, and at most
//! [`MAX_HELD_BYTES`](crate::spec::limits::MAX_HELD_BYTES) of work in all (inflate PFNs
//! and reported blocks), are held; a request beyond that is served at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use zeronce_mem::{
    describe_region, discard_guest_range, populate_guest_range, Backing, DiscardOp,
    GuestDiscardError,
};
use zeronce_types::clock::deadline_after;

/// Why a [`Discarder`] could not describe or discard a guest range. The device only logs
/// it and counts it (`discard_errors`): a failed discard never promises zero. A VMM that
/// implements [`Discarder`] itself builds these without depending on `zeronce-mem`.
#[derive(Debug, thiserror::Error)]
pub enum DiscardError {
    /// The range is not inside one region of guest memory.
    #[error("guest range {gpa:#x}+{len:#x} is not inside one region of guest memory")]
    NotInGuestMemory {
        /// Guest physical start address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The memory backend refused or failed the operation.
    #[error("discard failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<GuestDiscardError> for DiscardError {
    fn from(e: GuestDiscardError) -> DiscardError {
        match e {
            GuestDiscardError::NotInGuestMemory { gpa, len }
            | GuestDiscardError::CrossesRegion { gpa, len } => {
                DiscardError::NotInGuestMemory { gpa, len }
            }
            other => DiscardError::Backend(Box::new(other)),
        }
    }
}

/// When and how a host discards memory it is given: the device's policy, and process
/// mode's (`zeronce::ProcessMemory`, where the Linux kernel is the host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DiscardPolicy {
    /// Discard at once (default); the memory reads zero from then on where the op
    /// guarantees it.
    #[default]
    Immediate,
    /// Keep the memory resident for the given time, then discard it. The device holds the
    /// descriptor until then (discarding from [`crate::BalloonDevice::tick`]) and uses it
    /// with the verdict: once used, the guest may reuse the pages. Process mode answers
    /// "not zero" at once and discards in a settle pass after the hold, so an allocation
    /// in that window takes the block back without a fault.
    Hold(Duration),
    /// `MADV_FREE`: the host takes the memory only under pressure and old contents may
    /// survive, so it never promises zero.
    Lazy,
}

impl DiscardPolicy {
    /// The names of the policies, as every front door spells them (`zeronce serve
    /// --host`, `ZERONCE_HOST`): [`DiscardPolicy::from_name`] reads them.
    pub const NAMES: [&'static str; 3] = ["immediate", "hold", "lazy"];

    /// The policy called `name` (one of [`DiscardPolicy::NAMES`]), `hold` being the delay
    /// of `"hold"`; `None` for any other name.
    pub fn from_name(name: &str, hold: Duration) -> Option<DiscardPolicy> {
        match name {
            "immediate" => Some(DiscardPolicy::Immediate),
            "hold" => Some(DiscardPolicy::Hold(hold)),
            "lazy" => Some(DiscardPolicy::Lazy),
            _ => None,
        }
    }

    /// The name [`DiscardPolicy::from_name`] reads (the delay of `Hold` left out).
    pub fn name(self) -> &'static str {
        match self {
            DiscardPolicy::Immediate => "immediate",
            DiscardPolicy::Hold(_) => "hold",
            DiscardPolicy::Lazy => "lazy",
        }
    }

    /// The op this policy uses on `backing`: `Ok` with the policy's own op, or, where that
    /// does not work on `backing` (only [`DiscardPolicy::Lazy`]: `MADV_FREE` is for
    /// private anonymous memory), `Err` with the fallback, the backing's best op, still
    /// without a zero promise ([`DiscardPolicy::promises_zero`]). The one rule for both
    /// hosts; each says at its call what it does with `Err`: the device takes the fallback
    /// (it learns each region's backing per request and must serve it), process mode
    /// refuses the policy (it knows its one backing before it starts).
    pub fn op_for(self, backing: Backing) -> Result<DiscardOp, DiscardOp> {
        match self {
            DiscardPolicy::Lazy if DiscardOp::Free.supported_on(backing) => Ok(DiscardOp::Free),
            DiscardPolicy::Lazy => Err(DiscardOp::best_for(backing)),
            DiscardPolicy::Immediate | DiscardPolicy::Hold(_) => Ok(DiscardOp::best_for(backing)),
        }
    }

    /// Whether a successful discard of `backing` under this policy (its op or the
    /// fallback) reads zero afterwards.
    pub fn promises_zero(self, backing: Backing) -> bool {
        let op = self.op_for(backing).unwrap_or_else(|fallback| fallback);
        self != DiscardPolicy::Lazy && op.guarantees_zero(backing)
    }
}

/// The effects of discarding guest memory, as the device needs them. Implemented for
/// real guest memory by [`MmapDiscarder`], and by a recording mock for tests.
pub trait Discarder<M: GuestMemoryBackend + ?Sized> {
    /// The backing of the region starting at `region_start`.
    fn backing(&mut self, mem: &M, region_start: GuestAddress) -> Result<Backing, DiscardError>;

    /// Discards `[gpa, gpa + len)` (inside one region, aligned to `backing`'s page size).
    fn discard(
        &mut self,
        mem: &M,
        gpa: GuestAddress,
        len: u64,
        op: DiscardOp,
        backing: Backing,
    ) -> Result<(), DiscardError>;

    /// Pre-faults `[gpa, gpa + len)` after a deflate (only called when configured).
    fn prefault(&mut self, _mem: &M, _gpa: GuestAddress, _len: u64) -> Result<(), DiscardError> {
        Ok(())
    }
}

/// The real discarder for [`GuestMemoryMmap`] memory: derives each region's backing from
/// vm-memory (cached per region) and discards through `zeronce-mem`'s vm-memory bridge.
#[derive(Debug, Default)]
pub struct MmapDiscarder {
    hugetlb_page_size: Option<usize>,
    /// Backing per region start, with the region's host address and length when it was
    /// described: a VMM that remaps or resizes a region misses the cache.
    cache: HashMap<u64, (usize, u64, Backing)>,
}

impl MmapDiscarder {
    /// A discarder detecting backings itself (hugetlbfs page size from the file).
    pub fn new() -> MmapDiscarder {
        MmapDiscarder::default()
    }

    /// A discarder treating every file-backed region as hugetlb with `page_size` pages.
    pub fn with_hugetlb_page_size(page_size: usize) -> MmapDiscarder {
        MmapDiscarder {
            hugetlb_page_size: Some(page_size),
            cache: HashMap::new(),
        }
    }
}

/// One region of guest memory as [`MmapDiscarder::learn`] found it.
#[derive(Debug)]
pub struct RegionBacking {
    /// Guest physical start.
    pub start: GuestAddress,
    /// Length in bytes.
    pub len: u64,
    /// Its backing, or why none can be used (its requests are then refused, counted).
    pub backing: Result<Backing, DiscardError>,
}

impl MmapDiscarder {
    /// Learns the backing of every region of `mem` at once (a VMM's new memory table:
    /// vhost-user `SET_MEM_TABLE`, `ADD_MEM_REG`), forgetting the regions that are gone,
    /// so that each request finds its region's backing known; what it found, per region.
    pub fn learn<B: Bitmap>(&mut self, mem: &GuestMemoryMmap<B>) -> Vec<RegionBacking> {
        self.cache.clear();
        mem.iter()
            .map(|r| RegionBacking {
                start: r.start_addr(),
                len: r.len(),
                backing: self.backing(mem, r.start_addr()),
            })
            .collect()
    }
}

impl<B: Bitmap> Discarder<GuestMemoryMmap<B>> for MmapDiscarder {
    fn backing(
        &mut self,
        mem: &GuestMemoryMmap<B>,
        region_start: GuestAddress,
    ) -> Result<Backing, DiscardError> {
        let key = mem
            .find_region(region_start)
            .map(|r| (r.as_ptr() as usize, r.len()));
        if let (Some((host, len)), Some(&(h, l, b))) = (key, self.cache.get(&region_start.0)) {
            if (host, len) == (h, l) {
                return Ok(b);
            }
        }
        let info = describe_region(mem, region_start, self.hugetlb_page_size)?;
        if let Some((host, len)) = key {
            self.cache.insert(region_start.0, (host, len, info.backing));
        }
        Ok(info.backing)
    }

    fn discard(
        &mut self,
        mem: &GuestMemoryMmap<B>,
        gpa: GuestAddress,
        len: u64,
        op: DiscardOp,
        backing: Backing,
    ) -> Result<(), DiscardError> {
        Ok(discard_guest_range(mem, gpa, len, op, backing)?)
    }

    fn prefault(
        &mut self,
        mem: &GuestMemoryMmap<B>,
        gpa: GuestAddress,
        len: u64,
    ) -> Result<(), DiscardError> {
        Ok(populate_guest_range(mem, gpa, len)?)
    }
}

/// One planned discard of a validated guest range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedDiscard {
    /// Start (aligned to the backing's page size).
    pub gpa: GuestAddress,
    /// Length (multiple of the backing's page size).
    pub len: u64,
    /// The region's backing.
    pub backing: Backing,
    /// Inflate bitmap bits (PFN positions in the request) covered by this range.
    pub bits: Vec<u32>,
}

/// What a plan's successful ranges yield.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PlanResult {
    /// Bytes discarded successfully.
    pub bytes: u64,
    /// Whether every range was discarded with a zero guarantee.
    pub all_zero: bool,
    /// Bitmap bits of ranges discarded with a zero guarantee.
    pub zero_bits: Vec<u32>,
    /// Discards that failed.
    pub errors: u64,
}

/// Runs `plan` with `policy`'s op through `discarder`. `promise` = whether zero promises
/// may be made at all (bits 6/7 in effect, not poisoned, not confidential).
pub(crate) fn execute<M, D>(
    plan: &[PlannedDiscard],
    policy: DiscardPolicy,
    promise: bool,
    mem: &M,
    discarder: &mut D,
) -> PlanResult
where
    M: GuestMemoryBackend + ?Sized,
    D: Discarder<M> + ?Sized,
{
    let mut r = PlanResult {
        all_zero: promise,
        ..PlanResult::default()
    };
    for p in plan {
        // The device serves every region, so it takes the fallback (see `op_for`).
        let op = policy.op_for(p.backing).unwrap_or_else(|fallback| fallback);
        match discarder.discard(mem, p.gpa, p.len, op, p.backing) {
            Ok(()) => {
                r.bytes += p.len;
                if promise && policy.promises_zero(p.backing) {
                    r.zero_bits.extend_from_slice(&p.bits);
                } else {
                    r.all_zero = false;
                }
            }
            Err(e) => {
                // Counted; the device logs failures rate-limited (a guest can cause many).
                tracing::debug!(gpa = p.gpa.0, len = p.len, %op, error = %e, "discard failed");
                r.errors += 1;
                r.all_zero = false;
            }
        }
    }
    r
}

/// The deadline for a request held under `policy` at `now` (`None`: not held). A delay
/// past what the clock can represent (`Duration::MAX`) holds "forever" instead of
/// panicking on the first request.
pub(crate) fn hold_deadline(policy: DiscardPolicy, now: Instant) -> Option<Instant> {
    match policy {
        DiscardPolicy::Hold(delay) => Some(deadline_after(now, delay)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HUGE: Backing = Backing::Hugetlb { page_size: 2 << 20 };

    #[test]
    fn lazy_never_promises_and_uses_free_where_possible() {
        let lazy = DiscardPolicy::Lazy;
        assert_eq!(lazy.op_for(Backing::PrivateAnonymous), Ok(DiscardOp::Free));
        assert_eq!(lazy.op_for(Backing::SharedFile), Err(DiscardOp::PunchHole));
        for b in [Backing::PrivateAnonymous, Backing::SharedFile, HUGE] {
            assert!(!lazy.promises_zero(b));
            assert!(DiscardPolicy::Immediate.promises_zero(b));
            let held = DiscardPolicy::Hold(Duration::from_secs(1));
            assert!(held.promises_zero(b));
        }
    }

    #[test]
    fn names_read_back() {
        let d = Duration::from_millis(250);
        for name in DiscardPolicy::NAMES {
            let p = DiscardPolicy::from_name(name, d).unwrap();
            assert_eq!(p.name(), name);
        }
        assert_eq!(
            DiscardPolicy::from_name("hold", d),
            Some(DiscardPolicy::Hold(d))
        );
        assert_eq!(DiscardPolicy::from_name("Hold", d), None);
        assert_eq!(DiscardPolicy::from_name("zero-then-report", d), None);
    }

    #[test]
    fn hold_deadline_only_for_held() {
        let now = Instant::now();
        let d = Duration::from_millis(5);
        assert_eq!(hold_deadline(DiscardPolicy::Hold(d), now), Some(now + d));
        assert_eq!(hold_deadline(DiscardPolicy::Immediate, now), None);
        assert_eq!(hold_deadline(DiscardPolicy::Lazy, now), None);
    }
}
