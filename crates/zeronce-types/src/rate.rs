//! Rate limiting with a trailing event: at most one event per interval, and nothing to
//! tell is lost (as the hugetlb pre-zeroing series rate-limits its `zeroable_hugepages`
//! poll event).
//!
//! The rule: when there is news, an event fires at once unless one fired less than
//! `min_interval` ago; then the event is *pending*, and fires (as a *trailing* event) at
//! the first poll at or after `last + min_interval`, unless there is nothing left to tell
//! by then. So events are at least `min_interval` apart and no news is lost.
//!
//! Pure: time is a parameter of every call (any monotonic [`Duration`] since an origin
//! the caller picks), so the rule is testable without sleeping. One [`RateLimit`] is one
//! stream of events; an owner of several streams (one per node) keeps one per stream.
//!
//! For log lines about a flood of events of one class there is a second, stateless rule:
//! [`log_this`] (the first [`LOG_FIRST`], then one at each doubling of the count), used by
//! the balloon device's refused-input lines and the daemons' refused-peer and failed-accept
//! lines.

use std::time::Duration;

/// The rate-limit state of one stream of events; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    min_interval: Duration,
    last_fired: Option<Duration>,
    pending: bool,
}

impl RateLimit {
    /// A stream whose events are at least `min_interval` apart; none fired yet.
    pub const fn new(min_interval: Duration) -> Self {
        RateLimit {
            min_interval,
            last_fired: None,
            pending: false,
        }
    }

    /// Whether an event may fire at `now`.
    fn due(&self, now: Duration) -> bool {
        self.last_fired
            .is_none_or(|last| now >= last.saturating_add(self.min_interval))
    }

    /// There is news at `now`: `true` if the event fires now (recorded as fired), `false`
    /// if it is held back (pending until [`RateLimit::next_deadline`]).
    pub fn offer(&mut self, now: Duration) -> bool {
        if self.due(now) {
            self.fired(now);
            true
        } else {
            self.pending = true;
            false
        }
    }

    /// At `now`, takes the held-back event if it is due: `true` if there was one, which
    /// is then no longer pending. The caller fires it ([`RateLimit::fired`]) or, with
    /// nothing left to tell, drops it.
    pub fn take_due(&mut self, now: Duration) -> bool {
        let due = self.pending && self.due(now);
        if due {
            self.pending = false;
        }
        due
    }

    /// Records an event fired at `now`: the next one waits `min_interval`.
    pub fn fired(&mut self, now: Duration) {
        self.last_fired = Some(now);
        self.pending = false;
    }

    /// When the held-back event becomes due (`None`: nothing is held back).
    pub fn next_deadline(&self) -> Option<Duration> {
        self.last_fired
            .filter(|_| self.pending)
            .map(|last| last.saturating_add(self.min_interval))
    }
}

/// Events of one class logged in full before [`log_this`] thins the log out.
pub const LOG_FIRST: u64 = 10;

/// Whether the `n`th event (1-based) of one class is logged: the first [`LOG_FIRST`],
/// then one line at each doubling of the count, which carries the count. A flood of
/// `n` events costs `LOG_FIRST + log2(n)` lines; the counters stay exact.
pub fn log_this(n: u64) -> bool {
    n <= LOG_FIRST || n.is_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_logged_at_the_first_ten_and_each_doubling() {
        let logged: Vec<u64> = (1..=1000).filter(|&n| log_this(n)).collect();
        assert_eq!(
            logged,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32, 64, 128, 256, 512]
        );
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_event_fires_and_the_next_waits_the_interval() {
        let mut r = RateLimit::new(ms(100));
        assert!(r.offer(ms(5)));
        assert_eq!(r.next_deadline(), None, "nothing held back");
        assert!(!r.offer(ms(50)), "too soon: held back");
        assert_eq!(r.next_deadline(), Some(ms(105)));
        assert!(!r.take_due(ms(104)), "not due yet");
        assert!(r.take_due(ms(105)));
        assert!(!r.take_due(ms(106)), "taken once");
        r.fired(ms(105));
        assert!(!r.offer(ms(150)));
        assert_eq!(r.next_deadline(), Some(ms(205)));
    }

    #[test]
    fn a_dropped_trailing_event_keeps_the_last_firing_time() {
        let mut r = RateLimit::new(ms(100));
        assert!(r.offer(ms(0)));
        assert!(!r.offer(ms(10)));
        assert!(r.take_due(ms(200)), "due; the caller drops it");
        assert_eq!(r.next_deadline(), None);
        assert!(
            r.offer(ms(201)),
            "the interval since the last event (0) is over"
        );
    }

    #[test]
    fn an_interval_past_the_clock_never_lets_a_second_event_through() {
        let mut r = RateLimit::new(Duration::MAX);
        assert!(r.offer(ms(1)));
        assert!(!r.offer(Duration::MAX - ms(1)));
        assert_eq!(r.next_deadline(), Some(Duration::MAX));
    }
}
