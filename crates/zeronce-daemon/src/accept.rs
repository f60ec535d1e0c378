//! Bounded accept loops: back off when the process or the system is out of descriptors
//! or memory, cap the connections served at once, and refuse the rest with a line.

use std::io::{self, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::io::Errno;
use zeronce_types::rate::log_this;

/// The first sleep after `accept` failed for lack of resources.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(10);
/// The longest sleep.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Whether a failed `accept` means "out of resources, try again later": descriptors of
/// the process (`EMFILE`) or the system (`ENFILE`), socket buffers (`ENOBUFS`), memory
/// (`ENOMEM`).
pub fn is_exhaustion(e: &io::Error) -> bool {
    [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM]
        .iter()
        .any(|x| e.raw_os_error() == Some(x.raw_os_error()))
}

/// What an accept loop does after a failed `accept`: sleep ([`BACKOFF_FIRST`], doubling
/// with each failure in a row up to [`BACKOFF_MAX`], reset by the next success), with
/// one log line at each doubling of the sleep and then at each doubling of the count of
/// failures — not a line per failure, thousands a second.
#[derive(Debug)]
pub struct AcceptBackoff {
    what: &'static str,
    delay: Duration,
    failures: u64,
}

impl AcceptBackoff {
    /// The back-off of the socket called `what` in log lines.
    pub fn new(what: &'static str) -> Self {
        AcceptBackoff {
            what,
            delay: Duration::ZERO,
            failures: 0,
        }
    }

    /// An `accept` succeeded.
    pub fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                socket = self.what,
                failures = self.failures,
                "accept works again"
            );
        }
        self.delay = Duration::ZERO;
        self.failures = 0;
    }

    /// An `accept` failed with `e`: how long to sleep before the next one. Errors that
    /// are not [`is_exhaustion`] (a connection reset before it was accepted) get no
    /// sleep beyond the first step.
    pub fn failed(&mut self, e: &io::Error) -> Duration {
        self.failures += 1;
        let before = self.delay;
        self.delay = if before.is_zero() {
            BACKOFF_FIRST
        } else if is_exhaustion(e) {
            (before * 2).min(BACKOFF_MAX)
        } else {
            before
        };
        if self.delay != before || log_this(self.failures) {
            tracing::warn!(
                socket = self.what,
                error = %e,
                failures = self.failures,
                sleep_ms = self.delay.as_millis() as u64,
                "accept failed: backing off (logged at each doubling)"
            );
        }
        self.delay
    }

    /// Failed `accept`s in a row so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }
}

/// At most `max` connections at once; each accepted one holds a [`ConnSlot`].
#[derive(Clone, Debug)]
pub struct ConnLimit {
    max: usize,
    active: Arc<AtomicUsize>,
    refused: Arc<AtomicU64>,
}

/// One admitted connection; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnSlot {
    active: Arc<AtomicUsize>,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnLimit {
    /// A limit of `max` connections.
    pub fn new(max: usize) -> Self {
        ConnLimit {
            max,
            active: Arc::default(),
            refused: Arc::default(),
        }
    }

    /// A slot, or `None` (counted as refused) when `max` connections are being served.
    pub fn try_acquire(&self) -> Option<ConnSlot> {
        let got = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok();
        if got {
            Some(ConnSlot {
                active: Arc::clone(&self.active),
            })
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections served now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Connections refused because the limit was reached.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// How long [`refuse`] waits for the client to take its line.
pub const REFUSE_TIMEOUT: Duration = Duration::from_millis(200);

/// Writes `line` (and a newline) to `stream` without blocking longer than
/// [`REFUSE_TIMEOUT`], then closes it: the refusal of a line-oriented socket.
pub fn refuse(stream: UnixStream, line: &str) {
    let _ = stream.set_write_timeout(Some(REFUSE_TIMEOUT));
    let _ = writeln!(&stream, "{line}");
    let _ = stream.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};

    use super::*;

    #[test]
    fn exhaustion_doubles_the_sleep_up_to_a_second_and_success_resets_it() {
        let mut b = AcceptBackoff::new("test");
        let emfile = io::Error::from_raw_os_error(Errno::MFILE.raw_os_error());
        let sleeps: Vec<u128> = (0..10).map(|_| b.failed(&emfile).as_millis()).collect();
        assert_eq!(sleeps, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(b.failures(), 10);
        b.succeeded();
        assert_eq!(b.failed(&emfile), BACKOFF_FIRST);
        let reset = io::Error::from_raw_os_error(Errno::CONNABORTED.raw_os_error());
        assert!(!is_exhaustion(&reset));
        assert_eq!(
            b.failed(&reset),
            BACKOFF_FIRST,
            "no growth for other errors"
        );
        for e in [Errno::NFILE, Errno::NOBUFS, Errno::NOMEM] {
            assert!(is_exhaustion(&io::Error::from_raw_os_error(
                e.raw_os_error()
            )));
        }
    }

    #[test]
    fn the_limit_admits_max_and_frees_a_slot_on_drop() {
        let l = ConnLimit::new(2);
        let a = l.try_acquire().unwrap();
        let _b = l.try_acquire().unwrap();
        assert!(l.try_acquire().is_none());
        assert_eq!((l.active(), l.refused()), (2, 1));
        drop(a);
        assert!(l.try_acquire().is_some());
    }

    #[test]
    fn a_refused_client_reads_its_line_then_end_of_stream() {
        let (a, b) = UnixStream::pair().unwrap();
        refuse(a, r#"{"ok":false,"error":"busy"}"#);
        let mut lines = BufReader::new(b).lines();
        assert_eq!(
            lines.next().unwrap().unwrap(),
            r#"{"ok":false,"error":"busy"}"#
        );
        assert!(lines.next().is_none());
    }
}
