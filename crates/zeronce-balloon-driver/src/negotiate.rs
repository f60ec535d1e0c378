//! Feature negotiation as the Linux driver does it (pure: offered bits in, acked bits out).
//!
//! - `VERSION_1` and `PAGE_REPORTING` are required (this driver exists to report).
//! - `STATS_VQ` when offered and wanted.
//! - `PAGE_POISON` when the guest poisons free pages (required then: the spec forbids
//!   accepting `PAGE_REPORTING` without it, as the device could replace the poison with
//!   zeros; Linux drops reporting, this driver fails); its value is written to
//!   `poison_val`.
//! - `DEVICE_INIT_REPORTED` (bit 6) when offered and allowed: not for a confidential
//!   guest (it cannot trust the host's promise) and not with `PAGE_POISON` and a nonzero
//!   poison value (free pages must read as poison, not zero) — the "skip redundant zeroing" series' rule.
//! - Nothing else: this driver neither inflates nor deflates, so `DEVICE_INIT_ON_INFLATE`,
//!   `MUST_TELL_HOST` and `DEFLATE_ON_OOM` stay off.

use std::time::Duration;

use zeronce_balloon::{Feature, FeatureSet};

/// What the guest driver wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverOptions {
    /// Entries per virtqueue (a power of two ≤ 32768); also the most blocks per report.
    pub queue_size: u16,
    /// Negotiate the statistics queue when offered.
    pub stats_queue: bool,
    /// Accept the host's zero promise (bit 6) when offered and allowed.
    pub device_init_reported: bool,
    /// The guest poisons free pages with this value (`None`: no poisoning).
    pub page_poison: Option<u32>,
    /// Confidential guest: never accept zero promises from the host.
    pub confidential: bool,
    /// How long a report waits for the device before it fails.
    pub timeout: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            queue_size: 64,
            stats_queue: true,
            device_init_reported: true,
            page_poison: None,
            confidential: false,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The device lacks a feature this driver cannot work without.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the balloon device does not offer {0:?}")]
pub struct MissingFeature(pub Feature);

/// The features the driver acks for `offered`.
pub fn choose_features(
    offered: FeatureSet,
    opts: &DriverOptions,
) -> Result<FeatureSet, MissingFeature> {
    for required in [Feature::Version1, Feature::PageReporting] {
        if !offered.contains(required) {
            return Err(MissingFeature(required));
        }
    }
    // A poisoning guest must negotiate PAGE_POISON to accept PAGE_REPORTING (spec).
    if opts.page_poison.is_some() && !offered.contains(Feature::PagePoison) {
        return Err(MissingFeature(Feature::PagePoison));
    }
    let poison = opts.page_poison;
    let zero_allowed = !opts.confidential && opts.page_poison.unwrap_or(0) == 0;
    Ok(FeatureSet::EMPTY
        .with(Feature::Version1, true)
        .with(Feature::PageReporting, true)
        .with(
            Feature::StatsVq,
            opts.stats_queue && offered.contains(Feature::StatsVq),
        )
        .with(Feature::PagePoison, poison.is_some())
        .with(
            Feature::DeviceInitReported,
            opts.device_init_reported
                && zero_allowed
                && offered.contains(Feature::DeviceInitReported),
        ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeronce_balloon::FeatureOffer;
    use Feature::*;

    fn all() -> FeatureSet {
        FeatureOffer::default().with_zero_hints().features()
    }

    #[test]
    fn acks_reporting_stats_and_bit_6_but_nothing_it_does_not_use() {
        let acked = choose_features(all(), &DriverOptions::default()).unwrap();
        for f in [Version1, PageReporting, StatsVq, DeviceInitReported] {
            assert!(acked.contains(f), "{f:?}");
        }
        for f in [
            MustTellHost,
            DeflateOnOom,
            FreePageHint,
            PagePoison,
            DeviceInitOnInflate,
        ] {
            assert!(!acked.contains(f), "{f:?}");
        }
    }

    #[test]
    fn bit_6_only_when_offered_wanted_and_allowed() {
        let no6 = all().with(DeviceInitReported, false);
        let opts = DriverOptions::default();
        assert!(!choose_features(no6, &opts)
            .unwrap()
            .contains(DeviceInitReported));
        let unwanted = DriverOptions {
            device_init_reported: false,
            ..opts
        };
        assert!(!choose_features(all(), &unwanted)
            .unwrap()
            .contains(DeviceInitReported));
        let confidential = DriverOptions {
            confidential: true,
            ..opts
        };
        assert!(!choose_features(all(), &confidential)
            .unwrap()
            .contains(DeviceInitReported));
    }

    #[test]
    fn nonzero_poison_forbids_bit_6_zero_poison_does_not() {
        let poisoned = DriverOptions {
            page_poison: Some(0xaaaa_aaaa),
            ..DriverOptions::default()
        };
        let acked = choose_features(all(), &poisoned).unwrap();
        assert!(acked.contains(PagePoison));
        assert!(!acked.contains(DeviceInitReported));
        let zero_poison = DriverOptions {
            page_poison: Some(0),
            ..DriverOptions::default()
        };
        let acked = choose_features(all(), &zero_poison).unwrap();
        assert!(acked.contains(PagePoison) && acked.contains(DeviceInitReported));
    }

    #[test]
    fn a_poisoning_guest_refuses_reporting_without_page_poison() {
        // Spec: a driver expecting free pages to keep a value MUST NOT accept
        // PAGE_REPORTING unless it also negotiates PAGE_POISON (without it the device may
        // discard reported pages, and zeros replace the poison). Linux clears REPORTING
        // then; this driver exists to report, so negotiation fails. Zero poison
        // (init_on_free) included, as in Linux.
        for value in [0xaaaa_aaaa, 0] {
            let poisoned = DriverOptions {
                page_poison: Some(value),
                ..DriverOptions::default()
            };
            assert_eq!(
                choose_features(all().with(PagePoison, false), &poisoned),
                Err(MissingFeature(PagePoison))
            );
        }
    }

    #[test]
    fn reporting_and_version_1_are_required() {
        let opts = DriverOptions::default();
        assert_eq!(
            choose_features(all().with(PageReporting, false), &opts),
            Err(MissingFeature(PageReporting))
        );
        assert_eq!(
            choose_features(all().with(Version1, false), &opts),
            Err(MissingFeature(Version1))
        );
    }
}
