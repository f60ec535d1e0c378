//! A guest that rewrites its own descriptors and buffers while the device reads them:
//! on the `n`th guest-memory lookup of a call outside the available ring, one aligned
//! 32-bit word (a descriptor's address, length or flags and next, a PFN of an inflate
//! array, a statistics entry) is overwritten.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{Cursor, DATA, QUEUE_SIZE};

/// What the fuzz input asks the guest to overwrite during one call.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mutation {
    /// The lookup (outside the available ring) on which the write lands.
    pub nth: u32,
    /// The word overwritten (4-byte aligned).
    pub at: u64,
    /// Whether `at` is in queue `q`'s descriptor table.
    pub desc: bool,
    /// The new value.
    pub value: u32,
}

/// A mutation that happened: where (a descriptor or not), and the word written.
#[derive(Clone, Copy, Debug)]
pub(super) struct Applied {
    pub at: u64,
    pub desc: bool,
    pub new: u32,
}

impl Mutation {
    /// Reads a mutation for a call on a queue whose descriptor table is at `table`, or
    /// none (about half the time).
    pub fn parse(c: &mut Cursor<'_>, table: u64) -> Option<Mutation> {
        let sel = c.u8();
        let nth = u32::from(c.u8() % 48);
        let (at, desc, value) = match sel % 6 {
            0..=2 => return None,
            3 => {
                // A PFN of one of the arrays a batch uses (pages 0..6 of the data area),
                // often made to point at the bitmaps' page or another region.
                let at = DATA + 0x1000 * u64::from(c.u8() % 6) + 4 * u64::from(c.u8() % 16);
                let value = match c.u8() % 3 {
                    0 => 0x110 + u32::from(c.u8() % 4),
                    1 => 0x800 + u32::from(c.u16() % 1024),
                    _ => c.u32(),
                };
                (at, false, value)
            }
            4 => {
                // A descriptor's address (low or high half), length, or flags and next.
                let i = u64::from(c.u8() % QUEUE_SIZE as u8);
                (table + 16 * i + 4 * u64::from(c.u8() % 4), true, c.u32())
            }
            _ => (DATA + 4 * u64::from(c.u16() % 0x4000), false, c.u32()),
        };
        Some(Mutation {
            nth,
            at,
            desc,
            value,
        })
    }

    /// Counts one lookup; on the `nth`, writes the word and says so.
    pub fn on_lookup(&self, m: &GuestMemoryMmap, seen: &mut u32) -> Option<Applied> {
        *seen += 1;
        if *seen != self.nth + 1 {
            return None;
        }
        m.write_obj(self.value, GuestAddress(self.at)).ok()?;
        Some(Applied {
            at: self.at,
            desc: self.desc,
            new: self.value,
        })
    }
}
