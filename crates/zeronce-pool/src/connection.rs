//! One client connection of the control socket, and the bounds on all of them
//! ([`Limits`]): how many are served at once, how long one that holds no file may stay
//! silent, how long a request line may be, how long a reply may wait for its reader.
//! Each served connection has a thread; the registry ([`Connections`]) counts them,
//! refuses one past the limit, and closes them all at shutdown.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zeronce_types::sync::{self, lock};

use zeronce_daemon::peer::Peer;

use crate::daemon::Pool;
use crate::proto::error_reply;
use crate::requests;
use crate::state::Connection;

/// Bounds on the control socket's clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; one more gets a `too_many_connections` error line and
    /// is closed.
    pub max_connections: usize,
    /// Connections one process (the peer's pid, `SO_PEERCRED`) may have served at once;
    /// one more gets a `too_many_connections` error line naming the process and is
    /// closed, so one client reconnecting cannot take every slot.
    pub max_per_pid: usize,
    /// Connections one user (the peer's uid) may have served at once; one more gets a
    /// `too_many_connections` error line naming the user and is closed, so one user's
    /// processes (many pids) cannot take every slot from the others.
    pub max_per_uid: usize,
    /// A connection that holds no file it took and sends no complete line for this long
    /// gets an `idle_timeout` error line and is closed. A connection holding a file (a
    /// lease, or a take to return on it) is never timed out, nor is a `watch`.
    pub idle_timeout: Duration,
    /// Longest request line (bytes, without the newline). A longer one gets a
    /// `bad_request` reply and is skipped to its newline, never held in memory.
    pub max_line_bytes: usize,
    /// A reply or event the client does not read within this ends its connection.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 256,
            max_per_pid: 64,
            max_per_uid: 128,
            idle_timeout: Duration::from_secs(60),
            max_line_bytes: 16 << 10,
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Counts of what the bounds did (the `connections` object of the `stats` reply).
#[derive(Debug, Default)]
pub(crate) struct ConnectionCounters {
    pub(crate) accepted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) refused_per_pid: AtomicU64,
    pub(crate) refused_per_uid: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) lines_too_long: AtomicU64,
    pub(crate) bad_requests: AtomicU64,
}

/// The served connections (a clone of each stream, to close it at shutdown, and its
/// peer).
#[derive(Debug, Default)]
pub(crate) struct Connections {
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, (UnixStream, Peer)>>,
    closed: Condvar,
    pub(crate) counters: ConnectionCounters,
}

impl Connections {
    /// Serves `stream` (from `peer`) on a thread of its own, or refuses it (one error
    /// line, closed) when `limits.max_connections` are served already, or
    /// `limits.max_per_pid` of its process, or `limits.max_per_uid` of its user.
    pub(crate) fn serve(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
        stream: UnixStream,
        peer: Peer,
        limits: Limits,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (pid, uid) = (peer.pid, peer.uid);
        {
            let mut open = lock(&self.open);
            let mine = || open.values().filter(|(_, p)| p.pid == pid).count();
            let users = || open.values().filter(|(_, p)| p.uid == uid).count();
            let refusal = if open.len() >= limits.max_connections {
                let msg = format!(
                    "{} connections are served already; try again later",
                    limits.max_connections
                );
                Some((&self.counters.refused, msg))
            } else if mine() >= limits.max_per_pid {
                let msg = format!(
                    "process {pid} has {} connections served already (--max-connections-per-pid); close one first",
                    limits.max_per_pid
                );
                Some((&self.counters.refused_per_pid, msg))
            } else if users() >= limits.max_per_uid {
                let msg = format!(
                    "user {uid} has {} connections served already (--max-connections-per-uid); close one first",
                    limits.max_per_uid
                );
                Some((&self.counters.refused_per_uid, msg))
            } else {
                None
            };
            if let Some((count, msg)) = refusal {
                drop(open);
                let n = count.fetch_add(1, Ordering::Relaxed) + 1;
                if zeronce_types::rate::log_this(n) {
                    tracing::warn!(
                        pid,
                        uid,
                        refused = n,
                        "connection refused: {msg} (first 10 logged, then at each doubling)"
                    );
                }
                refuse(stream, "too_many_connections", &msg);
                return;
            }
            match stream.try_clone() {
                Ok(clone) => open.insert(id, (clone, peer)),
                Err(e) => {
                    tracing::warn!(%e, "connection dropped: cannot clone its socket");
                    return;
                }
            };
        }
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let (conns, pool) = (Arc::clone(self), Arc::clone(pool));
        let conn = Connection { id, uid };
        let spawned = std::thread::Builder::new()
            .name("zeronce-pool-client".into())
            .spawn(move || {
                if let Err(e) = serve_client(&pool, &conns, conn, stream, limits) {
                    tracing::debug!(%e, "client connection ended");
                }
                conns.remove(id);
            });
        if let Err(e) = spawned {
            tracing::warn!(%e, "no thread for a client");
            self.remove(id);
        }
    }

    fn remove(&self, id: u64) {
        lock(&self.open).remove(&id);
        self.closed.notify_all();
    }

    /// Connections served now.
    pub(crate) fn open(&self) -> usize {
        lock(&self.open).len()
    }

    /// Shuts every connection's socket down and waits (up to `patience`) until their
    /// threads are done. Whether they all were.
    pub(crate) fn close_all(&self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let mut open = lock(&self.open);
        for (stream, _) in open.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        while !open.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(
                    left = open.len(),
                    "client threads still running at shutdown"
                );
                return false;
            }
            open = sync::wait_timeout(&self.closed, open, deadline - now);
        }
        true
    }

    /// The `connections` object of the `stats` reply.
    pub(crate) fn to_json(&self) -> Value {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "open": self.open(), "accepted": n(&c.accepted), "refused": n(&c.refused),
            "refused_per_pid": n(&c.refused_per_pid),
            "refused_per_uid": n(&c.refused_per_uid),
            "timed_out": n(&c.timed_out), "lines_too_long": n(&c.lines_too_long),
            "bad_requests": n(&c.bad_requests),
        })
    }
}

/// Sends one error line, best effort and without blocking, and closes the connection.
fn refuse(stream: UnixStream, kind: &str, message: &str) {
    let _ = stream.set_nonblocking(true);
    let _ = (&stream).write_all(format!("{}\n", error_reply(kind, message)).as_bytes());
}

/// One line read from a client.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// A complete line (without its newline), or the bytes before end of file.
    Text(Vec<u8>),
    /// The line grew past the limit: the rest up to its newline is being skipped.
    TooLong,
    /// No complete line before the deadline.
    TimedOut,
    /// The client closed its end.
    Eof,
}

/// Reads lines of at most `max` bytes, never holding more than `max` plus one read.
pub(crate) struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    max: usize,
    skipping: bool,
    eof: bool,
}

impl<R: Read> LineReader<R> {
    /// Lines of at most `max` bytes from `inner`.
    pub(crate) fn new(inner: R, max: usize) -> LineReader<R> {
        LineReader {
            inner,
            buf: Vec::new(),
            max,
            skipping: false,
            eof: false,
        }
    }

    /// The next line. `before_read` is called before each read with the time left
    /// until `deadline` (`None`: no deadline), to set the socket's read timeout.
    pub(crate) fn next_line(
        &mut self,
        deadline: Option<Instant>,
        mut before_read: impl FnMut(Option<Duration>) -> std::io::Result<()>,
    ) -> std::io::Result<Line> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                if std::mem::take(&mut self.skipping) {
                    continue;
                }
                return Ok(Line::Text(line[..end].to_vec()));
            }
            if self.skipping {
                self.buf.clear();
            } else if self.buf.len() > self.max {
                self.buf = Vec::new();
                self.skipping = true;
                return Ok(Line::TooLong);
            }
            if self.eof {
                return Ok(match std::mem::take(&mut self.buf) {
                    rest if rest.is_empty() || self.skipping => Line::Eof,
                    rest => Line::Text(rest),
                });
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(Line::TimedOut),
                },
            };
            before_read(left)?;
            let mut chunk = [0u8; 4096];
            match self.inner.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Serves one connection; files it leased and did not return are orphaned when it ends,
/// however it ends.
fn serve_client(
    pool: &Pool,
    conns: &Connections,
    conn: Connection,
    stream: UnixStream,
    limits: Limits,
) -> std::io::Result<()> {
    let mut leases = Vec::new();
    let result = serve_lines(pool, conns, conn, &stream, limits, &mut leases);
    for file in leases {
        if let Err(e) = pool.end_lease(file) {
            tracing::error!(%e, "ending a lease failed");
        }
    }
    result
}

fn serve_lines(
    pool: &Pool,
    conns: &Connections,
    conn: Connection,
    stream: &UnixStream,
    limits: Limits,
    leases: &mut Vec<crate::state::FileId>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(limits.write_timeout))?;
    let mut lines = LineReader::new(stream, limits.max_line_bytes);
    let bad = |message: &str| {
        conns.counters.bad_requests.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(message, "bad request");
        requests::send_line(stream, &error_reply("bad_request", message), None)
    };
    loop {
        // A connection holding a file may stay silent as long as it likes.
        let deadline = (!pool.held_by(conn.id) && leases.is_empty())
            .then(|| Instant::now() + limits.idle_timeout);
        let line = lines.next_line(deadline, |left| stream.set_read_timeout(left))?;
        let line = match line {
            Line::Eof => return Ok(()),
            Line::TimedOut => {
                conns.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                tracing::info!(after = ?limits.idle_timeout, "idle connection closed");
                let msg = format!("no request for {:?}: closing", limits.idle_timeout);
                let _ = requests::send_line(stream, &error_reply("idle_timeout", &msg), None);
                return Ok(());
            }
            Line::TooLong => {
                conns
                    .counters
                    .lines_too_long
                    .fetch_add(1, Ordering::Relaxed);
                let max = limits.max_line_bytes;
                bad(&format!(
                    "request line longer than {max} bytes: skipped to its end"
                ))?;
                continue;
            }
            Line::Text(bytes) => bytes,
        };
        let Ok(text) = std::str::from_utf8(&line) else {
            bad("bad request: the line is not UTF-8")?;
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        match crate::proto::Request::parse(text) {
            Ok(crate::proto::Request::Watch) => return requests::watch(pool, stream),
            Ok(request) => {
                requests::answer(pool, &|| conns.to_json(), conn, stream, request, leases)?
            }
            Err(e) => bad(&e.to_string())?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut r = LineReader::new(input, max);
        let mut out = Vec::new();
        loop {
            let line = r.next_line(None, |_| Ok(())).unwrap();
            let end = line == Line::Eof;
            out.push(line);
            if end {
                return out;
            }
        }
    }

    #[test]
    fn lines_are_bounded_and_a_long_one_is_skipped_to_its_end() {
        let text = |s: &str| Line::Text(s.as_bytes().to_vec());
        assert_eq!(
            all_lines(b"ab\n\ncd", 8),
            vec![text("ab"), text(""), text("cd"), Line::Eof]
        );
        let mut long = vec![b'x'; 100_000];
        long.extend_from_slice(b"\nok\n");
        assert_eq!(
            all_lines(&long, 16),
            vec![Line::TooLong, text("ok"), Line::Eof]
        );
        // Never more than the limit plus one read is held.
        let mut r = LineReader::new(&long[..], 16);
        assert_eq!(r.next_line(None, |_| Ok(())).unwrap(), Line::TooLong);
        assert!(r.buf.capacity() <= 16 + 4096);
        let mut unterminated = vec![b'y'; 50_000];
        unterminated.insert(0, b'\n');
        assert_eq!(
            all_lines(&unterminated, 16),
            vec![text(""), Line::TooLong, Line::Eof]
        );
    }

    #[test]
    fn a_deadline_in_the_past_times_out() {
        let mut r = LineReader::new(&b"partial"[..], 64);
        let past = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(r.next_line(Some(past), |_| Ok(())).unwrap(), Line::TimedOut);
    }
}
