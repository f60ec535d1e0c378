//! reporting_vq: each device-writable buffer of a chain is one free block to discard.
//! The spec (and the "skip redundant zeroing" series) send one buffer per block; upstream Linux without bit 6
//! chains up to 32 blocks, so chains of several writable buffers are accepted too. With
//! bit 6 the chain's `used_len` is its total length only if every block now reads zero.
//! free_page_vq's hint buffers are validated by the same [`plan`].

use vm_memory::GuestMemoryBackend;

use super::{region_range, Desc};
use crate::discard::{Discarder, PlannedDiscard};
use crate::error::{BalloonError, QueueError};
use crate::features::QueueKind;
use crate::spec::limits::MAX_REPORT_BLOCK;

/// A validated report: the blocks to discard and the chain's total length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    /// One planned discard per block.
    pub blocks: Vec<PlannedDiscard>,
    /// Sum of the buffer lengths (the `used_len` of a full zero promise).
    pub total_len: u32,
}

/// Validates a reporting chain and plans its discards: every buffer device-writable,
/// non-empty, at most [`MAX_REPORT_BLOCK`], inside one region, aligned to the region's
/// backing page size. Any violation refuses the whole chain, as coming from `queue`.
pub(crate) fn plan<M, D>(
    mem: &M,
    discarder: &mut D,
    descs: &[Desc],
    queue: QueueKind,
) -> Result<Report, BalloonError>
where
    M: GuestMemoryBackend + ?Sized,
    D: Discarder<M> + ?Sized,
{
    let mut blocks = Vec::with_capacity(descs.len());
    let mut total: u64 = 0;
    for (index, d) in descs.iter().enumerate() {
        if !d.writable {
            return Err(BalloonError::WrongDirection {
                queue,
                index,
                want_writable: true,
            });
        }
        let len = u64::from(d.len);
        if len > MAX_REPORT_BLOCK {
            return Err(BalloonError::BufferTooLarge {
                queue,
                len,
                max: MAX_REPORT_BLOCK,
            });
        }
        let r = region_range(mem, queue, d.addr, len)?;
        let backing = discarder.backing(mem, r.region_start).map_err(|e| {
            tracing::debug!(gpa = d.addr.0, error = %e, "cannot determine backing");
            QueueError::Backing {
                region: r.region_start.0,
                source: e,
            }
        })?;
        let ps = backing.page_size() as u64;
        if !d.addr.0.is_multiple_of(ps) || !len.is_multiple_of(ps) {
            return Err(BalloonError::Misaligned {
                gpa: d.addr.0,
                len,
                page_size: ps,
            });
        }
        total += len;
        blocks.push(PlannedDiscard {
            gpa: d.addr,
            len,
            backing,
            bits: Vec::new(),
        });
    }
    let total_len = u32::try_from(total).map_err(|_| BalloonError::BufferTooLarge {
        queue,
        len: total,
        max: u64::from(u32::MAX),
    })?;
    Ok(Report { blocks, total_len })
}
