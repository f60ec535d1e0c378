//! Memory slots (`VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS`, memory hot-plug): the
//! bound the relay announces (`GET_MAX_MEM_SLOTS`) and enforces on `ADD_MEM_REG`.
//!
//! rust-vmm `vhost-user-backend` answers `GET_MAX_MEM_SLOTS` with a constant of its own
//! and maps every `ADD_MEM_REG` it gets, with no bound. Each region costs the daemon a
//! mapping and an open file descriptor, so the relay answers with the daemon's bound
//! ([`crate::Limits::mem_slots`]) and refuses a region past it, before the handler maps
//! anything. The relay never sees whether the handler mapped a region, so it counts the
//! regions the handler *may* hold: every region it forwarded (`SET_MEM_TABLE`'s and
//! `ADD_MEM_REG`'s), less those a `REM_MEM_REG` named exactly (guest address and size,
//! the handler's own match). A refused `SET_MEM_TABLE` leaves the handler its old table,
//! so a new table adds to the count rather than replacing it: the count can only be
//! too high, never too low, and the bound holds whatever a front-end sends.

use crate::wire::{self, Header};

/// What the relay does with a front-end message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Forward it to the handler.
    Forward,
    /// Answer it with this value instead (`GET_MAX_MEM_SLOTS`).
    Answer(u64),
}

/// The regions the handler may have mapped, and the bound on them.
#[derive(Debug)]
pub(crate) struct MemSlots {
    max: u64,
    /// Guest address and size of each region, each at most once (the handler refuses a
    /// region overlapping one it has).
    regions: Vec<(u64, u64)>,
}

impl MemSlots {
    /// No region yet; at most `max`.
    pub(crate) fn new(max: u64) -> MemSlots {
        MemSlots {
            max,
            regions: Vec::new(),
        }
    }

    /// Regions counted.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.regions.len()
    }

    /// Notes a message's regions; `Err` refuses an `ADD_MEM_REG` past the bound.
    pub(crate) fn admit(&mut self, header: &Header, payload: &[u8]) -> Result<Verdict, String> {
        match header.request {
            wire::GET_MAX_MEM_SLOTS => return Ok(Verdict::Answer(self.max)),
            wire::SET_MEM_TABLE => {
                for r in wire::regions(header, payload) {
                    self.note(r.guest_addr, r.size);
                }
            }
            wire::ADD_MEM_REG => {
                // A payload too short for a region is the handler's to refuse.
                if let Some(r) = wire::single_region(payload) {
                    let key = (r.guest_addr, r.size);
                    if !self.regions.contains(&key) && self.regions.len() as u64 >= self.max {
                        return Err(format!(
                            "ADD_MEM_REG of {:#x}+{:#x}: all {} memory slots are in use \
                             (GET_MAX_MEM_SLOTS answers {})",
                            r.guest_addr, r.size, self.max, self.max
                        ));
                    }
                    self.note(r.guest_addr, r.size);
                }
            }
            wire::REM_MEM_REG => {
                if let Some(r) = wire::single_region(payload) {
                    self.regions.retain(|&k| k != (r.guest_addr, r.size));
                }
            }
            _ => {}
        }
        Ok(Verdict::Forward)
    }

    fn note(&mut self, guest_addr: u64, size: u64) {
        if !self.regions.contains(&(guest_addr, size)) {
            self.regions.push((guest_addr, size));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(request: u32, gpa: u64, size: u64) -> (Header, Vec<u8>) {
        let mut p = vec![0u8; 8];
        for v in [gpa, size, 0x7f00_0000_0000 + gpa, 0] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        let h = Header {
            request,
            flags: wire::VERSION_1,
            size: p.len() as u32,
        };
        (h, p)
    }

    fn admit(s: &mut MemSlots, request: u32, gpa: u64, size: u64) -> Result<Verdict, String> {
        let (h, p) = msg(request, gpa, size);
        s.admit(&h, &p)
    }

    #[test]
    fn the_bound_is_announced_and_enforced_and_removal_frees_a_slot() {
        let mut s = MemSlots::new(2);
        let (h, _) = msg(wire::GET_MAX_MEM_SLOTS, 0, 0);
        assert_eq!(s.admit(&h, &[]), Ok(Verdict::Answer(2)));
        assert_eq!(
            admit(&mut s, wire::ADD_MEM_REG, 0, 1 << 20),
            Ok(Verdict::Forward)
        );
        assert_eq!(
            admit(&mut s, wire::ADD_MEM_REG, 1 << 30, 1 << 20),
            Ok(Verdict::Forward)
        );
        let third = admit(&mut s, wire::ADD_MEM_REG, 2 << 30, 1 << 20);
        assert!(third.unwrap_err().contains("all 2 memory slots"));
        // The same region again takes no new slot (the handler refuses the overlap).
        assert_eq!(
            admit(&mut s, wire::ADD_MEM_REG, 0, 1 << 20),
            Ok(Verdict::Forward)
        );
        // A removal that matches nothing the handler has frees nothing.
        admit(&mut s, wire::REM_MEM_REG, 1 << 30, 2 << 20).unwrap();
        assert_eq!(s.len(), 2);
        admit(&mut s, wire::REM_MEM_REG, 1 << 30, 1 << 20).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(
            admit(&mut s, wire::ADD_MEM_REG, 2 << 30, 1 << 20),
            Ok(Verdict::Forward)
        );
    }

    #[test]
    fn a_mem_table_adds_to_the_count_so_a_refused_one_cannot_hide_regions() {
        let mut s = MemSlots::new(2);
        admit(&mut s, wire::ADD_MEM_REG, 1 << 30, 1 << 20).unwrap();
        let mut p = Vec::new();
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        for v in [0u64, 1 << 20, 0x7f00_0000_0000, 0] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        let h = Header {
            request: wire::SET_MEM_TABLE,
            flags: wire::VERSION_1,
            size: p.len() as u32,
        };
        assert_eq!(s.admit(&h, &p), Ok(Verdict::Forward));
        assert_eq!(s.len(), 2);
        assert!(admit(&mut s, wire::ADD_MEM_REG, 2 << 30, 1 << 20).is_err());
    }
}
