//! free_page_vq: a chain is either a command id (one device-readable le32: the run's id
//! when the driver starts hinting, `VIRTIO_BALLOON_CMD_ID_STOP` when it has finished) or
//! hint blocks (device-writable buffers, one block each; Linux 6.1 sends one block of
//! order `MAX_ORDER - 1`, 4 MiB, per chain). Blocks are validated as reported blocks are
//! ([`super::reporting::plan`]).

use vm_memory::{Bytes, GuestMemoryBackend};

use super::{reporting, Desc};
use crate::discard::{Discarder, PlannedDiscard};
use crate::error::BalloonError;
use crate::features::QueueKind;

const Q: QueueKind = QueueKind::FreePageHint;

/// One parsed free_page_vq chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HintChain {
    /// A command id sent by the driver.
    CmdId(u32),
    /// Free blocks the driver hints, planned for discarding.
    Blocks(Vec<PlannedDiscard>),
}

/// Parses a free_page_vq chain: all readable (a command id: exactly one descriptor of 4
/// bytes, else [`BalloonError::HintCommandLength`]) or all writable (blocks). A readable
/// descriptor after a writable one, or the reverse, is [`BalloonError::WrongDirection`].
pub(crate) fn parse<M, D>(
    mem: &M,
    discarder: &mut D,
    descs: &[Desc],
) -> Result<HintChain, BalloonError>
where
    M: GuestMemoryBackend + ?Sized,
    D: Discarder<M> + ?Sized,
{
    let first_writable = descs.first().is_some_and(|d| d.writable);
    if first_writable {
        let r = reporting::plan(mem, discarder, descs, Q)?;
        return Ok(HintChain::Blocks(r.blocks));
    }
    if let Some(index) = descs.iter().position(|d| d.writable) {
        return Err(BalloonError::WrongDirection {
            queue: Q,
            index,
            want_writable: false,
        });
    }
    let total: u64 = descs.iter().map(|d| u64::from(d.len)).sum();
    let [d] = descs else {
        return Err(BalloonError::HintCommandLength {
            descriptors: descs.len(),
            len: total,
        });
    };
    if d.len != 4 {
        return Err(BalloonError::HintCommandLength {
            descriptors: 1,
            len: total,
        });
    }
    let id: u32 = mem
        .read_obj(d.addr)
        .map_err(|_| BalloonError::OutOfGuestMemory {
            queue: Q,
            gpa: d.addr.0,
            len: 4,
        })?;
    Ok(HintChain::CmdId(u32::from_le(id)))
}
