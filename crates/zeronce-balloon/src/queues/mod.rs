//! Queue handlers: pure parsing and planning of guest requests, one module per queue.
//! Nothing here performs a discard; the device executes the plans.
// Guest-controlled numbers (PFNs, lengths, counts) are converted with checks: a silent
// truncation would plan a discard of the wrong range.
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

pub(crate) mod hint;
pub(crate) mod inflate;
pub(crate) mod reporting;
pub(crate) mod stats;

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryRegion};

use crate::error::{checked_end, BalloonError};
use crate::features::QueueKind;
use crate::spec::limits::MAX_CHAIN_DESCRIPTORS;

/// Size of one split-ring descriptor (`struct virtq_desc`).
const DESCRIPTOR_SIZE: u64 = 16;

/// One descriptor of a chain, as the handlers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Desc {
    /// Guest physical address of the buffer.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
    /// Whether the device may write it.
    pub writable: bool,
}

/// Walks the chain starting at `head` in the split descriptor table at `desc_table`
/// (`queue_size` entries) and collects its descriptors.
///
/// The device reads the table itself instead of through virtio-queue's chain iterator,
/// which follows indirect tables transparently and hides a loop or a bad `next` as a
/// short chain. Refused: a head outside the table ([`BalloonError::InvalidHead`]), an
/// indirect descriptor (`VIRTIO_F_INDIRECT_DESC` is never offered, and a driver must not
/// use them unless negotiated: [`BalloonError::IndirectDescriptor`]), and chains longer
/// than [`MAX_CHAIN_DESCRIPTORS`], looping, or with a `next` outside the table or a
/// descriptor outside guest memory ([`BalloonError::BadChain`]).
pub(crate) fn collect_chain<M: GuestMemory + ?Sized>(
    mem: &M,
    desc_table: GuestAddress,
    queue_size: u16,
    head: u16,
    queue: QueueKind,
) -> Result<Vec<Desc>, BalloonError> {
    if head >= queue_size {
        return Err(BalloonError::InvalidHead {
            queue,
            head,
            size: queue_size,
        });
    }
    let mut descs = Vec::new();
    let mut next = head;
    loop {
        let bad = |seen: usize| BalloonError::BadChain { queue, seen };
        if descs.len() == MAX_CHAIN_DESCRIPTORS || next >= queue_size {
            return Err(bad(descs.len() + 1));
        }
        let at = desc_table
            .checked_add(u64::from(next) * DESCRIPTOR_SIZE)
            .ok_or(bad(descs.len()))?;
        let d: Descriptor = mem.read_obj(at).map_err(|_| bad(descs.len()))?;
        if d.refers_to_indirect_table() {
            return Err(BalloonError::IndirectDescriptor {
                queue,
                index: descs.len(),
            });
        }
        descs.push(Desc {
            addr: d.addr(),
            len: d.len(),
            writable: d.is_write_only(),
        });
        if !d.has_next() {
            return Ok(descs);
        }
        next = d.next();
    }
}

/// A validated guest range inside one region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionRange {
    /// Start of the range.
    pub gpa: GuestAddress,
    /// Length (> 0).
    pub len: u64,
    /// Start of the region holding it.
    pub region_start: GuestAddress,
    /// Length of that region.
    pub region_len: u64,
}

/// Checks `[gpa, gpa + len)` is non-empty, does not overflow and lies in one region.
pub(crate) fn region_range<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    queue: QueueKind,
    gpa: GuestAddress,
    len: u64,
) -> Result<RegionRange, BalloonError> {
    if len == 0 {
        return Err(BalloonError::EmptyBuffer { queue });
    }
    let end = checked_end(queue, gpa, len)?;
    let region = mem.find_region(gpa).ok_or(BalloonError::OutOfGuestMemory {
        queue,
        gpa: gpa.0,
        len,
    })?;
    let region_start = region.start_addr();
    if end > region_start.0 + region.len() {
        return Err(BalloonError::CrossesRegion {
            queue,
            gpa: gpa.0,
            len,
        });
    }
    Ok(RegionRange {
        gpa,
        len,
        region_start,
        region_len: region.len(),
    })
}

/// Reads the device-readable descriptors `descs` into one byte vector (the caller has
/// bounded their total length).
pub(crate) fn read_all<M: GuestMemory + ?Sized>(
    mem: &M,
    queue: QueueKind,
    descs: &[Desc],
) -> Result<Vec<u8>, BalloonError> {
    let total: u64 = descs.iter().map(|d| u64::from(d.len)).sum();
    let too_large = BalloonError::BufferTooLarge {
        queue,
        len: total,
        max: usize::MAX as u64,
    };
    let mut out = vec![0u8; usize::try_from(total).map_err(|_| too_large)?];
    let mut at = 0usize;
    for d in descs {
        let len = d.len as usize;
        checked_end(queue, d.addr, len as u64)?;
        mem.read_slice(&mut out[at..at + len], d.addr)
            .map_err(|_| BalloonError::OutOfGuestMemory {
                queue,
                gpa: d.addr.0,
                len: len as u64,
            })?;
        at += len;
    }
    Ok(out)
}

/// Splits `descs` into the leading device-readable part and the trailing
/// device-writable part, refusing a readable descriptor after a writable one.
pub(crate) fn split_readable_writable(
    queue: QueueKind,
    descs: &[Desc],
) -> Result<(&[Desc], &[Desc]), BalloonError> {
    let n_read = descs.iter().take_while(|d| !d.writable).count();
    let (r, w) = descs.split_at(n_read);
    if let Some(i) = w.iter().position(|d| !d.writable) {
        return Err(BalloonError::WrongDirection {
            queue,
            index: n_read + i,
            want_writable: true,
        });
    }
    Ok((r, w))
}
