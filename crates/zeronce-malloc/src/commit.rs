//! The kernel's overcommit heuristic, applied before a large allocation is served.
//!
//! Under `vm.overcommit_memory = 0` (the default) the kernel refuses a private writable
//! mapping of more pages than the machine's RAM and swap together, so glibc's `malloc` of
//! such a size (a mapping of its own) returns `NULL` and a program can fall back to a
//! smaller buffer. zeronce's arena and mimalloc's reserve their address space with
//! `MAP_NORESERVE` and commit it later, which the kernel never checks: without this test
//! such a `malloc` succeeds and the program meets the OOM killer when it touches the
//! memory. Under `overcommit_memory = 1` the kernel refuses nothing and neither does this;
//! under `2` it accounts every mapping, `MAP_NORESERVE` or not, so mimalloc's own mapping
//! fails and reports it.

use rustix::fs::{open, Mode, OFlags};
use rustix::io::read;
use rustix::system::sysinfo;

/// RAM and swap as the heuristic counts them, read when asked (swap may come and go).
#[derive(Clone, Copy, Debug)]
pub struct CommitGuess {
    /// Bytes of RAM when the library started: a size up to it is never refused, so the
    /// common case costs one compare and no system call.
    ram: u64,
}

impl CommitGuess {
    /// Reads the machine's RAM (no allocation: safe before the allocator is up).
    pub fn new() -> CommitGuess {
        CommitGuess {
            ram: ram_and_swap().0,
        }
    }

    /// Whether the kernel's heuristic would refuse a mapping of `size` bytes now, so
    /// the allocation must be `NULL` with `ENOMEM`, as glibc's would be.
    #[inline]
    pub fn refuses(&self, size: usize) -> bool {
        size as u64 > self.ram && self.refuses_now(size as u64)
    }

    /// [`CommitGuess::refuses`] past the RAM: the mode and the swap as they are now.
    #[cold]
    fn refuses_now(&self, size: u64) -> bool {
        if overcommit_mode() != Some(b'0') {
            return false;
        }
        let (ram, swap) = ram_and_swap();
        size > ram.saturating_add(swap)
    }
}

/// Bytes of RAM and of swap (the kernel's `totalram_pages` and `total_swap_pages`).
fn ram_and_swap() -> (u64, u64) {
    let info = sysinfo();
    let unit = u64::from(info.mem_unit.max(1));
    (
        info.totalram.saturating_mul(unit),
        info.totalswap.saturating_mul(unit),
    )
}

/// The first byte of `/proc/sys/vm/overcommit_memory` (`b'0'`, `b'1'` or `b'2'`), `None`
/// when it cannot be read (then nothing is refused: the kernel decides).
fn overcommit_mode() -> Option<u8> {
    let fd = open(
        "/proc/sys/vm/overcommit_memory",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut byte = [0u8; 1];
    match read(&fd, &mut byte) {
        Ok(1) => Some(byte[0]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_up_to_the_ram_are_never_refused_and_past_ram_and_swap_follow_the_mode() {
        let guess = CommitGuess::new();
        let (ram, swap) = ram_and_swap();
        assert!(ram > 0, "sysinfo reports RAM");
        assert!(!guess.refuses(ram as usize));
        let past = ram.saturating_add(swap).saturating_add(1 << 30) as usize;
        let mode = overcommit_mode();
        assert!(matches!(mode, Some(b'0' | b'1' | b'2')), "{mode:?}");
        assert_eq!(guess.refuses(past), mode == Some(b'0'));
    }
}
