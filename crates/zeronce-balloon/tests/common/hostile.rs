//! Shared by the hostile-guest tests: the hole's address, the hold policy, and the
//! refusal check (typed error counted, `used_len` 0, nothing discarded, the queue still
//! serving).

use std::time::Duration;

use zeronce_balloon::guest_ring::DriverBuf;
use zeronce_balloon::mock::RecordingDiscarder;
use zeronce_balloon::{BalloonOptions, DiscardPolicy, MalformedKind, QueueKind};

use super::{Rig, MIB};

/// An address in the hole of [`super::mem_with_hole`].
pub const HOLE: u64 = 6 * MIB;

/// The rig with the recording discarder.
pub type MockRig<'m> = Rig<'m, RecordingDiscarder>;

/// A well-formed request on `q` is still served correctly.
pub fn still_serves(rig: &mut MockRig<'_>, q: QueueKind) {
    match q {
        QueueKind::Reporting => {
            let len = rig.roundtrip(q, &[DriverBuf::write(8 * MIB, 0x1000)]);
            assert_eq!(len, 0x1000, "reporting still served");
        }
        QueueKind::Stats => {}
        QueueKind::FreePageHint => {
            // The hostile hint tests keep an acknowledged run going: a block is discarded.
            let calls = rig.calls();
            let len = rig.roundtrip(q, &[DriverBuf::write(8 * MIB, 0x1000)]);
            assert_eq!((len, rig.calls()), (0, calls + 1), "hinting still served");
        }
        _ => {
            let bitmap = rig.dev.negotiated().unwrap().inflate_bitmap().then_some(1);
            let bufs = rig.inflate_bufs(
                &[0x300],
                if q == QueueKind::Inflate {
                    bitmap
                } else {
                    None
                },
            );
            let want = if q == QueueKind::Inflate && bitmap.is_some() {
                1
            } else {
                0
            };
            assert_eq!(rig.roundtrip(q, &bufs), want, "{q:?} still served");
        }
    }
}

/// Submits `bufs` on `q`, expects exactly one refusal of `kind`, `used_len` 0, no discard.
pub fn refused(rig: &mut MockRig<'_>, q: QueueKind, bufs: &[DriverBuf], kind: MalformedKind) {
    let calls = rig.calls();
    let before = rig.dev.metrics().malformed_count(kind);
    let head = rig.submit(q, bufs);
    let r = rig.notify(q);
    assert_eq!((r.chains, r.malformed), (1, 1), "{kind:?}");
    assert_eq!(
        rig.dev.metrics().malformed_count(kind),
        before + 1,
        "{kind:?} counted"
    );
    assert_eq!(
        rig.used(q),
        vec![(u32::from(head), 0)],
        "{kind:?}: used_len 0"
    );
    assert_eq!(rig.calls(), calls, "{kind:?}: nothing discarded");
    still_serves(rig, q);
}

/// Options with the hold policy: discards wait `delay`.
pub fn held(delay: Duration) -> BalloonOptions {
    BalloonOptions {
        policy: DiscardPolicy::Hold(delay),
        ..BalloonOptions::default()
    }
}
