use super::*;

/// A page-aligned buffer of `pages` pages plus a guard page on each side, filled with
/// `0xa5`; returns it and the offset of the first inner page.
fn guarded(pages: usize) -> (Vec<u8>, usize) {
    let buf = vec![0xa5u8; (pages + 3) * PAGE_SIZE];
    let off = buf.as_ptr().align_offset(PAGE_SIZE) + PAGE_SIZE;
    (buf, off)
}

/// Checks that exactly `[start, start + len)` of `buf` was zeroed. Slice comparisons
/// (one `memcmp`, which Miri runs natively) rather than byte loops.
fn check(buf: &[u8], start: usize, len: usize, what: &str) {
    let (before, rest) = buf.split_at(start);
    let (range, after) = rest.split_at(len);
    assert!(range == vec![0; len], "{what}: not all zero");
    assert!(
        before == vec![0xa5; start],
        "{what}: wrote before the range"
    );
    assert!(
        after == vec![0xa5; after.len()],
        "{what}: wrote after the range"
    );
}

#[test]
fn available_always_has_write_bytes_and_auto_is_available() {
    let avail = ZeroKernel::available();
    assert!(avail.contains(&ZeroKernel::WriteBytes));
    for len in [
        0,
        4096,
        NON_TEMPORAL_THRESHOLD - 1,
        NON_TEMPORAL_THRESHOLD,
        1 << 30,
    ] {
        let k = ZeroKernel::auto(len);
        assert!(avail.contains(&k), "{k} for {len}");
        assert_eq!(
            k.is_non_temporal(),
            len >= NON_TEMPORAL_THRESHOLD && avail.iter().any(|k| k.is_non_temporal())
        );
    }
    assert!(!ZeroKernel::cache_friendly().is_non_temporal());
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    assert_eq!(
        has_clzero(),
        std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| s.contains(" clzero"))
            .unwrap_or(has_clzero())
    );
}

#[test]
fn every_kernel_zeroes_exactly_page_aligned_ranges() {
    for kernel in ZeroKernel::ALL {
        for pages in [1, 2, 3, 17, 64] {
            let (mut buf, off) = guarded(pages);
            let len = pages * PAGE_SIZE;
            zero_slice(&mut buf[off..off + len], kernel);
            check(&buf, off, len, &format!("{kernel} {pages} pages"));
        }
    }
}

#[test]
fn every_kernel_handles_unaligned_starts_and_odd_lengths() {
    for kernel in ZeroKernel::ALL {
        for (skew, len) in [
            (1, 1),
            (3, 63),
            (7, 64),
            (13, 200),
            (33, 4095),
            (61, 3 * PAGE_SIZE + 5),
            (0, 257),
            // Page by page with look-ahead: starts inside a page, ends inside another.
            (2 * PAGE_SIZE - 128, 9 * PAGE_SIZE + 4000),
            (64, 11 * PAGE_SIZE - 64),
        ] {
            let (mut buf, off) = guarded(12);
            zero_slice(&mut buf[off + skew..off + skew + len], kernel);
            check(
                &buf,
                off + skew,
                len,
                &format!("{kernel} skew {skew} len {len}"),
            );
        }
        let (mut buf, off) = guarded(1);
        zero_slice(&mut buf[off..off], kernel);
        check(&buf, off, 0, &format!("{kernel} empty"));
    }
}

#[test]
fn hinted_zeroing_covers_the_range_for_every_hint() {
    let pages = 5;
    let len = pages * PAGE_SIZE;
    for kernel in ZeroKernel::ALL {
        for hint in [
            None,
            Some(0),
            Some(1),
            Some(2 * PAGE_SIZE + 100),
            Some(len - 1),
            Some(len),
            Some(usize::MAX),
        ] {
            let (mut buf, off) = guarded(pages);
            let r = &mut buf[off..off + len];
            // SAFETY: `r` is a unique borrow of `len` writable bytes, used only through
            // the pointer during the call.
            unsafe { zero_range_hinted(r.as_mut_ptr(), len, kernel, hint) };
            check(&buf, off, len, &format!("{kernel} hint {hint:?}"));
        }
        // Unaligned start: the hint page is clamped to the range.
        let (mut buf, off) = guarded(3);
        let r = &mut buf[off + 100..off + 100 + PAGE_SIZE + 7];
        // SAFETY: as above.
        unsafe { zero_range_hinted(r.as_mut_ptr(), r.len(), kernel, Some(5)) };
        check(
            &buf,
            off + 100,
            PAGE_SIZE + 7,
            &format!("{kernel} unaligned hinted"),
        );
    }
}

#[test]
fn sysfs_cache_sizes_parse() {
    assert_eq!(super::parse_cache_size("32768K\n"), Some(32 << 20));
    assert_eq!(super::parse_cache_size("1M"), Some(1 << 20));
    assert_eq!(super::parse_cache_size("512"), Some(512));
    assert_eq!(super::parse_cache_size("12Q"), None);
    assert_eq!(super::parse_cache_size(""), None);
}

#[test]
fn a_block_about_to_be_used_is_zeroed_through_the_cache_when_it_fits() {
    let limit = super::cache_resident_limit();
    assert!(limit >= 1 << 20, "half the last-level cache: {limit}");
    let cached = ZeroKernel::for_immediate_use(limit, limit);
    assert!(!cached.is_non_temporal(), "{cached}");
    assert_eq!(
        ZeroKernel::for_immediate_use(limit * 4, 2 << 20),
        ZeroKernel::auto(2 << 20)
    );
}
