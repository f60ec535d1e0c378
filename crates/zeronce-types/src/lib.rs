//! zeronce-types: the few words every zeronce crate shares, defined once: the page sizes,
//! whether a range of memory is guaranteed to read zero, how a mutex is locked
//! ([`sync`]), how a configured duration becomes a deadline ([`clock`]), how an
//! operator's size (`512M`) is read ([`size`]), and how events are rate-limited without
//! losing one ([`rate`]). The pure allocator (`zeronce-mm`) and the crate that touches real memory
//! (`zeronce-mem`) both depend on it and re-export what they use, so either crate's users
//! keep their paths.
//!
//! Where this crate sits among the others: the repository's `docs/ARCHITECTURE.md` (§2).
#![forbid(unsafe_code)]

pub mod clock;
pub mod rate;
pub mod size;
pub mod sync;

/// The base page size zeronce works in: 4 KiB, whatever the host's page size. One page
/// frame of the allocator, and the discard granularity of memory that is not hugetlb.
/// `zeronce-mm` computes frame offsets in `u64` and exports this value as a `u64`.
pub const PAGE_SIZE: usize = 4096;

/// Size of a 2 MiB huge page: a transparent huge page, or a 2 MiB hugetlb page.
pub const HUGE_PAGE_2M: usize = 2 << 20;

/// Size of a 1 GiB hugetlb page.
pub const HUGE_PAGE_1G: usize = 1 << 30;

// Page sizes are powers of two in increasing order (alignment masks rely on it).
const _: () = assert!(
    PAGE_SIZE.is_power_of_two()
        && HUGE_PAGE_2M.is_power_of_two()
        && HUGE_PAGE_1G.is_power_of_two()
        && PAGE_SIZE < HUGE_PAGE_2M
        && HUGE_PAGE_2M < HUGE_PAGE_1G
);

/// Whether a range of memory is guaranteed to read zero after the host (the kernel, or a
/// virtio-balloon device) took it back. The one answer to "did the host zero it", from a
/// discard operation up to the allocator's free-block state.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZeroGuarantee {
    /// The range now reads zero: its backing was discarded by an operation that refaults
    /// zero. A reported block goes back reported and known zero.
    Zeroed,
    /// No promise: the old contents may survive, and the memory may not have been
    /// returned (a lazy discard such as `MADV_FREE`, a hold not yet over, a host without
    /// zero hints). A reported block goes back reported, its known-zero state unchanged
    /// (old contents that survive were zero if the block was known zero).
    NotZeroed,
}

impl ZeroGuarantee {
    /// Whether the range is guaranteed to read zero.
    pub fn is_zeroed(self) -> bool {
        self == ZeroGuarantee::Zeroed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_zeroed_is_zeroed() {
        assert!(ZeroGuarantee::Zeroed.is_zeroed() && !ZeroGuarantee::NotZeroed.is_zeroed());
    }
}
