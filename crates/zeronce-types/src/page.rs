//! The page sizes zeronce works in.

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
