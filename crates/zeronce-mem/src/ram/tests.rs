//! Each discard claim of the module docs of [`crate::discard`], proven by reading the
//! memory back and by what the kernel says it holds.

use super::*;
use crate::resident::ProcessRss;

const MIB: usize = 1 << 20;
const OLD: u8 = 0xcd;

fn anon() -> BackingKind {
    BackingKind::Anonymous { thp: true }
}

/// A `size`-byte RAM of `kind` with every byte set to `OLD`.
fn filled(size: usize, kind: BackingKind) -> GuestRam {
    let mut ram = GuestRam::new(size, kind).expect("map guest RAM");
    ram.fill(0, size, OLD).expect("fill");
    ram
}

/// Whether `len` bytes from `offset` all hold `OLD` (a slice comparison: one `memcmp`,
/// which Miri runs natively, instead of a loop it interprets byte by byte).
fn all_old(ram: &GuestRam, offset: usize, len: usize) -> bool {
    ram.as_slice()[offset..offset + len] == vec![OLD; len]
}

#[test]
fn anonymous_ram_starts_at_the_alignment_asked_for() {
    // Under Miri only small ones (its heap "mappings" are interpreted byte by byte).
    let cases: &[(usize, usize)] = if cfg!(miri) {
        &[(4 * MIB, 4 * MIB), (4 * MIB, 3 * MIB)]
    } else {
        &[
            (4 * MIB, 4 * MIB),
            (4 * MIB, 3 * MIB),
            (96 * MIB, 64 * MIB),
            (3 << 30, 1 << 30),
            (6 * MIB, 4096),
        ]
    };
    for &(size, align) in cases {
        let ram =
            GuestRam::new_aligned(size, BackingKind::Anonymous { thp: false }, align).expect("map");
        // Rounded up to a power of two, 2 MiB at least.
        let want = align.max(HUGE_PAGE_2M).next_power_of_two();
        assert_eq!(
            ram.as_ptr() as usize % want,
            0,
            "{size} bytes, {align}: {want} aligned"
        );
        assert_eq!(ram.len(), size);
    }
}

#[test]
#[cfg_attr(miri, ignore = "needs syscalls: memfd_create")]
fn creates_each_backing_with_its_properties() {
    let a = GuestRam::new(4 * MIB, anon()).expect("anon");
    assert_eq!((a.len(), a.backing()), (4 * MIB, Backing::PrivateAnonymous));
    assert!(a.fd().is_none() && !a.is_empty());
    assert_eq!(
        a.as_ptr() as usize % HUGE_PAGE_2M,
        0,
        "2 MiB aligned for THP"
    );
    assert!(
        a.is_zero(0, a.len()).expect("in range"),
        "fresh memory reads zero"
    );
    let m = GuestRam::new(3 * PAGE_SIZE, BackingKind::Memfd).expect("memfd");
    assert_eq!(m.backing(), Backing::SharedFile);
    assert!(m.fd().is_some());
    assert_eq!(m.file_allocated_bytes().map(|r| r.ok()), Some(Some(0)));
    for (size, kind) in [(0, anon()), (PAGE_SIZE + 1, BackingKind::Memfd)] {
        assert!(matches!(
            GuestRam::new(size, kind),
            Err(RamError::BadSize { .. })
        ));
    }
    assert!(matches!(
        GuestRam::new(PAGE_SIZE, BackingKind::Hugetlb(HugePageSize::Size2M)),
        Err(RamError::BadSize {
            page_size: HUGE_PAGE_2M,
            ..
        })
    ));
}

#[test]
fn accessors_check_ranges_and_round_trip() {
    // Under Miri only the heap-backed anonymous kind exists.
    let kinds = [anon(), BackingKind::Memfd];
    for kind in kinds.into_iter().take(if cfg!(miri) { 1 } else { 2 }) {
        accessors_round_trip(GuestRam::new(2 * PAGE_SIZE, kind).expect("map guest RAM"));
    }
}

fn accessors_round_trip(mut ram: GuestRam) {
    ram.write(100, b"zeronce").expect("write");
    let mut buf = [0u8; 7];
    ram.read(100, &mut buf).expect("read");
    assert_eq!(&buf, b"zeronce");
    assert!(!ram.is_zero(0, 2 * PAGE_SIZE).expect("in range"));
    assert!(ram.is_zero(107, PAGE_SIZE).expect("in range"));
    let size = ram.len();
    let oob = RangeError {
        offset: size - 3,
        len: 4,
        size,
    };
    assert_eq!(ram.write(size - 3, b"abcd"), Err(oob));
    assert_eq!(ram.read(size - 3, &mut [0u8; 4]), Err(oob));
    assert_eq!(ram.fill(size - 3, 4, 1), Err(oob));
    assert_eq!(ram.is_zero(size - 3, 4), Err(oob));
    assert!(ram.check(usize::MAX, 2).is_err());
    ram.touch(0, size, 0).expect("touch");
    assert_eq!(
        ram.as_slice()[100..107],
        *b"zeronce",
        "touch keeps contents"
    );
}

#[test]
fn is_zero_finds_any_single_nonzero_byte() {
    let mut v = vec![0u8; 3 * PAGE_SIZE + 13];
    assert!(bytes_are_zero(&v));
    for i in [0, 7, 8, 63, PAGE_SIZE, 2 * PAGE_SIZE + 4095, v.len() - 1] {
        v[i] = 1;
        assert!(!bytes_are_zero(&v), "byte {i}");
        v[i] = 0;
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "MiB-sized: too slow under Miri (the test below runs there)"
)]
fn zero_with_hint_zeroes_exactly_the_range() {
    let mut ram = filled(4 * MIB, anon());
    let (off, len) = (MIB + PAGE_SIZE, 2 * MIB);
    let k = ram.zero(off, len, Some(off + MIB + 5)).expect("zero");
    assert_eq!(k, ZeroKernel::auto(len));
    assert!(ram.is_zero(off, len).expect("range"));
    assert!(all_old(&ram, 0, off) && all_old(&ram, off + len, 4 * MIB - off - len));
}

#[test]
fn zero_with_every_kernel_zeroes_exactly_the_range() {
    let size = 8 * PAGE_SIZE;
    let mut ram = filled(size, anon());
    for kernel in ZeroKernel::available() {
        ram.fill(0, size, OLD).expect("fill");
        ram.zero_with(PAGE_SIZE, PAGE_SIZE * 3, kernel, Some(0))
            .expect("zero");
        assert!(
            ram.is_zero(PAGE_SIZE, 3 * PAGE_SIZE).expect("range"),
            "{kernel}"
        );
        assert!(all_old(&ram, 0, PAGE_SIZE) && all_old(&ram, 4 * PAGE_SIZE, PAGE_SIZE));
    }
    assert!(ram.zero(size, 1, None).is_err());
}

#[test]
#[cfg_attr(miri, ignore = "needs syscalls: madvise, mincore, /proc")]
fn anonymous_dontneed_reads_zero_and_returns_memory() {
    let size = 32 * MIB;
    let mut ram = filled(size, anon());
    let (off, len) = (4 * MIB, 16 * MIB);
    assert_eq!(ram.resident_bytes(off, len).expect("mincore"), len);
    let before = ProcessRss::read().expect("rss");
    let g = ram.discard(off, len, DiscardOp::DontNeed).expect("discard");
    let after = ProcessRss::read().expect("rss");
    assert_eq!(g, ZeroGuarantee::Zeroed);
    // Checked before reading back (a read maps the zero page, which mincore counts).
    assert_eq!(ram.resident_bytes(off, len).expect("mincore"), 0);
    // Other tests run concurrently in this process: allow them half of it.
    assert!(
        before.anon.saturating_sub(after.anon) >= (len / 2) as u64,
        "RssAnon {} -> {}",
        before.anon,
        after.anon
    );
    assert!(ram.is_zero(off, len).expect("range"));
    assert!(all_old(&ram, 0, off) && all_old(&ram, off + len, size - off - len));
}

#[test]
#[cfg_attr(miri, ignore = "needs syscalls: memfd_create, madvise")]
fn memfd_dontneed_frees_nothing_and_contents_survive() {
    let size = 8 * MIB;
    let mut ram = filled(size, BackingKind::Memfd);
    let blocks = |r: &GuestRam| r.file_allocated_bytes().and_then(Result::ok);
    assert_eq!(blocks(&ram), Some(size as u64));
    let g = ram.discard(0, size, DiscardOp::DontNeed).expect("discard");
    assert_eq!(g, ZeroGuarantee::NotZeroed);
    assert_eq!(blocks(&ram), Some(size as u64), "the file keeps every page");
    assert_eq!(ram.resident_bytes(0, size).expect("mincore"), size);
    assert!(
        all_old(&ram, 0, size),
        "contents survive MADV_DONTNEED on shmem"
    );
}

#[test]
#[cfg_attr(miri, ignore = "needs syscalls: memfd_create, fallocate")]
fn memfd_punch_hole_and_remove_read_zero_and_free_blocks() {
    for op in [DiscardOp::PunchHole, DiscardOp::Remove] {
        let size = 8 * MIB;
        let mut ram = filled(size, BackingKind::Memfd);
        let (off, len) = (2 * MIB, 4 * MIB);
        let g = ram.discard(off, len, op).expect("discard");
        assert_eq!(g, ZeroGuarantee::Zeroed, "{op}");
        let held = ram.file_allocated_bytes().and_then(Result::ok);
        assert_eq!(held, Some((size - len) as u64), "{op}: blocks freed");
        assert_eq!(ram.resident_bytes(off, len).expect("mincore"), 0, "{op}");
        assert!(ram.is_zero(off, len).expect("range"), "{op}");
        assert!(all_old(&ram, 0, off) && all_old(&ram, off + len, size - off - len));
    }
}

#[test]
#[cfg_attr(miri, ignore = "needs syscalls: madvise")]
fn anonymous_free_promises_nothing_but_each_page_is_old_or_zero() {
    let size = 4 * MIB;
    let mut ram = filled(size, anon());
    let g = ram.discard(0, size, DiscardOp::Free).expect("MADV_FREE");
    assert_eq!(g, ZeroGuarantee::NotZeroed);
    // All that is guaranteed: a page is either intact (not yet reclaimed) or zero.
    for page in ram.as_slice().chunks(PAGE_SIZE) {
        assert!(page.iter().all(|&b| b == OLD) || bytes_are_zero(page));
    }
}

#[test]
fn refused_discards_are_typed_and_leave_memory_untouched() {
    let size = 16 * PAGE_SIZE;
    let mut ram = filled(size, anon());
    let cases = [
        (1, PAGE_SIZE, DiscardOp::DontNeed),
        (0, PAGE_SIZE + 1, DiscardOp::DontNeed),
        (0, 0, DiscardOp::DontNeed),
        (size, PAGE_SIZE, DiscardOp::DontNeed),
        (size - PAGE_SIZE, 2 * PAGE_SIZE, DiscardOp::DontNeed),
        (0, PAGE_SIZE, DiscardOp::PunchHole),
        (0, PAGE_SIZE, DiscardOp::Remove),
    ];
    for (off, len, op) in cases {
        let err = ram.discard(off, len, op).expect_err("must be refused");
        let ok = match err {
            DiscardError::Unaligned { .. } => off % PAGE_SIZE != 0 || len % PAGE_SIZE != 0,
            DiscardError::Empty { .. } => len == 0,
            DiscardError::OutOfRange { limit, .. } => limit == size && off + len > size,
            DiscardError::Unsupported { op: o, backing } => {
                o == op && backing == Backing::PrivateAnonymous
            }
            _ => false,
        };
        assert!(ok, "{off:#x}+{len:#x} {op}: {err}");
    }
    assert!(all_old(&ram, 0, size));
}

#[test]
#[cfg_attr(miri, ignore = "needs syscalls: memfd_create")]
fn memfd_refuses_free_and_keeps_contents() {
    let mut m = filled(2 * PAGE_SIZE, BackingKind::Memfd);
    assert!(matches!(
        m.discard(0, PAGE_SIZE, DiscardOp::Free),
        Err(DiscardError::Unsupported { .. })
    ));
    assert!(all_old(&m, 0, 2 * PAGE_SIZE));
}

#[test]
#[cfg_attr(miri, ignore = "needs syscalls: memfd_create, fallocate")]
fn guest_ram_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    let mut ram = filled(2 * MIB, BackingKind::Memfd);
    assert_send_sync(&ram);
    ram = std::thread::spawn(move || {
        let g = ram.discard(0, MIB, DiscardOp::PunchHole).expect("discard");
        assert!(g.is_zeroed());
        ram
    })
    .join()
    .expect("thread");
    std::thread::scope(|s| {
        let r = &ram;
        let a = s.spawn(move || r.is_zero(0, MIB).expect("range"));
        let b = s.spawn(move || all_old(r, MIB, MIB));
        assert!(a.join().expect("a") && b.join().expect("b"));
    });
}

#[test]
#[ignore = "needs reserved 2 MiB huge pages; .ci/run reserves them and runs it"]
fn hugetlb_2m_punch_hole_frees_whole_pages() {
    hugetlb_punch_hole_frees_whole_pages(HugePageSize::Size2M);
}

#[test]
#[ignore = "needs reserved 1 GiB huge pages; .ci/run runs it when it can reserve two"]
fn hugetlb_1g_punch_hole_frees_whole_pages() {
    hugetlb_punch_hole_frees_whole_pages(HugePageSize::Size1G);
}

fn hugetlb_punch_hole_frees_whole_pages(size: HugePageSize) {
    let ps = size.bytes();
    let mut ram = GuestRam::new(2 * ps, BackingKind::Hugetlb(size))
        .unwrap_or_else(|e| panic!("needs 2 free huge pages of {} KiB reserved: {e}", ps / 1024));
    ram.fill(0, 2 * ps, OLD).expect("fill");
    assert!(matches!(
        ram.discard(0, PAGE_SIZE, DiscardOp::PunchHole),
        Err(DiscardError::Unaligned { .. })
    ));
    let g = ram.discard(ps, ps, DiscardOp::PunchHole).expect("punch");
    assert_eq!(g, ZeroGuarantee::Zeroed);
    assert_eq!(
        ram.file_allocated_bytes().and_then(Result::ok),
        Some(ps as u64)
    );
    assert!(ram.is_zero(ps, ps).expect("range") && all_old(&ram, 0, ps));
}
