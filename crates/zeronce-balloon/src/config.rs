//! The configuration space (`struct virtio_balloon_config`, four le32 fields), with
//! byte-granular reads and writes at any offset and length, as transports perform them.
//!
//! The device owns `num_pages` and `free_page_hint_cmd_id`; the driver writes `actual`
//! and `poison_val`. An access outside the 16 bytes, or a driver write touching a
//! device-owned byte, is refused with a typed error and changes nothing.

// Driver-written offsets and lengths are converted with checks.
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use crate::error::BalloonError;
use crate::spec::config_layout::{ACTUAL, FREE_PAGE_HINT_CMD_ID, NUM_PAGES, POISON_VAL, SIZE};

/// [`SIZE`] as an array length.
const LEN: usize = 16;
const _: () = assert!(LEN as u64 == SIZE);

/// The balloon configuration space.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigSpace {
    bytes: [u8; LEN],
}

impl ConfigSpace {
    fn field(&self, offset: u64) -> u32 {
        let o = usize::try_from(offset).expect("field offsets are constants below SIZE");
        u32::from_le_bytes(self.bytes[o..o + 4].try_into().expect("4-byte field"))
    }

    fn set_field(&mut self, offset: u64, v: u32) {
        let o = usize::try_from(offset).expect("field offsets are constants below SIZE");
        self.bytes[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// The host's target balloon size, in 4 KiB pages.
    pub fn num_pages(&self) -> u32 {
        self.field(NUM_PAGES)
    }

    /// Sets the target (device side; the caller signals the config change).
    pub fn set_num_pages(&mut self, pages: u32) {
        self.set_field(NUM_PAGES, pages);
    }

    /// The balloon size the driver last reported, in 4 KiB pages.
    pub fn actual(&self) -> u32 {
        self.field(ACTUAL)
    }

    /// The free page hint command id the device last set (device-owned).
    pub fn free_page_hint_cmd_id(&self) -> u32 {
        self.field(FREE_PAGE_HINT_CMD_ID)
    }

    /// Sets the free page hint command id (device side; the caller signals the change).
    pub fn set_free_page_hint_cmd_id(&mut self, id: u32) {
        self.set_field(FREE_PAGE_HINT_CMD_ID, id);
    }

    /// The guest's page poison value (meaningful with `PAGE_POISON`).
    pub fn poison_val(&self) -> u32 {
        self.field(POISON_VAL)
    }

    /// Checks `[offset, offset + len)` lies inside the config space.
    fn check(offset: u64, len: usize) -> Result<std::ops::Range<usize>, BalloonError> {
        let inside = |end: u64| -> Option<std::ops::Range<usize>> {
            (end <= SIZE).then_some(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)
        };
        offset
            .checked_add(len as u64)
            .and_then(inside)
            .ok_or(BalloonError::ConfigOutOfRange {
                offset,
                len,
                size: SIZE,
            })
    }

    /// Reads `data.len()` bytes at `offset`. Out-of-range reads fail and leave `data`
    /// untouched.
    pub fn read(&self, offset: u64, data: &mut [u8]) -> Result<(), BalloonError> {
        let r = Self::check(offset, data.len())?;
        data.copy_from_slice(&self.bytes[r]);
        Ok(())
    }

    /// A driver write of `data` at `offset`: its bytes inside `actual` and `poison_val`
    /// are written, its bytes over the device-owned fields are ignored. A write that
    /// touches no driver-writable byte is refused. Ignoring rather than refusing a write
    /// that spans both is what QEMU needs: its generic vhost-user device
    /// (`hw/virtio/vhost-user-base.c`, `vub_set_config`) forwards every guest config
    /// write as the whole 16-byte space at offset 0, device fields included, as they
    /// were when QEMU last read them (zeros before any read): refused, the guest's
    /// `poison_val` would never arrive, and the device would discard pages it must keep.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), BalloonError> {
        let r = Self::check(offset, data.len())?;
        let writable = |i: usize| {
            let i = i as u64;
            (ACTUAL..ACTUAL + 4).contains(&i) || (POISON_VAL..POISON_VAL + 4).contains(&i)
        };
        if !data.is_empty() && !r.clone().any(writable) {
            return Err(BalloonError::ConfigReadOnly {
                offset,
                len: data.len(),
            });
        }
        for (i, b) in r.zip(data) {
            if writable(i) {
                self.bytes[i] = *b;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::MalformedKind;

    #[test]
    fn fields_are_little_endian_and_readable_at_any_offset() {
        let mut c = ConfigSpace::default();
        c.set_num_pages(0x0102_0304);
        let mut b = [0u8; 2];
        c.read(1, &mut b).unwrap();
        assert_eq!(b, [0x03, 0x02]);
        let mut all = [0u8; 16];
        c.read(0, &mut all).unwrap();
        assert_eq!(&all[..4], &[4, 3, 2, 1]);
    }

    #[test]
    fn driver_writes_actual_byte_by_byte_like_legacy_pci() {
        let mut c = ConfigSpace::default();
        for (i, b) in 0x1234_5678u32.to_le_bytes().iter().enumerate() {
            c.write(ACTUAL + i as u64, &[*b]).unwrap();
        }
        assert_eq!(c.actual(), 0x1234_5678);
        c.write(POISON_VAL, &0xaau32.to_le_bytes()).unwrap();
        assert_eq!(c.poison_val(), 0xaa);
    }

    #[test]
    fn a_whole_space_write_through_sets_only_the_driver_fields() {
        // QEMU's vhost-user-base: the guest wrote poison_val, QEMU forwards all 16 bytes
        // as it last saw them (here: before any read, so num_pages reads 0 to it).
        let mut c = ConfigSpace::default();
        c.set_num_pages(256);
        let mut seen = [0u8; LEN];
        seen[12..16].copy_from_slice(&0xaaaa_aaaau32.to_le_bytes());
        seen[4..8].copy_from_slice(&3u32.to_le_bytes());
        c.write(0, &seen).unwrap();
        assert_eq!(c.poison_val(), 0xaaaa_aaaa);
        assert_eq!(c.actual(), 3);
        assert_eq!(c.num_pages(), 256, "device-owned bytes ignored");
        // Spanning a device field and a driver field: the driver's part only.
        c.write(3, &[9, 7]).unwrap();
        assert_eq!((c.num_pages(), c.actual() & 0xff), (256, 7));
        c.write(11, &[9, 0]).unwrap();
        assert_eq!(c.poison_val(), 0xaaaa_aa00);
        let mut id = [0u8; 4];
        c.read(8, &mut id).unwrap();
        assert_eq!(id, [0; 4], "free_page_hint_cmd_id untouched");
    }

    #[test]
    fn out_of_range_and_read_only_accesses_are_refused_without_effect() {
        let mut c = ConfigSpace::default();
        c.set_num_pages(7);
        let before = c.clone();
        for (off, len) in [(16u64, 1usize), (13, 4), (u64::MAX, 2), (0, 17)] {
            let mut b = vec![0xeeu8; len];
            let e = c.read(off, &mut b).unwrap_err();
            assert_eq!(
                e.kind(),
                Some(MalformedKind::ConfigOutOfRange),
                "{off}+{len}"
            );
            assert!(
                b.iter().all(|&x| x == 0xee),
                "failed read left the buffer alone"
            );
            let e = c.write(off, &vec![1; len]).unwrap_err();
            assert_eq!(
                e.kind(),
                Some(MalformedKind::ConfigOutOfRange),
                "{off}+{len}"
            );
        }
        for (off, len) in [(0u64, 4usize), (3, 1), (8, 1), (8, 4)] {
            let e = c.write(off, &vec![1; len]).unwrap_err();
            assert_eq!(e.kind(), Some(MalformedKind::ConfigReadOnly), "{off}+{len}");
        }
        assert_eq!(c, before);
        // Zero-length accesses inside the space are harmless no-ops.
        c.read(16, &mut []).unwrap();
        c.write(4, &[]).unwrap();
    }
}
