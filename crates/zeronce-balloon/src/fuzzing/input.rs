//! The input decoder: fuzz bytes read as numbers, addresses and lengths biased towards
//! the interesting edges of the harness's guest RAM, and well-formed requests per queue.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::oracle::Promise;
use super::{DATA, REGIONS};
use crate::features::QueueKind;
use crate::guest_ring::DriverBuf;

/// The fuzz input still to be read; reads past its end yield zeros.
pub(super) struct Cursor<'a>(pub(super) &'a [u8]);

impl Cursor<'_> {
    pub(super) fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    pub(super) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub(super) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub(super) fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    /// An address: mostly inside RAM or at interesting edges.
    pub(super) fn addr(&mut self) -> u64 {
        match self.u8() % 8 {
            0 => self.u64(),
            1 => u64::MAX - u64::from(self.u16()),
            2 => (4 << 20) - 0x1000 * u64::from(self.u8() % 4), // end of region 0
            3 => (6 << 20) + u64::from(self.u16()),             // hole
            4 => (8 << 20) + 0x1000 * u64::from(self.u16() % 1024),
            _ => DATA + 0x1000 * u64::from(self.u8()) + u64::from(self.u8() % 2) * 0x800,
        }
    }
    pub(super) fn len(&mut self) -> u32 {
        match self.u8() % 6 {
            0 => self.u32(),
            1 => 0,
            2 => 0x1000 * u32::from(self.u8() % 8 + 1),
            3 => 0x20_0000,
            _ => u32::from(self.u16() % 512),
        }
    }
}

/// A request shaped for `kind`, with fuzz-chosen (mostly valid) contents, its PFN array
/// or stats buffer in page `slot` of the data area (fuzz-chosen when `None`).
pub(super) fn plausible_request(
    c: &mut Cursor<'_>,
    mem: &GuestMemoryMmap,
    kind: Option<QueueKind>,
    bitmap: bool,
    slot: Option<u64>,
    cmd_id: u32,
) -> (Vec<DriverBuf>, Option<Promise>) {
    let arr = DATA + 0x1000 * slot.unwrap_or_else(|| u64::from(c.u8() % 16));
    match kind {
        Some(QueueKind::Inflate | QueueKind::Deflate) => {
            let k = u32::from(c.u8() % 16) + 1;
            let pfns: Vec<u32> = (0..k)
                .map(|_| match c.u8() % 5 {
                    0 => c.u32(),
                    1 => 0x800 + u32::from(c.u16() % 1024), // region 1
                    2 if c.u8() < 128 => 0xbfc + u32::from(c.u8() % 8), // 1|2 edge
                    3 => 0x110 + u32::from(c.u8() % 4),     // the bitmaps' page
                    _ => 0x200 + u32::from(c.u16() % 512),  // region 0, above DATA
                })
                .collect();
            let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
            let _ = mem.write_slice(&bytes, GuestAddress(arr));
            let mut bufs = vec![DriverBuf::read(arr, 4 * k)];
            let mut promise = None;
            if bitmap && kind == Some(QueueKind::Inflate) {
                let at = DATA + 0x10_000 + 0x40 * u64::from(c.u8() % 64);
                bufs.push(DriverBuf::write(at, k.div_ceil(8)));
                promise = Some(Promise::Inflate {
                    alt: pfns.clone(),
                    pfns,
                    arr,
                    bitmap: at,
                });
            }
            (bufs, promise)
        }
        Some(QueueKind::Stats) => {
            let k = usize::from(c.u8() % 8);
            let bytes: Vec<u8> = (0..k)
                .flat_map(|_| {
                    let tag = u16::from(c.u8() % 20).to_le_bytes();
                    tag.into_iter().chain(c.u64().to_le_bytes())
                })
                .collect();
            let _ = mem.write_slice(&bytes, GuestAddress(arr));
            (vec![DriverBuf::read(arr, bytes.len() as u32)], None)
        }
        // free_page_vq: a command id (the run's, STOP, or any) or hint blocks.
        Some(QueueKind::FreePageHint) if c.u8() & 1 == 0 => {
            let id = match c.u8() % 3 {
                0 => cmd_id,
                1 => 0,
                _ => c.u32(),
            };
            let _ = mem.write_obj(id, GuestAddress(arr));
            (vec![DriverBuf::read(arr, 4)], None)
        }
        _ => {
            let bufs: Vec<DriverBuf> = (0..c.u8() % 4 + 1)
                .map(|_| {
                    let at = REGIONS[1].0 + 0x1000 * u64::from(c.u16() % 1024);
                    DriverBuf::write(at, 0x1000 * (u32::from(c.u8() % 16) + 1))
                })
                .collect();
            let blocks: Vec<(u64, u64)> = bufs.iter().map(|b| (b.addr, u64::from(b.len))).collect();
            let total = blocks.iter().map(|b| b.1 as u32).sum();
            (bufs, Some(Promise::Report { blocks, total }))
        }
    }
}
