//! Constants from the virtio specification's balloon section, and the limits this device
//! enforces on guest input.
//!
//! Feature bits 6 (`DEVICE_INIT_REPORTED`) and 7 (`DEVICE_INIT_ON_INFLATE`) are not in the
//! virtio standard: they come from the 2026 "skip redundant zeroing" proposal (Linux's
//! `uapi/linux/virtio_balloon.h` stops at bit 5, and other out-of-tree patches use bit 6
//! for other things). The device offers them only when the VMM turns them on
//! ([`crate::FeatureOffer::with_zero_hints`]).

/// virtio device ID of the traditional memory balloon.
pub const VIRTIO_ID_BALLOON: u32 = 5;

/// Inflate/deflate PFNs are in units of this many bytes, whatever the guest page size.
pub const PFN_PAGE_SIZE: u64 = 4096;

/// `log2(PFN_PAGE_SIZE)`.
pub const PFN_SHIFT: u32 = 12;

/// Byte offsets and size of `struct virtio_balloon_config` (all fields le32).
pub mod config_layout {
    /// `num_pages`: the host's target balloon size, in 4 KiB pages (device-written).
    pub const NUM_PAGES: u64 = 0;
    /// `actual`: the balloon's current size, in 4 KiB pages (driver-written).
    pub const ACTUAL: u64 = 4;
    /// `free_page_hint_cmd_id` (device-written, valid with `FREE_PAGE_HINT`).
    pub const FREE_PAGE_HINT_CMD_ID: u64 = 8;
    /// `poison_val` (driver-written, valid with `PAGE_POISON`).
    pub const POISON_VAL: u64 = 12;
    /// Total size of the configuration space in bytes.
    pub const SIZE: u64 = 16;
}

/// `VIRTIO_BALLOON_CMD_ID_STOP`: in the config, the device asks the driver to stop
/// hinting; on free_page_vq, the driver says it has finished a run.
pub const CMD_ID_STOP: u32 = 0;

/// `VIRTIO_BALLOON_CMD_ID_DONE`: the device no longer needs the hints; the driver may
/// give its hinted blocks back to its allocator.
pub const CMD_ID_DONE: u32 = 1;

/// Size of one `struct virtio_balloon_stat` (packed le16 tag + le64 value).
pub const STAT_ENTRY_SIZE: usize = 10;

/// Number of statistics tags this device keeps (0–9 spec, 10–15 Linux).
pub const STAT_TAG_COUNT: usize = 16;

/// Limits on guest-supplied buffers. A guest exceeding one gets a typed error and its
/// descriptor back with `used_len` 0; nothing is allocated in proportion to its claim.
pub mod limits {
    /// Most descriptors the device follows in one chain (Linux uses ≤ 2 on
    /// inflate/deflate and ≤ 32 on the reporting queue).
    pub const MAX_CHAIN_DESCRIPTORS: usize = 64;
    /// Most PFNs in one inflate/deflate request (Linux sends ≤ 256).
    pub const MAX_PFNS_PER_REQUEST: usize = 64 * 1024;
    /// The one bound on held work (hold policy), in bytes of host memory: every held
    /// request's payload counts against it, 4 bytes per inflate PFN and one planned
    /// discard ([`HELD_BYTES_PER_REPORTED_BLOCK`], 56 bytes) per reported block. A request
    /// that would exceed it is served at once, with its honest verdict. On top of it
    /// each held request keeps one fixed-size record, at most one per descriptor head.
    /// 4 MiB is 1 Mi PFNs (4 GiB of guest memory) or ~75 Ki reported blocks.
    pub const MAX_HELD_BYTES: usize = 4 << 20;
    /// What one held reported block counts against [`MAX_HELD_BYTES`]: the size of the
    /// device's planned discard of it.
    pub const HELD_BYTES_PER_REPORTED_BLOCK: usize =
        std::mem::size_of::<crate::discard::PlannedDiscard>();
    /// Largest statistics buffer accepted, in bytes (16 tags × 10 bytes is 160).
    pub const MAX_STATS_BUFFER: u32 = 4096;
    /// Largest single reported block, in bytes (1 GiB: the largest huge page).
    pub const MAX_REPORT_BLOCK: u64 = 1 << 30;
    /// Pages (4 KiB) of inflate, deflate and report work one `process_queue` call
    /// serves before it returns what it served and says there is more
    /// (`QueueReport::more`): 4 GiB of guest memory, 16 requests of
    /// [`MAX_PFNS_PER_REQUEST`] (~1 s of device time). The chain that crosses it is served
    /// whole. Without it, one notification of 64 Ki-PFN inflates on every head of a
    /// 1024-entry queue is ~46 s of device time with nothing returned until the end.
    pub const MAX_PAGES_PER_CALL: u64 = 1 << 20;
}

/// A memory statistics tag (`VIRTIO_BALLOON_S_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum StatTag {
    /// Memory swapped in, bytes.
    SwapIn = 0,
    /// Memory swapped out, bytes.
    SwapOut = 1,
    /// Major page faults.
    MajorFaults = 2,
    /// Minor page faults.
    MinorFaults = 3,
    /// Memory not used for any purpose, bytes.
    FreeMemory = 4,
    /// Total memory, bytes.
    TotalMemory = 5,
    /// Estimate of memory available for new applications, bytes.
    AvailableMemory = 6,
    /// Quickly reclaimable memory (page cache), bytes.
    DiskCaches = 7,
    /// Successful hugetlb page allocations.
    HugetlbAllocations = 8,
    /// Failed hugetlb page allocations.
    HugetlbFailures = 9,
    /// OOM killer invocations (Linux).
    OomKills = 10,
    /// Allocation stalls (Linux).
    AllocStall = 11,
    /// Pages scanned by kswapd (Linux).
    AsyncScans = 12,
    /// Pages scanned by direct reclaim (Linux).
    DirectScans = 13,
    /// Pages reclaimed by kswapd (Linux).
    AsyncReclaims = 14,
    /// Pages reclaimed by direct reclaim (Linux).
    DirectReclaims = 15,
}

impl StatTag {
    /// Every tag, in numeric order.
    pub const ALL: [StatTag; STAT_TAG_COUNT] = [
        StatTag::SwapIn,
        StatTag::SwapOut,
        StatTag::MajorFaults,
        StatTag::MinorFaults,
        StatTag::FreeMemory,
        StatTag::TotalMemory,
        StatTag::AvailableMemory,
        StatTag::DiskCaches,
        StatTag::HugetlbAllocations,
        StatTag::HugetlbFailures,
        StatTag::OomKills,
        StatTag::AllocStall,
        StatTag::AsyncScans,
        StatTag::DirectScans,
        StatTag::AsyncReclaims,
        StatTag::DirectReclaims,
    ];

    /// The tag for a raw value, or `None` for an unknown tag (to be ignored).
    pub fn from_raw(raw: u16) -> Option<StatTag> {
        StatTag::ALL.get(usize::from(raw)).copied()
    }

    /// The raw tag value.
    pub fn raw(self) -> u16 {
        self as u16
    }

    /// The conventional name (as QEMU / Linux print it).
    pub fn name(self) -> &'static str {
        match self {
            StatTag::SwapIn => "swap_in",
            StatTag::SwapOut => "swap_out",
            StatTag::MajorFaults => "major_faults",
            StatTag::MinorFaults => "minor_faults",
            StatTag::FreeMemory => "free_memory",
            StatTag::TotalMemory => "total_memory",
            StatTag::AvailableMemory => "available_memory",
            StatTag::DiskCaches => "disk_caches",
            StatTag::HugetlbAllocations => "hugetlb_allocations",
            StatTag::HugetlbFailures => "hugetlb_failures",
            StatTag::OomKills => "oom_kills",
            StatTag::AllocStall => "alloc_stall",
            StatTag::AsyncScans => "async_scans",
            StatTag::DirectScans => "direct_scans",
            StatTag::AsyncReclaims => "async_reclaims",
            StatTag::DirectReclaims => "direct_reclaims",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tags_round_trip_and_unknown_tags_are_none() {
        for (i, tag) in StatTag::ALL.iter().enumerate() {
            assert_eq!(usize::from(tag.raw()), i);
            assert_eq!(StatTag::from_raw(tag.raw()), Some(*tag));
        }
        assert_eq!(StatTag::from_raw(16), None);
        assert_eq!(StatTag::from_raw(u16::MAX), None);
        assert_eq!(StatTag::FreeMemory.name(), "free_memory");
        assert_eq!(StatTag::DirectReclaims.name(), "direct_reclaims");
    }

    #[test]
    fn config_layout_matches_spec() {
        assert_eq!(config_layout::SIZE, 4 * 4);
        assert_eq!(1u64 << PFN_SHIFT, PFN_PAGE_SIZE);
    }
}
