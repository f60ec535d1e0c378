//! "Zeroable pages appeared" notifications, rate-limited by an injected clock (as in the
//! hugetlb pre-zeroing series: epoll on `zeroable_hugepages`, at most one event per
//! interval).
//!
//! Rule, per node ([`zeronce_types::rate`]): when the zeroable count grows, an event fires
//! at once unless one fired less than `min_interval` ago; then the event is *pending* and
//! fires (as a trailing event) at the first [`crate::hugepool::HugePool::poll_events`] at
//! or after `last + min_interval`, unless the count dropped to zero meanwhile (nothing
//! left to tell). So events for a node are at least `min_interval` apart and no growth is
//! lost.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use zeronce_types::rate::RateLimit;

use crate::types::ZoneId;

/// A monotonic clock, injected so rate limiting is testable without sleeping.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed origin; never decreases.
    fn now(&self) -> Duration;
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Arc<ManualClock> {
        Arc::new(ManualClock::default())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Relaxed))
    }
}

/// One notification: node `node` has `zeroable` pages worth pre-zeroing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroableEvent {
    /// The node whose zeroable count grew.
    pub node: ZoneId,
    /// Its zeroable count when the event fired.
    pub zeroable: u64,
    /// Clock time of the event.
    pub at: Duration,
    /// Fired by [`crate::hugepool::HugePool::poll_events`] after being held back by the
    /// rate limit (rather than by the growth itself).
    pub trailing: bool,
}

/// Receives events. Called with the pool borrowed mutably (in the effect layer: under the
/// pool's lock), so it must be quick: write an eventfd, push to a channel.
pub type EventHook = Box<dyn FnMut(ZeroableEvent) + Send>;

/// The hook, its clock and per-node rate-limit state: the rule of the module docs, for
/// any owner of per-node zeroable counts (the [`HugePool`](crate::hugepool::HugePool)).
pub struct Notifier {
    hook: EventHook,
    clock: Arc<dyn Clock>,
    min_interval: Duration,
    nodes: Vec<RateLimit>,
    fired: u64,
}

impl Notifier {
    /// Calls `hook` at most once per `min_interval` of `clock` per node.
    pub fn new(hook: EventHook, clock: Arc<dyn Clock>, min_interval: Duration) -> Self {
        Notifier {
            hook,
            clock,
            min_interval,
            nodes: Vec::new(),
            fired: 0,
        }
    }

    fn limit(&mut self, node: ZoneId) -> &mut RateLimit {
        if self.nodes.len() <= node.0 {
            self.nodes
                .resize(node.0 + 1, RateLimit::new(self.min_interval));
        }
        &mut self.nodes[node.0]
    }

    fn fire(&mut self, node: ZoneId, zeroable: u64, now: Duration, trailing: bool) {
        self.fired += 1;
        (self.hook)(ZeroableEvent {
            node,
            zeroable,
            at: now,
            trailing,
        });
    }

    /// The zeroable count of `node` grew to `zeroable`: fire now or hold back.
    pub fn grew(&mut self, node: ZoneId, zeroable: u64) {
        let now = self.clock.now();
        if self.limit(node).offer(now) {
            self.fire(node, zeroable, now, false);
        }
    }

    /// Fires every pending event that is due (`zeroable_of` gives the current counts;
    /// nodes back at zero are dropped silently). Returns the next deadline.
    pub fn poll(&mut self, zeroable_of: impl Fn(ZoneId) -> u64) -> Option<Duration> {
        let now = self.clock.now();
        for i in 0..self.nodes.len() {
            if self.nodes[i].take_due(now) {
                let zeroable = zeroable_of(ZoneId(i));
                if zeroable > 0 {
                    self.nodes[i].fired(now);
                    self.fire(ZoneId(i), zeroable, now, true);
                }
            }
        }
        self.next_deadline()
    }

    /// When the earliest pending event becomes due (`None`: nothing pending).
    pub fn next_deadline(&self) -> Option<Duration> {
        self.nodes.iter().filter_map(RateLimit::next_deadline).min()
    }

    /// Events fired so far.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// The injected clock's time.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }
}
