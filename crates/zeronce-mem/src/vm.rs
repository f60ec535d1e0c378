//! Safe bridge from rust-vmm guest memory ([`vm_memory::GuestMemoryMmap`]) to
//! [`discard_raw`]: the balloon device (which forbids `unsafe`) discards guest ranges
//! through here.
//!
//! What vm-memory tells about a region decides its [`Backing`]:
//!
//! | region | backing |
//! |---|---|
//! | no file offset, `MAP_PRIVATE` (vm-memory's anonymous regions) | [`Backing::PrivateAnonymous`] |
//! | file offset, `MAP_SHARED`, file on hugetlbfs (`fstatfs` magic, or vm-memory says so) | [`Backing::Hugetlb`] with the file's block size (= huge page size) |
//! | file offset, `MAP_SHARED`, any other file (memfd, shmem, tmpfs) | [`Backing::SharedFile`] |
//! | file offset, `MAP_PRIVATE` | refused: a discard reverts pages to the file's contents, neither frees the file nor zeroes |

use std::os::fd::AsFd;

use rustix::mm::{madvise, Advice};
use vm_memory::bitmap::Bitmap;
use vm_memory::{
    Address, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

use crate::discard::{discard_raw, Backing, DiscardError, DiscardOp};

/// `statfs.f_type` of hugetlbfs (linux/magic.h `HUGETLBFS_MAGIC`).
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// Why a guest range could not be described or discarded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuestDiscardError {
    /// The range starts outside guest RAM, is empty, or overflows.
    #[error("guest range {gpa:#x}+{len:#x} is not in guest memory")]
    NotInGuestMemory {
        /// Guest physical start address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The range does not fit inside the single region holding its start.
    #[error("guest range {gpa:#x}+{len:#x} crosses the end of its memory region")]
    CrossesRegion {
        /// Guest physical start address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The region is a private file mapping, which no discard op frees or zeroes.
    #[error("region at {start:#x} is a private file mapping; discard would not free it")]
    PrivateFileMapping {
        /// Guest physical start of the region.
        start: u64,
    },
    /// vm-memory did not map the region itself (a raw-pointer region): it only promises
    /// the memory can be accessed, not that it may be discarded.
    #[error("region at {start:#x} is not mapped by vm-memory; refusing to discard it")]
    NotOwned {
        /// Guest physical start of the region.
        start: u64,
    },
    /// The region is on hugetlbfs but its huge page size could not be read.
    #[error("region at {start:#x} is hugetlbfs but its page size is unknown")]
    UnknownHugePageSize {
        /// Guest physical start of the region.
        start: u64,
    },
    /// The discard itself was refused or failed.
    #[error(transparent)]
    Discard(#[from] DiscardError),
    /// Pre-faulting (`MADV_POPULATE_WRITE`) failed.
    #[error("populate failed: {0}")]
    Populate(rustix::io::Errno),
}

/// One guest memory region as the discard path sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Guest physical start of the region.
    pub start: GuestAddress,
    /// Length of the region in bytes.
    pub len: u64,
    /// What the region is backed by.
    pub backing: Backing,
}

/// Derives the [`Backing`] of `region`. `hugetlb_page_size` overrides the huge page size
/// (and marks a file-backed region as hugetlb) when the VMM knows it; otherwise hugetlbfs
/// is detected with `fstatfs` and its page size read from the file's block size.
pub(crate) fn region_backing<B: Bitmap>(
    region: &GuestRegionMmap<B>,
    hugetlb_page_size: Option<usize>,
) -> Result<Backing, GuestDiscardError> {
    let start = region.start_addr().raw_value();
    let Some(fo) = region.file_offset() else {
        return Ok(Backing::PrivateAnonymous);
    };
    let shared = region.flags() & libc::MAP_SHARED != 0;
    if !shared {
        return Err(GuestDiscardError::PrivateFileMapping { start });
    }
    if let Some(page_size) = hugetlb_page_size {
        return Ok(Backing::Hugetlb { page_size });
    }
    let fd = fo.file().as_fd();
    let on_hugetlbfs = region.is_hugetlbfs() == Some(true)
        || rustix::fs::fstatfs(fd).is_ok_and(|s| u64::try_from(s.f_type) == Ok(HUGETLBFS_MAGIC));
    if !on_hugetlbfs {
        return Ok(Backing::SharedFile);
    }
    let block = rustix::fs::fstat(fd).map(|st| usize::try_from(st.st_blksize));
    match block {
        Ok(Ok(page_size)) if page_size > 0 => Ok(Backing::Hugetlb { page_size }),
        _ => Err(GuestDiscardError::UnknownHugePageSize { start }),
    }
}

/// Describes the region holding `gpa` (see `region_backing`).
pub fn describe_region<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    gpa: GuestAddress,
    hugetlb_page_size: Option<usize>,
) -> Result<RegionInfo, GuestDiscardError> {
    let region = mem
        .find_region(gpa)
        .ok_or(GuestDiscardError::NotInGuestMemory { gpa: gpa.0, len: 0 })?;
    Ok(RegionInfo {
        start: region.start_addr(),
        len: region.len(),
        backing: region_backing(region, hugetlb_page_size)?,
    })
}

/// The region holding all of `[gpa, gpa + len)`, the offset of `gpa` in it, or why not.
fn locate<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    gpa: GuestAddress,
    len: u64,
) -> Result<(&GuestRegionMmap<B>, u64), GuestDiscardError> {
    let not_in = GuestDiscardError::NotInGuestMemory { gpa: gpa.0, len };
    if len == 0 || gpa.0.checked_add(len).is_none() {
        return Err(not_in);
    }
    let region = mem.find_region(gpa).ok_or(not_in)?;
    let offset = gpa.0 - region.start_addr().0;
    if offset + len > region.len() {
        return Err(GuestDiscardError::CrossesRegion { gpa: gpa.0, len });
    }
    Ok((region, offset))
}

/// Discards guest range `[gpa, gpa + len)` with `op`, treating its region as `backing`
/// (from [`describe_region`]). Refuses regions vm-memory did not map itself (raw-pointer
/// regions) and private file mappings. The range must lie inside one region and respect the
/// backing's page size (checked again by `discard_raw`). Whether it reads zero
/// afterwards is [`DiscardOp::guarantees_zero`]`(backing)`.
pub fn discard_guest_range<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    gpa: GuestAddress,
    len: u64,
    op: DiscardOp,
    backing: Backing,
) -> Result<(), GuestDiscardError> {
    let (region, offset) = locate(mem, gpa, len)?;
    let start = region.start_addr().raw_value();
    // Only a mapping vm-memory made itself is vm-memory's to discard: a raw-pointer
    // region is some other owner's memory that vm-memory merely accesses.
    if !region.owned() {
        return Err(GuestDiscardError::NotOwned { start });
    }
    // A private file mapping: DONTNEED reverts to the file, and a punched hole destroys
    // the file's own data, which the private mapping exists to protect.
    if region.file_offset().is_some() && region.flags() & libc::MAP_SHARED == 0 {
        return Err(GuestDiscardError::PrivateFileMapping { start });
    }
    let len =
        usize::try_from(len).map_err(|_| GuestDiscardError::CrossesRegion { gpa: gpa.0, len })?;
    let host = region
        .get_host_address(vm_memory::MemoryRegionAddress(offset))
        .map_err(|_| GuestDiscardError::NotInGuestMemory {
            gpa: gpa.0,
            len: len as u64,
        })?;
    let file = region
        .file_offset()
        .map(|fo| (fo.file().as_fd(), fo.start() + offset));
    // SAFETY: `host..host + len` lies inside the region's mapping (`locate` checked the
    // range against the region's length), which vm-memory made itself (`owned`, checked
    // above) and keeps mapped for as long as `mem` is borrowed here. vm-memory only ever accesses guest memory through
    // volatile slices and raw pointers, never through Rust references, so the kernel
    // replacing the pages' contents invalidates no reference. `file` is the fd backing
    // this very mapping with the file offset of `host`.
    unsafe { discard_raw(host, len, op, backing, file) }?;
    Ok(())
}

/// Pre-faults guest range `[gpa, gpa + len)` for writing (`MADV_POPULATE_WRITE`, Linux
/// ≥ 5.14) without changing its contents, so a deflated page does not fault on first use.
/// `gpa` and `len` must be multiples of 4 KiB.
pub fn populate_guest_range<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    gpa: GuestAddress,
    len: u64,
) -> Result<(), GuestDiscardError> {
    let (region, offset) = locate(mem, gpa, len)?;
    let not_in = GuestDiscardError::NotInGuestMemory { gpa: gpa.0, len };
    let (Ok(start), Ok(bytes)) = (usize::try_from(gpa.0), usize::try_from(len)) else {
        return Err(not_in);
    };
    crate::discard::check_range(start, bytes, Backing::PrivateAnonymous)?;
    let host = region
        .get_host_address(vm_memory::MemoryRegionAddress(offset))
        .map_err(|_| not_in)?;
    // SAFETY: the range lies inside the region's live mapping (checked by `locate`);
    // MADV_POPULATE_WRITE faults pages in without modifying their contents, so no value
    // any reader could observe changes.
    unsafe { madvise(host.cast(), bytes, Advice::LinuxPopulateWrite) }
        .map_err(GuestDiscardError::Populate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use vm_memory::{Bytes, FileOffset};

    const PS: u64 = crate::discard::PAGE_SIZE as u64;

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: madvise")]
    fn anonymous_region_discard_zeroes_only_the_range() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0x10000), 0x4000)]).unwrap();
        mem.write_slice(&[0xaa; 0x4000], GuestAddress(0x10000))
            .unwrap();
        let info = describe_region(&mem, GuestAddress(0x11000), None).unwrap();
        assert_eq!(info.backing, Backing::PrivateAnonymous);
        assert_eq!((info.start, info.len), (GuestAddress(0x10000), 0x4000));
        discard_guest_range(
            &mem,
            GuestAddress(0x11000),
            PS,
            DiscardOp::DontNeed,
            info.backing,
        )
        .unwrap();
        let mut buf = [0u8; 0x4000];
        mem.read_slice(&mut buf, GuestAddress(0x10000)).unwrap();
        assert!(buf[..0x1000].iter().all(|&b| b == 0xaa));
        assert!(buf[0x1000..0x2000].iter().all(|&b| b == 0));
        assert!(buf[0x2000..].iter().all(|&b| b == 0xaa));
    }

    #[test]
    fn ranges_outside_or_across_regions_are_refused() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x2000),
            (GuestAddress(0x2000), 0x2000),
        ])
        .unwrap();
        let anon = Backing::PrivateAnonymous;
        let op = DiscardOp::DontNeed;
        assert!(matches!(
            discard_guest_range(&mem, GuestAddress(0x8000), PS, op, anon),
            Err(GuestDiscardError::NotInGuestMemory { .. })
        ));
        assert!(matches!(
            discard_guest_range(&mem, GuestAddress(0x1000), 2 * PS, op, anon),
            Err(GuestDiscardError::CrossesRegion { .. })
        ));
        assert!(matches!(
            discard_guest_range(&mem, GuestAddress(u64::MAX - 0xfff), PS, op, anon),
            Err(GuestDiscardError::NotInGuestMemory { .. })
        ));
        assert!(matches!(
            discard_guest_range(&mem, GuestAddress(0), 0, op, anon),
            Err(GuestDiscardError::NotInGuestMemory { .. })
        ));
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: memfd_create, fallocate")]
    fn memfd_region_is_shared_file_and_punch_hole_frees_blocks() {
        let fd =
            rustix::fs::memfd_create("vm-bridge-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let file = File::from(fd);
        file.set_len(0x4000).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            0x4000,
            Some(FileOffset::new(file.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        mem.write_slice(&[7; 0x4000], GuestAddress(0)).unwrap();
        let before = rustix::fs::fstat(&file).unwrap().st_blocks;
        let info = describe_region(&mem, GuestAddress(0), None).unwrap();
        assert_eq!(info.backing, Backing::SharedFile);
        discard_guest_range(
            &mem,
            GuestAddress(0),
            0x4000,
            DiscardOp::PunchHole,
            info.backing,
        )
        .unwrap();
        let after = rustix::fs::fstat(&file).unwrap().st_blocks;
        assert!(after < before, "blocks {before} -> {after}");
        let mut buf = [1u8; 0x4000];
        mem.read_slice(&mut buf, GuestAddress(0)).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    /// Guest memory of the one region `builder` maps, at guest address 0.
    fn at_zero(builder: vm_memory::mmap::MmapRegionBuilder<()>) -> GuestMemoryMmap {
        let region = GuestRegionMmap::new(builder.build().unwrap(), GuestAddress(0)).unwrap();
        GuestMemoryMmap::from_regions(vec![region]).unwrap()
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: memfd_create")]
    fn regions_vm_memory_does_not_own_or_privately_mapped_files_are_refused() {
        use vm_memory::mmap::MmapRegionBuilder;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // A region over memory vm-memory did not map (the VMM's own mapping, given as a
        // raw pointer): vm-memory only promises it can be accessed, not discarded.
        let len = 2 * crate::discard::PAGE_SIZE;
        // SAFETY: a fresh private mapping of our own, unmapped at the end of the test.
        let raw = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .unwrap()
        .cast::<u8>();
        // SAFETY: `raw` is a valid mapping of `len` bytes, alive until the end of the test.
        let builder = unsafe { MmapRegionBuilder::<()>::new(len).with_raw_mmap_pointer(raw) };
        let mem = at_zero(builder.with_mmap_prot(rw));
        mem.write_slice(&[0xaa; 16], GuestAddress(0)).unwrap();
        let anon = Backing::PrivateAnonymous;
        assert_eq!(
            discard_guest_range(&mem, GuestAddress(0), PS, DiscardOp::DontNeed, anon),
            Err(GuestDiscardError::NotOwned { start: 0 })
        );
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0)).unwrap(), 0xaa);
        drop(mem);
        // SAFETY: our mapping; the guest memory over it is dropped.
        unsafe { rustix::mm::munmap(raw.cast(), len) }.unwrap();

        // A private mapping of a file: punching a hole would destroy the file's data,
        // which the private mapping exists to protect (e.g. a firmware image).
        let fd = rustix::fs::memfd_create("vm-private", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let file = File::from(fd);
        rustix::io::pwrite(&file, &[7u8; 0x2000], 0).unwrap();
        let mem = at_zero(
            MmapRegionBuilder::<()>::new(0x2000)
                .with_file_offset(FileOffset::new(file.try_clone().unwrap(), 0))
                .with_mmap_prot(rw)
                .with_mmap_flags(libc::MAP_PRIVATE),
        );
        for op in [DiscardOp::PunchHole, DiscardOp::Remove, DiscardOp::DontNeed] {
            assert_eq!(
                discard_guest_range(&mem, GuestAddress(0), PS, op, Backing::SharedFile),
                Err(GuestDiscardError::PrivateFileMapping { start: 0 })
            );
        }
        let mut back = [0u8; 0x2000];
        rustix::io::pread(&file, &mut back, 0).unwrap();
        assert!(back.iter().all(|&b| b == 7), "the file keeps its data");
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs syscalls: madvise")]
    fn populate_keeps_contents() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap();
        mem.write_obj(0x1234_5678u32, GuestAddress(0x1000)).unwrap();
        // Old kernels lack MADV_POPULATE_WRITE (EINVAL): then only check the refusal path.
        let _ = populate_guest_range(&mem, GuestAddress(0), 0x2000);
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0x1234_5678
        );
        assert!(populate_guest_range(&mem, GuestAddress(0x800), 0x1000).is_err());
    }
}
