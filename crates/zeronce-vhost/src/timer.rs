//! [`HoldTimer`]: the timer that completes held requests (`--host hold`) on time.
//!
//! The device holds a reported or inflated range's descriptor until its hold is over and
//! completes it at the first [`zeronce_balloon::BalloonDevice::tick`] after the deadline.
//! Over vhost-user nothing else wakes the back-end then (the guest is waiting for the
//! buffer and sends no notification), so the back-end keeps a timerfd in its vring
//! thread's epoll, armed at the device's earliest deadline
//! ([`zeronce_balloon::BalloonDevice::next_deadline`]) after every event it serves. The
//! tick runs in the same thread as the queue notifications, under the same device lock.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

/// A one-shot monotonic timer (non-blocking: reading it never stalls the vring thread).
pub(crate) struct HoldTimer {
    fd: OwnedFd,
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

impl HoldTimer {
    /// A disarmed timer.
    pub(crate) fn new() -> io::Result<HoldTimer> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        Ok(HoldTimer { fd })
    }

    /// Arms the timer to fire at `deadline` (at once if it is past), or disarms it
    /// (`None`). Arming discards an expiry not yet read.
    pub(crate) fn arm(&self, deadline: Option<Instant>, now: Instant) -> io::Result<()> {
        let value = match deadline {
            // A zero value disarms: a deadline already past fires in a nanosecond.
            Some(d) => timespec(
                d.saturating_duration_since(now)
                    .max(Duration::from_nanos(1)),
            ),
            None => timespec(Duration::ZERO),
        };
        let spec = Itimerspec {
            it_interval: timespec(Duration::ZERO),
            it_value: value,
        };
        timerfd_settime(&self.fd, TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    /// Reads the expiry count, so that epoll stops reporting it; an expiry already taken
    /// back by [`HoldTimer::arm`] is no error.
    pub(crate) fn acknowledge(&self) {
        let mut buf = [0u8; 8];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the hold timer"),
        }
    }
}

impl AsRawFd for HoldTimer {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expired(t: &HoldTimer) -> bool {
        let mut buf = [0u8; 8];
        rustix::io::read(&t.fd, &mut buf).is_ok()
    }

    #[test]
    fn fires_at_a_past_deadline_and_not_when_disarmed() {
        let t = HoldTimer::new().unwrap();
        assert!(!expired(&t), "a new timer is disarmed");
        let now = Instant::now();
        t.arm(Some(now), now).unwrap();
        let mut pfd = [rustix::event::PollFd::new(
            &t.fd,
            rustix::event::PollFlags::IN,
        )];
        let ready = rustix::event::poll(&mut pfd, None).unwrap();
        assert_eq!(ready, 1, "a deadline already past fires");
        t.acknowledge();
        assert!(!expired(&t), "acknowledged");
        t.arm(Some(now + Duration::from_secs(3600)), now).unwrap();
        t.arm(None, now).unwrap();
        assert!(!expired(&t), "disarmed");
        t.acknowledge();
    }
}
