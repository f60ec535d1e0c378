//! "Zeroable pages appeared" events: rate-limited ([`zeronce_types::rate`]: at most one
//! per interval, a trailing event for growth held back), timed from the pool's start, and
//! sent to every subscriber.

use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use zeronce_types::rate::RateLimit;

/// One notification: the pool has `zeroable` pages worth pre-zeroing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroableEvent {
    /// The pool's zeroable count when the event fired.
    pub zeroable: u64,
    /// Time since the pool started.
    pub at: Duration,
    /// Fired after being held back by the rate limit (rather than by the growth itself).
    pub trailing: bool,
}

/// The rate limit, its clock, the subscribers and the count of events fired. Kept under
/// the pool's lock, beside the zeroable count it tells of.
pub(crate) struct Events {
    limit: RateLimit,
    epoch: Instant,
    subscribers: Vec<Sender<ZeroableEvent>>,
    fired: u64,
}

impl Events {
    /// Events at least `min_interval` apart, timed from now.
    pub(crate) fn new(min_interval: Duration) -> Events {
        Events {
            limit: RateLimit::new(min_interval),
            epoch: Instant::now(),
            subscribers: Vec::new(),
            fired: 0,
        }
    }

    /// A new subscriber, told of events from now on.
    pub(crate) fn subscribe(&mut self) -> Receiver<ZeroableEvent> {
        let (tx, rx) = mpsc::channel();
        self.subscribers.push(tx);
        rx
    }

    /// The zeroable count grew to `zeroable`: an event now, or held back.
    pub(crate) fn grew(&mut self, zeroable: u64) {
        let now = self.epoch.elapsed();
        if self.limit.offer(now) {
            self.send(zeroable, now, false);
        }
    }

    /// Fires the held-back event if it is due and `zeroable()` is still positive (at zero
    /// it is dropped: nothing left to tell). Returns how long until the next one is due
    /// (`None`: nothing held back).
    pub(crate) fn poll(&mut self, zeroable: impl FnOnce() -> u64) -> Option<Duration> {
        let now = self.epoch.elapsed();
        if self.limit.take_due(now) {
            let zeroable = zeroable();
            if zeroable > 0 {
                self.limit.fired(now);
                self.send(zeroable, now, true);
            }
        }
        let due = self.limit.next_deadline()?;
        Some(due.saturating_sub(self.epoch.elapsed()))
    }

    /// Events fired so far.
    pub(crate) fn fired(&self) -> u64 {
        self.fired
    }

    fn send(&mut self, zeroable: u64, at: Duration, trailing: bool) {
        self.fired += 1;
        let event = ZeroableEvent {
            zeroable,
            at,
            trailing,
        };
        tracing::debug!(?event, "zeroable pages appeared");
        self.subscribers.retain(|s| s.send(event).is_ok());
    }
}
