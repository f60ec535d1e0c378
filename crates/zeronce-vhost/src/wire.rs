//! The few vhost-user wire facts the daemon handles itself, in front of rust-vmm's
//! request handler: the message header, the normalisation of `SET_MEM_TABLE` payloads
//! that carry unused region slots, and the `CONFIG_CHANGE_MSG` back-end request.
//!
//! A vhost-user message is a 12-byte header (`request: u32`, `flags: u32`, `size: u32`,
//! little-endian) followed by `size` bytes of payload; file descriptors travel as
//! `SCM_RIGHTS` with the header. (vhost-user specification, "Message Specification".)

use thiserror::Error;

/// Size of the message header.
pub const HEADER_SIZE: usize = 12;
/// `VHOST_USER_SET_MEM_TABLE` (front-end request 5).
pub const SET_MEM_TABLE: u32 = 5;
/// `VHOST_USER_GET_MAX_MEM_SLOTS` (front-end request 36; with `CONFIGURE_MEM_SLOTS`).
pub const GET_MAX_MEM_SLOTS: u32 = 36;
/// `VHOST_USER_ADD_MEM_REG` (front-end request 37; with `CONFIGURE_MEM_SLOTS`): one
/// region and its file descriptor.
pub const ADD_MEM_REG: u32 = 37;
/// `VHOST_USER_REM_MEM_REG` (front-end request 38; with `CONFIGURE_MEM_SLOTS`): one
/// region, no file descriptor (QEMU sends `mmap_offset` 0).
pub const REM_MEM_REG: u32 = 38;
/// Header flag bit 3: the front-end wants a reply (`REPLY_ACK`).
pub const NEED_REPLY: u32 = 0x8;
/// Header flag bit 2: this is a reply.
pub const REPLY: u32 = 0x4;
/// `VHOST_USER_SET_BACKEND_REQ_FD` (front-end request 21).
pub const SET_BACKEND_REQ_FD: u32 = 21;
/// `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` (back-end request 2).
pub const BACKEND_CONFIG_CHANGE_MSG: u32 = 2;
/// Header flag bits 0-1: the protocol version, always 1.
pub const VERSION_1: u32 = 0x1;
/// Largest payload the daemon accepts from a front-end. The biggest message it serves is
/// `SET_MEM_TABLE` with 8 regions (8 + 8 * 32 bytes); `GET_CONFIG`/`SET_CONFIG` carry at
/// most 12 + 256 bytes.
pub const MAX_PAYLOAD: usize = 4096;
/// `struct vhost_user_memory` before its regions: `nregions: u32`, `padding: u32`.
const MEM_TABLE_HEAD: usize = 8;
/// One `struct vhost_user_memory_region`: four u64 (guest address, size, user address,
/// mmap offset).
const MEM_REGION: usize = 32;
/// At most this many regions (`VHOST_MEMORY_BASELINE_NREGIONS`).
pub const MAX_REGIONS: usize = 8;

/// A message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The request code.
    pub request: u32,
    /// Version and flag bits.
    pub flags: u32,
    /// Payload size in bytes.
    pub size: u32,
}

impl Header {
    /// Decodes a header.
    pub fn decode(b: &[u8; HEADER_SIZE]) -> Header {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Header {
            request: word(0),
            flags: word(4),
            size: word(8),
        }
    }

    /// Encodes the header.
    pub fn encode(self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..4].copy_from_slice(&self.request.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b
    }
}

/// The back-end request telling the front-end the configuration space changed. Sent
/// without `NEED_REPLY`: a front-end that answers only when asked (Linux `virtio_uml`,
/// QEMU) then sends nothing back, so nobody has to read the back-end channel.
pub fn config_change_msg() -> [u8; HEADER_SIZE] {
    Header {
        request: BACKEND_CONFIG_CHANGE_MSG,
        flags: VERSION_1,
        size: 0,
    }
    .encode()
}

/// One `struct vhost_user_memory_region`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Guest physical address of its start.
    pub guest_addr: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The front-end's virtual address of its start.
    pub user_addr: u64,
    /// Where it starts in the file that backs it.
    pub mmap_offset: u64,
}

/// The memory regions a `SET_MEM_TABLE` (after [`normalize`]) or `ADD_MEM_REG` message
/// declares, in the order of their file descriptors; empty for any other message (and
/// for a payload too short for what it announces, which `vhost` refuses).
pub fn regions(header: &Header, payload: &[u8]) -> Vec<Region> {
    let (count, first) = match header.request {
        SET_MEM_TABLE if payload.len() >= MEM_TABLE_HEAD => {
            let n = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
            (n as usize, MEM_TABLE_HEAD)
        }
        ADD_MEM_REG => return single_region(payload).into_iter().collect(),
        _ => return Vec::new(),
    };
    region_list(payload, first, count)
}

/// The one region of an `ADD_MEM_REG` or `REM_MEM_REG` payload (`struct
/// VhostUserMemRegMsg`: a u64 of padding, then the region); `None` if it is too short.
pub fn single_region(payload: &[u8]) -> Option<Region> {
    region_list(payload, 8, 1).pop()
}

/// `count` regions from `first` on, as many as `payload` holds (at most [`MAX_REGIONS`]).
fn region_list(payload: &[u8], first: usize, count: usize) -> Vec<Region> {
    let word = |at: usize| {
        payload
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    (0..count.min(MAX_REGIONS))
        .map_while(|i| {
            let at = first + i * MEM_REGION;
            Some(Region {
                guest_addr: word(at)?,
                size: word(at + 8)?,
                user_addr: word(at + 16)?,
                mmap_offset: word(at + 24)?,
            })
        })
        .collect()
}

/// A message the normaliser refuses (the connection is then closed).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// The payload is larger than any request the daemon serves.
    #[error("vhost-user message {request} carries {size} bytes (at most {MAX_PAYLOAD})")]
    TooLarge {
        /// The request code.
        request: u32,
        /// The announced payload size.
        size: u32,
    },
}

/// What [`normalize`] did to a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Normalized {
    /// Passed unchanged.
    Unchanged,
    /// A `SET_MEM_TABLE` payload cut from `from` to `to` bytes.
    MemTableTrimmed {
        /// Size received.
        from: u32,
        /// Size forwarded.
        to: u32,
    },
}

/// Checks a header before its payload is read.
pub fn check_header(h: &Header) -> Result<(), WireError> {
    if h.size as usize > MAX_PAYLOAD {
        return Err(WireError::TooLarge {
            request: h.request,
            size: h.size,
        });
    }
    Ok(())
}

/// Brings a front-end message into the exact form rust-vmm `vhost` 0.18 accepts.
///
/// Linux `virtio_uml` (arch/um/drivers/virtio_uml.c) sends `SET_MEM_TABLE` with the size
/// of its whole `vhost_user_mem_regions` struct, which has room for two regions, even when
/// `nregions` is 1: 8 + 2 * 32 = 72 bytes for a message whose meaningful part is 40. The
/// specification defines the payload by `nregions`; `vhost` rejects any other size, and
/// the guest's probe then fails with -EIO. The unused slots carry no information, so the
/// payload is cut to `8 + nregions * 32` bytes and the header's size follows. A payload
/// shorter than `nregions` needs, or `nregions` above [`MAX_REGIONS`], is left for `vhost`
/// to refuse.
pub fn normalize(header: &mut Header, payload: &mut Vec<u8>) -> Normalized {
    if header.request != SET_MEM_TABLE || payload.len() < MEM_TABLE_HEAD {
        return Normalized::Unchanged;
    }
    let nregions = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
    if nregions > MAX_REGIONS {
        return Normalized::Unchanged;
    }
    let exact = MEM_TABLE_HEAD + nregions * MEM_REGION;
    if payload.len() <= exact {
        return Normalized::Unchanged;
    }
    let from = header.size;
    payload.truncate(exact);
    header.size = exact as u32;
    Normalized::MemTableTrimmed {
        from,
        to: header.size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem_table(nregions: u32, slots: usize) -> (Header, Vec<u8>) {
        let mut p = Vec::new();
        p.extend_from_slice(&nregions.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        for i in 0..slots as u64 {
            for field in [i << 30, 256 << 20, 0x7f00_0000_0000 + (i << 30), i << 30] {
                p.extend_from_slice(&field.to_le_bytes());
            }
        }
        let h = Header {
            request: SET_MEM_TABLE,
            flags: VERSION_1 | 0x8,
            size: p.len() as u32,
        };
        (h, p)
    }

    #[test]
    fn uml_mem_table_with_two_slots_and_one_region_is_cut_to_40_bytes() {
        let (mut h, mut p) = mem_table(1, 2);
        assert_eq!(h.size, 72, "the size virtio_uml sends");
        let first_region = p[8..40].to_vec();
        let r = normalize(&mut h, &mut p);
        assert_eq!(r, Normalized::MemTableTrimmed { from: 72, to: 40 });
        assert_eq!((h.size, p.len()), (40, 40));
        assert_eq!(
            &p[8..40],
            &first_region[..],
            "the region itself is untouched"
        );
        assert_eq!(h.flags, VERSION_1 | 0x8, "flags (NEED_REPLY) kept");
    }

    #[test]
    fn exact_short_oversized_and_other_messages_pass_unchanged() {
        for (n, slots) in [(1, 1), (2, 2), (2, 1), (9, 10), (0, 0)] {
            let (mut h, mut p) = mem_table(n, slots);
            let before = (h, p.clone());
            assert_eq!(
                normalize(&mut h, &mut p),
                Normalized::Unchanged,
                "{n}/{slots}"
            );
            assert_eq!((h, p), before);
        }
        let mut h = Header {
            request: 2,
            flags: VERSION_1,
            size: 72,
        };
        let mut p = vec![0u8; 72];
        assert_eq!(normalize(&mut h, &mut p), Normalized::Unchanged);
        assert_eq!(p.len(), 72);
    }

    #[test]
    fn regions_are_read_from_mem_tables_and_add_mem_reg() {
        let (h, p) = mem_table(2, 2);
        let r = regions(&h, &p);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[1],
            Region {
                guest_addr: 1 << 30,
                size: 256 << 20,
                user_addr: 0x7f00_0000_0000 + (1 << 30),
                mmap_offset: 1 << 30
            }
        );
        let (h, p) = mem_table(3, 2);
        assert_eq!(regions(&h, &p).len(), 2, "only what the payload holds");
        let add = Header {
            request: ADD_MEM_REG,
            ..h
        };
        let mut p = vec![0u8; 8];
        p.extend_from_slice(&mem_table(1, 1).1[8..]);
        assert_eq!(regions(&add, &p)[0].size, 256 << 20);
        let other = Header { request: 2, ..h };
        assert!(regions(&other, &p).is_empty());
    }

    #[test]
    fn header_round_trips_and_oversized_payloads_are_refused() {
        let h = Header {
            request: 7,
            flags: 5,
            size: 300,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        assert!(check_header(&h).is_ok());
        let big = Header { size: 4097, ..h };
        assert_eq!(
            check_header(&big),
            Err(WireError::TooLarge {
                request: 7,
                size: 4097
            })
        );
        let c = Header::decode(&config_change_msg());
        assert_eq!((c.request, c.flags, c.size), (2, 1, 0));
    }
}
