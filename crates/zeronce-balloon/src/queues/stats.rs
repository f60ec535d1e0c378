//! statsq: 10-byte entries (le16 tag, le64 value). The device keeps the latest value of
//! each known tag (0–15), ignores unknown tags, and holds the buffer to use it as the
//! next request ("re-post on request").

use vm_memory::GuestMemoryBackend;

use super::{read_all, Desc};
use crate::error::BalloonError;
use crate::features::QueueKind;
use crate::spec::limits::MAX_STATS_BUFFER;
use crate::spec::{StatTag, STAT_ENTRY_SIZE, STAT_TAG_COUNT};

const Q: QueueKind = QueueKind::Stats;

/// The latest guest memory statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestStats {
    values: [Option<u64>; STAT_TAG_COUNT],
    updates: u64,
}

impl GuestStats {
    /// The latest value of `tag`, if the guest ever sent it.
    pub fn get(&self, tag: StatTag) -> Option<u64> {
        self.values[usize::from(tag.raw())]
    }

    /// `(name, value)` of every tag received, in tag order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        StatTag::ALL
            .iter()
            .filter_map(|t| self.get(*t).map(|v| (t.name(), v)))
            .collect()
    }

    /// How many buffers have been parsed.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Applies parsed entries.
    pub fn apply(&mut self, entries: &[(StatTag, u64)]) {
        for (tag, v) in entries {
            self.values[usize::from(tag.raw())] = Some(*v);
        }
        self.updates += 1;
    }
}

/// Parses a statistics chain: device-readable buffers whose total length is a multiple
/// of 10 and at most [`MAX_STATS_BUFFER`]. Unknown tags are skipped. An empty buffer
/// is valid (no statistics). (The spec's "multiple of 6 bytes" is a known typo: the
/// packed entry is 10 bytes, and that is what Linux sends.)
pub(crate) fn parse<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    descs: &[Desc],
) -> Result<Vec<(StatTag, u64)>, BalloonError> {
    if let Some(index) = descs.iter().position(|d| d.writable) {
        return Err(BalloonError::WrongDirection {
            queue: Q,
            index,
            want_writable: false,
        });
    }
    let len: u64 = descs.iter().map(|d| u64::from(d.len)).sum();
    if len > u64::from(MAX_STATS_BUFFER) {
        return Err(BalloonError::BufferTooLarge {
            queue: Q,
            len,
            max: u64::from(MAX_STATS_BUFFER),
        });
    }
    if !len.is_multiple_of(STAT_ENTRY_SIZE as u64) {
        return Err(BalloonError::StatsLength { len });
    }
    let bytes = read_all(mem, Q, descs)?;
    Ok(bytes
        .chunks_exact(STAT_ENTRY_SIZE)
        .filter_map(|e| {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let val = u64::from_le_bytes(e[2..10].try_into().expect("8 bytes"));
            StatTag::from_raw(tag).map(|t| (t, val))
        })
        .collect())
}
