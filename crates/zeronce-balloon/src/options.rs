//! What the VMM chooses ([`BalloonOptions`]) and what one notification did
//! ([`QueueReport`]).

use crate::discard::DiscardPolicy;
use crate::features::FeatureOffer;

/// Device options chosen by the VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BalloonOptions {
    /// Features offered (each switchable).
    pub offer: FeatureOffer,
    /// When and how to discard.
    pub policy: DiscardPolicy,
    /// Pre-fault deflated pages (`MADV_POPULATE_WRITE`).
    pub prefault_on_deflate: bool,
    /// Allow zero promises at all; turn off for confidential guests, whose memory the
    /// host cannot vouch for (bits 6 and 7 are then not offered).
    pub zero_promises: bool,
}

impl Default for BalloonOptions {
    fn default() -> Self {
        BalloonOptions {
            offer: FeatureOffer::default(),
            policy: DiscardPolicy::Immediate,
            prefault_on_deflate: false,
            zero_promises: true,
        }
    }
}

/// What one call to [`crate::BalloonDevice::process_queue`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueReport {
    /// Chains popped.
    pub chains: usize,
    /// Chains refused as malformed (returned with `used_len` 0, or held on statsq).
    pub malformed: usize,
    /// Chains held (hold policy, or the stats buffer).
    pub held: usize,
    /// `(head, used_len)` of each chain used, in order.
    pub used: Vec<(u16, u32)>,
    /// The call stopped after a queue's worth of chains (a guest publishing as fast as
    /// the device pops) or [`MAX_PAGES_PER_CALL`](crate::spec::limits::MAX_PAGES_PER_CALL)
    /// pages of work while more chains were available: call again, as for a new
    /// notification, to serve the rest.
    pub more: bool,
}
