//! Typed errors. Every class of hostile or malformed guest input has a [`BalloonError`]
//! variant, a [`MalformedKind`] (which indexes a metrics counter) and a test.

use vm_memory::GuestAddress;

use crate::discard::DiscardError;
use crate::features::QueueKind;

/// Declares [`MalformedKind`], one variant per malformed-input variant of [`BalloonError`]
/// (same name), and from that one list: the counter index, the label, [`MalformedKind::ALL`],
/// [`MalformedKind::COUNT`] and [`BalloonError::kind`]. The VMM-side variants are named
/// after `;` so the match stays exhaustive: a new error variant must pick a side.
macro_rules! malformed_kinds {
    ($($(#[doc = $doc:literal])+ $kind:ident,)+ ; $($vmm:ident),+) => {
        /// The classes of malformed or hostile guest input, one counter each in
        /// [`crate::metrics::BalloonMetrics`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum MalformedKind {
            $($(#[doc = $doc])+ $kind,)+
        }

        impl MalformedKind {
            /// Every kind, in counter order.
            pub const ALL: [MalformedKind; MalformedKind::COUNT] = [$(MalformedKind::$kind),+];

            /// Number of kinds (size of the counter array).
            pub const COUNT: usize = [$(MalformedKind::$kind),+].len();

            /// Index of this kind's counter.
            pub fn index(self) -> usize {
                self as usize
            }

            /// The kind's name, as a label for logs and exported metrics.
            pub fn name(self) -> &'static str {
                match self {
                    $(MalformedKind::$kind => stringify!($kind),)+
                }
            }
        }

        impl BalloonError {
            /// The malformed-input class of this error, or `None` for VMM-side errors.
            pub fn kind(&self) -> Option<MalformedKind> {
                match self {
                    $(BalloonError::$kind { .. } => Some(MalformedKind::$kind),)+
                    $(BalloonError::$vmm { .. } => None,)+
                }
            }
        }
    };
}

malformed_kinds! {
    /// A PFN or buffer outside guest RAM or in a hole between regions.
    OutOfGuestMemory,
    /// An address + length that overflows 64 bits.
    AddressOverflow,
    /// A zero-length buffer.
    EmptyBuffer,
    /// A buffer larger than the device accepts.
    BufferTooLarge,
    /// A device-readable descriptor where a writable one is required, or vice versa.
    WrongDirection,
    /// A descriptor chain that is too long, loops, or points past the table.
    BadChain,
    /// An inflate bitmap shorter than `ceil(n / 8)` bytes.
    BitmapTooShort,
    /// A PFN array whose length is not a multiple of 4 bytes.
    PfnArrayLength,
    /// A reporting buffer not aligned to its backing's page size.
    Misaligned,
    /// A buffer spanning two memory regions (or a region and a hole).
    CrossesRegion,
    /// A statistics buffer whose length is not a multiple of 10 bytes.
    StatsLength,
    /// A second statistics buffer while one is held.
    StatsOverflow,
    /// A configuration access outside the 16-byte config space.
    ConfigOutOfRange,
    /// A configuration write to a field the driver may not write.
    ConfigReadOnly,
    /// A queue notification before DRIVER_OK / features / queue ready.
    NotReady,
    /// A notification for a queue index that does not exist in the negotiated layout.
    UnknownQueue,
    /// The driver acked a feature the device did not offer.
    UnofferedFeature,
    /// A chain head made available again while the device still holds it.
    DescriptorInFlight,
    /// Memory to discard overlapping a virtqueue's rings or a buffer the device still
    /// writes, or a buffer to write overlapping memory promised zero (in-flight requests).
    DiscardOverlap,
    /// An available-ring entry naming a descriptor outside the table: counted, never
    /// written to the used ring (there is no such descriptor to return).
    InvalidHead,
    /// An indirect descriptor, though `VIRTIO_F_INDIRECT_DESC` is never offered.
    IndirectDescriptor,
    /// A free_page_vq command id buffer that is not one 4-byte device-readable descriptor.
    HintCommandLength,
    /// A command id on free_page_vq that is neither the current run's nor STOP.
    HintCommandId,
    ;
    Queue, QueueCount
}

/// Why the device did not readiness-check a notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReadyReason {
    /// Features were not negotiated (FEATURES_OK not reached).
    FeaturesNotNegotiated,
    /// DRIVER_OK was not set (the device is not activated).
    DriverNotOk,
    /// The queue was not set ready by the driver, or is invalid.
    QueueNotReady,
}

/// What failed on the VMM's side of a queue: the source error is kept.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// virtio-queue refused an access (e.g. the used ring left guest memory).
    #[error(transparent)]
    Virtio(#[from] virtio_queue::Error),
    /// The backing of a memory region could not be determined.
    #[error("backing of region {region:#x}: {source}")]
    Backing {
        /// Guest physical address where the region starts.
        region: u64,
        /// Why the discarder could not tell.
        #[source]
        source: DiscardError,
    },
    /// The transport set a queue up with an invalid size.
    #[error("invalid queue size {0}")]
    InvalidSize(u16),
}

/// An error from the balloon device. Guest-caused variants map to a [`MalformedKind`];
/// the device logs them, counts them, returns the descriptor where one exists and keeps
/// serving.
#[derive(Debug, thiserror::Error)]
pub enum BalloonError {
    /// A guest address range outside guest RAM (or in a hole).
    #[error("{queue:?}: range {gpa:#x}+{len:#x} is not in guest memory")]
    OutOfGuestMemory {
        /// Queue the request came from.
        queue: QueueKind,
        /// Guest physical address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// An address + length overflowing 64 bits.
    #[error("{queue:?}: range {gpa:#x}+{len:#x} overflows")]
    AddressOverflow {
        /// Queue the request came from.
        queue: QueueKind,
        /// Guest physical address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// A zero-length buffer.
    #[error("{queue:?}: empty buffer")]
    EmptyBuffer {
        /// Queue the request came from.
        queue: QueueKind,
    },
    /// A buffer over the device's limit.
    #[error("{queue:?}: buffer of {len} bytes exceeds the limit of {max}")]
    BufferTooLarge {
        /// Queue the request came from.
        queue: QueueKind,
        /// Claimed length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A descriptor of the wrong direction.
    #[error("{queue:?}: descriptor {index} must be device-{}", if *.want_writable { "writable" } else { "readable" })]
    WrongDirection {
        /// Queue the request came from.
        queue: QueueKind,
        /// Position of the descriptor in its chain.
        index: usize,
        /// Whether a device-writable descriptor was required.
        want_writable: bool,
    },
    /// A chain that is too long, loops, or is cut short by a bad `next`.
    #[error("{queue:?}: descriptor chain is too long, loops or is broken (after {seen})")]
    BadChain {
        /// Queue the request came from.
        queue: QueueKind,
        /// Descriptors followed before giving up.
        seen: usize,
    },
    /// An inflate bitmap too short for the PFN count.
    #[error("inflate bitmap has {have} bytes, {need} needed")]
    BitmapTooShort {
        /// Bytes supplied.
        have: u64,
        /// Bytes needed (`ceil(n / 8)`).
        need: u64,
    },
    /// A PFN array length that is not a multiple of 4.
    #[error("{queue:?}: PFN array of {len} bytes is not a multiple of 4")]
    PfnArrayLength {
        /// Queue the request came from.
        queue: QueueKind,
        /// Length in bytes.
        len: u64,
    },
    /// A reporting buffer not aligned to the backing's page size.
    #[error("report {gpa:#x}+{len:#x} is not aligned to {page_size:#x}")]
    Misaligned {
        /// Guest physical address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
        /// The backing's page size.
        page_size: u64,
    },
    /// A buffer spanning more than one region.
    #[error("{queue:?}: range {gpa:#x}+{len:#x} crosses a memory region boundary")]
    CrossesRegion {
        /// Queue the request came from.
        queue: QueueKind,
        /// Guest physical address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// A statistics buffer whose length is not a multiple of 10.
    #[error("stats buffer of {len} bytes is not a multiple of 10")]
    StatsLength {
        /// Length in bytes.
        len: u64,
    },
    /// A statistics buffer arrived while another was held.
    #[error("stats buffer posted while one is already held")]
    StatsOverflow,
    /// A config access outside the config space.
    #[error("config access at {offset}+{len} is outside the {size}-byte config space")]
    ConfigOutOfRange {
        /// Byte offset.
        offset: u64,
        /// Access length.
        len: usize,
        /// Config space size.
        size: u64,
    },
    /// A config write touching a device-owned field.
    #[error("config write at {offset}+{len} touches a read-only field")]
    ConfigReadOnly {
        /// Byte offset.
        offset: u64,
        /// Access length.
        len: usize,
    },
    /// A notification before the device or queue is ready.
    #[error("notification for queue {index} before ready: {reason:?}")]
    NotReady {
        /// Queue index notified.
        index: u16,
        /// What was missing.
        reason: NotReadyReason,
    },
    /// A notification for a queue that does not exist.
    #[error("notification for queue {index}, which the negotiated layout does not have")]
    UnknownQueue {
        /// Queue index notified.
        index: u16,
    },
    /// The driver acked features the device did not offer (they are dropped).
    #[error("driver acked unoffered features {bits:#x}")]
    UnofferedFeature {
        /// The unoffered bits.
        bits: u64,
    },
    /// A chain head published again while the device holds it (hold policy): refused,
    /// so a guest cannot grow the held list without bound.
    #[error("{queue:?}: descriptor {head} made available again while held")]
    DescriptorInFlight {
        /// Queue the request came from.
        queue: QueueKind,
        /// The head index.
        head: u16,
    },
    /// Memory the device would discard overlaps a virtqueue's rings (descriptor table,
    /// available or used ring) or a bitmap the device still has to write (this request's
    /// or another in-flight one's), or a bitmap overlaps memory an in-flight request will
    /// promise zero: the device would write there after discarding, so the memory would
    /// neither stay zero nor stay what the guest put there.
    #[error("{queue:?}: discarding {gpa:#x}+{len:#x} would hit the rings or the bitmap")]
    DiscardOverlap {
        /// Queue the request came from.
        queue: QueueKind,
        /// Guest physical address of the range to discard.
        gpa: u64,
        /// Its length.
        len: u64,
    },
    /// An available-ring entry whose head index is not below the queue size.
    #[error("{queue:?}: available head {head} is outside the {size}-entry descriptor table")]
    InvalidHead {
        /// Queue the entry came from.
        queue: QueueKind,
        /// The head index read from the available ring.
        head: u16,
        /// The queue size.
        size: u16,
    },
    /// A descriptor with `VIRTQ_DESC_F_INDIRECT`: the device never offers
    /// `VIRTIO_F_INDIRECT_DESC`, and the spec forbids the driver to use indirect
    /// descriptors unless it was negotiated.
    #[error("{queue:?}: descriptor {index} of the chain is indirect (not negotiated)")]
    IndirectDescriptor {
        /// Queue the request came from.
        queue: QueueKind,
        /// Position of the descriptor in its chain.
        index: usize,
    },
    /// A free_page_vq command id chain of the wrong shape.
    #[error("free_page_vq: command id chain of {descriptors} descriptors and {len} bytes (one of 4 expected)")]
    HintCommandLength {
        /// Descriptors in the chain.
        descriptors: usize,
        /// Their total length.
        len: u64,
    },
    /// A command id from the driver that the device never set or no longer runs.
    #[error("free_page_vq: command id {got} is neither STOP nor the current run's ({current:?})")]
    HintCommandId {
        /// The id the driver sent.
        got: u32,
        /// The id of the run the device asked for, if any.
        current: Option<u32>,
    },
    /// The virtqueue or the memory behind it failed the device (the VMM's side, not a
    /// guest request).
    #[error("virtqueue error: {0}")]
    Queue(#[from] QueueError),
    /// Activation was given the wrong number of queues.
    #[error("activate: {given} queues given, negotiated layout needs {needed}")]
    QueueCount {
        /// Queues given.
        given: usize,
        /// Queues needed.
        needed: usize,
    },
}

/// Checked `gpa + len`, as the error a queue handler reports.
pub(crate) fn checked_end(
    queue: QueueKind,
    gpa: GuestAddress,
    len: u64,
) -> Result<u64, BalloonError> {
    gpa.0.checked_add(len).ok_or(BalloonError::AddressOverflow {
        queue,
        gpa: gpa.0,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_index_their_counters_densely() {
        for (i, k) in MalformedKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(MalformedKind::ALL[k.index()], *k, "index round-trips");
        }
        assert_eq!(MalformedKind::COUNT, 23);
        assert_eq!(
            BalloonError::StatsOverflow.kind(),
            Some(MalformedKind::StatsOverflow)
        );
        assert!(BalloonError::Queue(QueueError::InvalidSize(3))
            .kind()
            .is_none());
    }

    #[test]
    fn kind_names_are_unique_and_name_their_variant() {
        let names: std::collections::HashSet<_> =
            MalformedKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), MalformedKind::COUNT);
        for k in MalformedKind::ALL {
            assert_eq!(k.name(), format!("{k:?}"));
        }
    }
}
