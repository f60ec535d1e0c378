//! Zeroing kernels, chosen at run time from the CPU's features.
//!
//! Small ranges are best zeroed with cache-allocating stores (`rep stosb`, memset): the
//! caller is about to use them. Large ranges (a freshly freed 2 MiB huge page, a 256 MiB
//! buffer) are best zeroed with stores that bypass the cache (non-temporal stores,
//! AMD `clzero`): no read-for-ownership, no eviction of the caller's working set
//! (docs/ARCHITECTURE.md §7: ~35 GB/s against ~10 GB/s for `rep stosb` on 2 MiB pages). The hinted
//! variant zeroes the page the caller will touch first last, with a cache-allocating
//! kernel, so it is hot when the caller gets it.

mod kernels;

use std::fmt;

use crate::PAGE_SIZE;

/// A way of writing zeroes to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZeroKernel {
    /// `core::ptr::write_bytes` (the compiler's / libc's memset). Available everywhere.
    WriteBytes,
    /// `rep stosb` (x86-64; fast with ERMS). Cache-allocating.
    RepStosb,
    /// SSE2 non-temporal 16-byte stores + `sfence` (x86-64).
    NtSse2,
    /// AVX2 non-temporal 32-byte stores + `sfence` (x86-64 with AVX2).
    NtAvx2,
    /// AMD `clzero`, one 64-byte line per instruction + `sfence` (Zen and later).
    Clzero,
}

/// From this size on, [`ZeroKernel::auto`] picks a cache-bypassing kernel. Measured with
/// `zeronce bench zero` (AMD EPYC, family 26 = Zen 5): on cold 2 MiB chunks the
/// non-temporal kernels are ~2× faster than `rep stosb` (no read-for-ownership); on
/// cache-resident 2 MiB they are ~1.4× slower. Ranges under 1 MiB are likely cached (L2 is 0.5–1 MiB per core on
/// Zen 3–5) and about to be used, so cache-allocating stores are kept there.
pub const NON_TEMPORAL_THRESHOLD: usize = 1 << 20;

/// Half the last-level cache (`/sys/devices/system/cpu/cpu0/cache/index*/size` of the
/// highest level), 8 MiB where it cannot be read: blocks up to this size are zeroed with
/// cache-allocating stores when their caller is about to use them.
pub fn cache_resident_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| last_level_cache_bytes().map_or(8 << 20, |b| b / 2))
}

fn last_level_cache_bytes() -> Option<usize> {
    // Miri runs isolated from the file system: the fallback.
    if cfg!(miri) {
        return None;
    }
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).ok();
        let (Some(level), Some(size)) = (read("level"), read("size")) else {
            continue;
        };
        let (Ok(level), Some(bytes)) = (level.trim().parse::<u32>(), parse_cache_size(&size))
        else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, bytes)| bytes)
}

/// sysfs cache sizes: `32768K`, `2048K`, `1M`.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = digits.parse().ok()?;
    match unit {
        "" => Some(n),
        "K" => n.checked_mul(1 << 10),
        "M" => n.checked_mul(1 << 20),
        "G" => n.checked_mul(1 << 30),
        _ => None,
    }
}

impl ZeroKernel {
    /// Every kernel, available or not.
    pub const ALL: [ZeroKernel; 5] = [
        ZeroKernel::WriteBytes,
        ZeroKernel::RepStosb,
        ZeroKernel::NtSse2,
        ZeroKernel::NtAvx2,
        ZeroKernel::Clzero,
    ];

    /// A short stable name (used in benchmark output).
    pub fn name(self) -> &'static str {
        match self {
            ZeroKernel::WriteBytes => "write_bytes",
            ZeroKernel::RepStosb => "rep_stosb",
            ZeroKernel::NtSse2 => "nt_sse2",
            ZeroKernel::NtAvx2 => "nt_avx2",
            ZeroKernel::Clzero => "clzero",
        }
    }

    /// Whether this kernel's stores bypass the cache.
    pub fn is_non_temporal(self) -> bool {
        matches!(
            self,
            ZeroKernel::NtSse2 | ZeroKernel::NtAvx2 | ZeroKernel::Clzero
        )
    }

    /// Whether this CPU can run this kernel.
    pub(crate) fn is_available(self) -> bool {
        match self {
            ZeroKernel::WriteBytes => true,
            #[cfg(target_arch = "x86_64")]
            ZeroKernel::RepStosb | ZeroKernel::NtSse2 => true,
            #[cfg(target_arch = "x86_64")]
            ZeroKernel::NtAvx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            ZeroKernel::Clzero => has_clzero(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The kernels this CPU can run, in [`ZeroKernel::ALL`] order.
    pub fn available() -> Vec<ZeroKernel> {
        Self::ALL.into_iter().filter(|k| k.is_available()).collect()
    }

    /// The kernel to use for a range of `len` bytes: cache-allocating below
    /// [`NON_TEMPORAL_THRESHOLD`] (`rep stosb` with ERMS, else `write_bytes`), from there on
    /// the best available cache-bypassing one (AVX2 streams, else `clzero`, else SSE2
    /// streams: on AMD EPYC AVX2 streams and `clzero` are within noise of each other, both
    /// ~2× `rep stosb` on cold 2 MiB chunks; see `zeronce bench zero`).
    pub fn auto(len: usize) -> ZeroKernel {
        if len < NON_TEMPORAL_THRESHOLD {
            Self::cache_friendly()
        } else {
            [ZeroKernel::NtAvx2, ZeroKernel::Clzero, ZeroKernel::NtSse2]
                .into_iter()
                .find(|k| k.is_available())
                .unwrap_or(ZeroKernel::WriteBytes)
        }
    }

    /// The kernel for a part of a block of `block_len` bytes that is zeroed for a caller
    /// who uses it next (a zeroed allocation): cache-allocating when the whole block fits
    /// in half the last-level cache ([`cache_resident_limit`]), so the caller's first
    /// touches hit the cache; otherwise [`ZeroKernel::auto`] of the part. Background
    /// zeroing, whose block nobody is about to use, keeps [`ZeroKernel::auto`].
    ///
    /// Measured on AMD EPYC (family 25, 32 MiB L3), calloc + read + write + free of a
    /// cache-hot block, streams vs `rep stosb`: 2 MiB 0.15 vs 0.07 ms, 8 MiB 0.50 vs
    /// 0.28 ms, parity at 16 MiB.
    pub fn for_immediate_use(block_len: usize, part_len: usize) -> ZeroKernel {
        if block_len <= cache_resident_limit() {
            Self::cache_friendly()
        } else {
            Self::auto(part_len)
        }
    }

    /// The best cache-allocating kernel: `rep stosb` where ERMS makes it fast, else
    /// `write_bytes`.
    pub fn cache_friendly() -> ZeroKernel {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("ermsb") {
            return ZeroKernel::RepStosb;
        }
        ZeroKernel::WriteBytes
    }
}

impl fmt::Display for ZeroKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the CPU has AMD's `clzero` (CPUID `0x8000_0008` EBX bit 0).
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(crate) fn has_clzero() -> bool {
    use std::arch::x86_64::__cpuid;
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let max_ext = __cpuid(0x8000_0000).eax;
        max_ext >= 0x8000_0008 && __cpuid(0x8000_0008).ebx & 1 == 1
    })
}

/// Whether the CPU has AMD's `clzero` (never, off x86-64).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn has_clzero() -> bool {
    false
}

/// Under Miri, which cannot run `cpuid`: true, so the `clzero` kernel runs with the
/// stand-in store of its cache lines (see `kernels`).
#[cfg(all(target_arch = "x86_64", miri))]
pub(crate) fn has_clzero() -> bool {
    true
}

/// Zeroes `[ptr, ptr + len)` with `kernel`; an unavailable kernel falls back to
/// `write_bytes`. Any alignment and length are accepted.
///
/// # Safety
///
/// `ptr` must be valid for writes of `len` bytes, and no Rust reference to those bytes
/// may be alive during the call.
pub(crate) unsafe fn zero_range(ptr: *mut u8, len: usize, kernel: ZeroKernel) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller's contract is exactly each kernel's contract; the CPU-feature
    // preconditions of NtAvx2 and Clzero are checked by `is_available` in their arms
    // (SSE2 and `rep stosb` are x86-64 baseline).
    unsafe {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            ZeroKernel::RepStosb => kernels::rep_stosb(ptr, len),
            #[cfg(target_arch = "x86_64")]
            ZeroKernel::NtSse2 => kernels::nt_sse2(ptr, len),
            #[cfg(target_arch = "x86_64")]
            ZeroKernel::NtAvx2 if kernel.is_available() => kernels::nt_avx2(ptr, len),
            #[cfg(target_arch = "x86_64")]
            ZeroKernel::Clzero if kernel.is_available() => kernels::clzero(ptr, len),
            _ => kernels::write_bytes(ptr, len),
        }
    }
}

/// Zeroes `[ptr, ptr + len)` with `kernel`, except the [`PAGE_SIZE`] page (address-
/// aligned) holding `ptr + hint`, which is zeroed last with the cache-friendly kernel so
/// that it is hot in the cache when the caller touches it. A `hint` of `None` or outside
/// `0..len` means no hint.
///
/// # Safety
///
/// As for [`zero_range`].
pub(crate) unsafe fn zero_range_hinted(
    ptr: *mut u8,
    len: usize,
    kernel: ZeroKernel,
    hint: Option<usize>,
) {
    let Some(hint) = hint.filter(|&h| h < len) else {
        // SAFETY: forwarded contract.
        return unsafe { zero_range(ptr, len, kernel) };
    };
    let base = ptr as usize;
    let page_start = ((base + hint) & !(PAGE_SIZE - 1)).max(base) - base;
    let page_end = (page_start + PAGE_SIZE).min(len);
    // SAFETY: the three pieces partition `[ptr, ptr + len)`; the contract is forwarded.
    // Non-temporal kernels end with `sfence`, so the hot page's cached stores cannot be
    // reordered before them.
    unsafe {
        zero_range(ptr, page_start, kernel);
        zero_range(ptr.add(page_end), len - page_end, kernel);
        zero_range(
            ptr.add(page_start),
            page_end - page_start,
            ZeroKernel::cache_friendly(),
        );
    }
}

/// Safe wrapper: zeroes `buf` with `kernel` (the tests' way to call a kernel).
#[cfg(test)]
pub(crate) fn zero_slice(buf: &mut [u8], kernel: ZeroKernel) {
    // SAFETY: `buf` is a unique borrow, valid for writes of its length; it is not used as
    // a reference while the raw pointer writes (the borrow is reborrowed as a pointer).
    unsafe { zero_range(buf.as_mut_ptr(), buf.len(), kernel) }
}

#[cfg(test)]
mod tests;
