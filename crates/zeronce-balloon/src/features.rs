//! Feature bits, negotiation, and the queue layout that follows from it.
//!
//! Queue indices count **only the negotiated queues**: inflateq, deflateq, then statsq
//! if `STATS_VQ`, free_page_vq if `FREE_PAGE_HINT`, reporting_vq if `REPORTING`. A device
//! that hard-codes the reporting queue at index 4 breaks every guest that negotiates
//! reporting without stats (the queue is then at index 2); [`QueueLayout`] derives the
//! indices instead.

use std::fmt;

/// A virtio-balloon feature bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Feature {
    /// `VIRTIO_BALLOON_F_MUST_TELL_HOST`: the guest waits for deflate acks.
    MustTellHost = 0,
    /// `VIRTIO_BALLOON_F_STATS_VQ`: a statistics queue exists.
    StatsVq = 1,
    /// `VIRTIO_BALLOON_F_DEFLATE_ON_OOM`: the guest may deflate under memory pressure.
    DeflateOnOom = 2,
    /// `VIRTIO_BALLOON_F_FREE_PAGE_HINT`: a free page hint queue exists; the device asks
    /// for hints with `free_page_hint_cmd_id` (offered only when the VMM asks:
    /// [`FeatureOffer::free_page_hint`]).
    FreePageHint = 3,
    /// `VIRTIO_BALLOON_F_PAGE_POISON`: the guest poisons pages with `poison_val`.
    PagePoison = 4,
    /// `VIRTIO_BALLOON_F_PAGE_REPORTING`: a free page reporting queue exists.
    PageReporting = 5,
    /// `VIRTIO_BALLOON_F_DEVICE_INIT_REPORTED`: reporting `used_len` = buffer length means
    /// the block now reads zero. **Not in the virtio standard**: bit 6 comes from the 2026
    /// "skip redundant zeroing" proposal (Linux's uapi header stops at bit 5, and other
    /// out-of-tree patches use bit 6 for other things), so it is offered only when the
    /// VMM asks for it ([`FeatureOffer::with_zero_hints`]).
    DeviceInitReported = 6,
    /// `VIRTIO_BALLOON_F_DEVICE_INIT_ON_INFLATE`: inflate requests carry a bitmap of
    /// pages the device zeroed. Not in the virtio standard either (same proposal as
    /// [`Feature::DeviceInitReported`]); offered only on request.
    DeviceInitOnInflate = 7,
    /// `VIRTIO_F_VERSION_1`: modern (non-legacy) device.
    Version1 = 32,
}

impl Feature {
    /// Every feature this crate knows, in bit order.
    pub const ALL: [Feature; 9] = [
        Feature::MustTellHost,
        Feature::StatsVq,
        Feature::DeflateOnOom,
        Feature::FreePageHint,
        Feature::PagePoison,
        Feature::PageReporting,
        Feature::DeviceInitReported,
        Feature::DeviceInitOnInflate,
        Feature::Version1,
    ];

    /// The bit number.
    pub(crate) fn bit(self) -> u32 {
        self as u32
    }

    /// The bit as a mask.
    pub fn mask(self) -> u64 {
        1 << self.bit()
    }
}

/// A set of feature bits (64-bit, as the transport presents them).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FeatureSet(u64);

impl FeatureSet {
    /// No features.
    pub const EMPTY: FeatureSet = FeatureSet(0);

    /// The set from raw bits (unknown bits are kept; `FeatureSet::intersect` with the
    /// offered set removes them).
    pub fn from_bits(bits: u64) -> FeatureSet {
        FeatureSet(bits)
    }

    /// The raw bits.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// Whether `f` is in the set.
    pub fn contains(self, f: Feature) -> bool {
        self.0 & f.mask() != 0
    }

    /// The set with `f` added (`on`) or removed.
    #[must_use]
    pub fn with(self, f: Feature, on: bool) -> FeatureSet {
        if on {
            FeatureSet(self.0 | f.mask())
        } else {
            FeatureSet(self.0 & !f.mask())
        }
    }

    /// Bits in both sets.
    #[must_use]
    pub(crate) fn intersect(self, other: FeatureSet) -> FeatureSet {
        FeatureSet(self.0 & other.0)
    }

    /// 32-bit page `page` (0 = bits 0–31, 1 = bits 32–63) as the transport reads it.
    pub fn page(self, page: u32) -> u32 {
        match page {
            0 => self.0 as u32,
            1 => (self.0 >> 32) as u32,
            _ => 0,
        }
    }
}

impl FromIterator<Feature> for FeatureSet {
    fn from_iter<T: IntoIterator<Item = Feature>>(iter: T) -> Self {
        iter.into_iter()
            .fold(FeatureSet::EMPTY, |s, f| s.with(f, true))
    }
}

impl fmt::Debug for FeatureSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = Feature::ALL.iter().filter(|x| self.contains(**x)).collect();
        write!(f, "FeatureSet({:#x}: {names:?})", self.0)
    }
}

/// Which features the device offers; each one can be switched by the VMM.
///
/// The default offers the standard features this device implements. The two zero-hint
/// bits (6 and 7) are a 2026 proposal, not part of the virtio standard, and another
/// out-of-tree use of bit 6 exists: a VMM offers them knowingly, with
/// [`FeatureOffer::with_zero_hints`], to guests it knows speak that proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureOffer {
    /// Offer `VERSION_1` (needed by modern transports).
    pub version_1: bool,
    /// Offer `MUST_TELL_HOST`.
    pub must_tell_host: bool,
    /// Offer `STATS_VQ`.
    pub stats_vq: bool,
    /// Offer `DEFLATE_ON_OOM`.
    pub deflate_on_oom: bool,
    /// Offer `FREE_PAGE_HINT` (bit 3). Off by default: a stock Linux guest's shrinker may
    /// take back a hinted block still in the queue, and the device's discard of it then
    /// races the guest's reuse (RELIABILITY.md, free page hinting).
    pub free_page_hint: bool,
    /// Offer `PAGE_POISON`.
    pub page_poison: bool,
    /// Offer `PAGE_REPORTING`.
    pub page_reporting: bool,
    /// Offer `DEVICE_INIT_REPORTED` (bit 6).
    pub device_init_reported: bool,
    /// Offer `DEVICE_INIT_ON_INFLATE` (bit 7).
    pub device_init_on_inflate: bool,
}

impl Default for FeatureOffer {
    /// Every standard feature this device implements; the proposal's bits 6 and 7 off.
    fn default() -> Self {
        FeatureOffer {
            version_1: true,
            must_tell_host: true,
            stats_vq: true,
            deflate_on_oom: true,
            free_page_hint: false,
            page_poison: true,
            page_reporting: true,
            device_init_reported: false,
            device_init_on_inflate: false,
        }
    }
}

impl FeatureOffer {
    /// This offer plus the zero-hint bits 6 (`DEVICE_INIT_REPORTED`) and 7
    /// (`DEVICE_INIT_ON_INFLATE`) of the 2026 "skip redundant zeroing" proposal.
    pub fn with_zero_hints(self) -> FeatureOffer {
        FeatureOffer {
            device_init_reported: true,
            device_init_on_inflate: true,
            ..self
        }
    }

    /// The offered bits.
    pub fn features(self) -> FeatureSet {
        FeatureSet::EMPTY
            .with(Feature::Version1, self.version_1)
            .with(Feature::MustTellHost, self.must_tell_host)
            .with(Feature::StatsVq, self.stats_vq)
            .with(Feature::DeflateOnOom, self.deflate_on_oom)
            .with(Feature::FreePageHint, self.free_page_hint)
            .with(Feature::PagePoison, self.page_poison)
            .with(Feature::PageReporting, self.page_reporting)
            .with(Feature::DeviceInitReported, self.device_init_reported)
            .with(Feature::DeviceInitOnInflate, self.device_init_on_inflate)
    }
}

/// The negotiated features, and the rules that follow from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated(FeatureSet);

impl Negotiated {
    /// Negotiation result: what the driver acked, limited to what was offered.
    pub fn new(offered: FeatureSet, acked: FeatureSet) -> Negotiated {
        Negotiated(offered.intersect(acked))
    }

    /// The negotiated bits.
    pub fn features(self) -> FeatureSet {
        self.0
    }

    /// Whether `f` was negotiated.
    pub(crate) fn has(self, f: Feature) -> bool {
        self.0.contains(f)
    }

    /// Whether the device may promise zero at all: not when `PAGE_POISON` is negotiated
    /// with a nonzero `poison_val` (the guest expects poison, not zeros, in free pages;
    /// the "skip redundant zeroing" series' driver clears bits 6 and 7 in that case).
    pub(crate) fn poison_forbids_zero(self, poison_val: u32) -> bool {
        self.has(Feature::PagePoison) && poison_val != 0
    }

    /// Whether reporting `used_len` carries a zero promise (bit 6 in effect).
    pub(crate) fn init_reported(self, poison_val: u32) -> bool {
        self.has(Feature::DeviceInitReported) && !self.poison_forbids_zero(poison_val)
    }

    /// Whether inflate requests carry a zero bitmap (bit 7 negotiated). The bitmap is
    /// expected whenever the bit is negotiated; with a nonzero poison it is all zeros.
    pub fn inflate_bitmap(self) -> bool {
        self.has(Feature::DeviceInitOnInflate)
    }

    /// Whether inflate bitmap bits may be set (bit 7 in effect).
    pub(crate) fn init_on_inflate(self, poison_val: u32) -> bool {
        self.inflate_bitmap() && !self.poison_forbids_zero(poison_val)
    }

    /// The queue layout these features imply.
    pub fn layout(self) -> QueueLayout {
        QueueLayout::for_features(self.0)
    }
}

/// The kind of a balloon virtqueue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueKind {
    /// inflateq: PFNs the guest gives to the balloon.
    Inflate,
    /// deflateq: PFNs the guest takes back.
    Deflate,
    /// statsq: guest memory statistics.
    Stats,
    /// free_page_vq: the command ids and free page hints of a hint run.
    FreePageHint,
    /// reporting_vq: free page reports.
    Reporting,
}

/// The mapping between queue indices and kinds for a set of negotiated features.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    /// One kind per index (`Option` for the API's sake: every index is served).
    kinds: Vec<Option<QueueKind>>,
}

impl QueueLayout {
    /// Layout for `features`: inflateq, deflateq, then the optional queues in spec order.
    pub fn for_features(features: FeatureSet) -> QueueLayout {
        let mut kinds = vec![Some(QueueKind::Inflate), Some(QueueKind::Deflate)];
        let optional = [
            (Feature::StatsVq, Some(QueueKind::Stats)),
            (Feature::FreePageHint, Some(QueueKind::FreePageHint)),
            (Feature::PageReporting, Some(QueueKind::Reporting)),
        ];
        kinds.extend(
            optional
                .iter()
                .filter(|(f, _)| features.contains(*f))
                .map(|(_, k)| *k),
        );
        QueueLayout { kinds }
    }

    /// Number of queues.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Always false (inflateq and deflateq always exist).
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The kind of queue `index`, if it exists.
    pub fn kind(&self, index: u16) -> Option<QueueKind> {
        self.kinds.get(usize::from(index)).copied().flatten()
    }

    /// The index of queue `kind`, if negotiated.
    pub fn index(&self, kind: QueueKind) -> Option<u16> {
        self.kinds
            .iter()
            .position(|k| *k == Some(kind))
            .and_then(|i| u16::try_from(i).ok())
    }

    /// The kinds in index order (never `None`).
    pub fn kinds(&self) -> &[Option<QueueKind>] {
        &self.kinds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Feature::*;

    fn set(fs: &[Feature]) -> FeatureSet {
        fs.iter().copied().collect()
    }

    #[test]
    fn reporting_index_counts_only_negotiated_queues() {
        let l = QueueLayout::for_features(set(&[PageReporting]));
        assert_eq!(l.index(QueueKind::Reporting), Some(2), "without stats");
        assert_eq!(l.kind(2), Some(QueueKind::Reporting));
        assert_eq!(l.kind(4), None, "index 4 is the hard-coding bug");
        let l = QueueLayout::for_features(set(&[StatsVq, PageReporting]));
        assert_eq!(l.index(QueueKind::Stats), Some(2));
        assert_eq!(l.index(QueueKind::Reporting), Some(3));
        let l = QueueLayout::for_features(set(&[StatsVq, FreePageHint, PageReporting]));
        assert_eq!(l.index(QueueKind::Reporting), Some(4));
        assert_eq!(l.kind(3), Some(QueueKind::FreePageHint), "after stats");
        assert_eq!(l.len(), 5);
        let l = QueueLayout::for_features(set(&[FreePageHint, PageReporting]));
        assert_eq!(l.index(QueueKind::FreePageHint), Some(2), "without stats");
        assert_eq!(l.index(QueueKind::Reporting), Some(3));
        let l = QueueLayout::for_features(FeatureSet::EMPTY);
        assert_eq!(
            l.kinds(),
            &[Some(QueueKind::Inflate), Some(QueueKind::Deflate)]
        );
        assert_eq!(l.index(QueueKind::Stats), None);
    }

    #[test]
    fn negotiation_keeps_only_offered_bits() {
        let offer = FeatureOffer {
            device_init_on_inflate: false,
            ..FeatureOffer::default()
        };
        let n = Negotiated::new(offer.features(), FeatureSet::from_bits(u64::MAX));
        assert!(n.has(PageReporting) && n.has(Version1));
        assert!(!n.has(DeviceInitOnInflate), "switched off");
        assert!(!n.has(FreePageHint), "not offered by default");
        assert_eq!(n.features().bits() & !offer.features().bits(), 0);
        assert_eq!(offer.features().page(1), 1, "VERSION_1 is bit 32");
    }

    #[test]
    fn poison_rule_disables_bits_6_and_7_only_with_nonzero_poison() {
        let all = FeatureOffer::default().with_zero_hints().features();
        let n = Negotiated::new(all, all);
        assert!(n.init_reported(0) && n.init_on_inflate(0));
        assert!(!n.init_reported(0xaa) && !n.init_on_inflate(0xaa));
        assert!(n.inflate_bitmap(), "bitmap layout stays");
        let no_poison = Negotiated::new(all, all.with(PagePoison, false));
        assert!(no_poison.init_reported(0xaa) && no_poison.init_on_inflate(0xaa));
    }
}
