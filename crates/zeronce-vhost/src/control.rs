//! The control socket: one JSON object per line in each direction.
//!
//! | request | effect | answer |
//! |---|---|---|
//! | `{"op":"set","pages":N}` | target `num_pages` = N (4 KiB pages); the guest is told (`CONFIG_CHANGE_MSG`) | `{"ok":true,"num_pages":N}` |
//! | `{"op":"status"}` | — | `{"ok":true,"connected":…,"connections":…,"rejected_connections":…,"refused_peers":…,"refused_control_connections":…,"num_pages":…,"host":{"policy":…,"hold_ms":…},"actual":…,"features":…,"regions":[{"gpa":…,"size":…,"backing":"shared_file"/"hugetlb","page_size":…}],"metrics":{…},"stats":{…}}` |
//! | `{"op":"stats","timeout_ms":T}` | asks the guest for fresh statistics, waits up to T ms for them | the status, with `"fresh":true/false` |
//! | `{"op":"hint"}` | starts a free page hint run (a new `free_page_hint_cmd_id`; the guest is told), ended by the guest's STOP or after [`crate::Limits::hint_run`] | `{"ok":true,"cmd_id":N,"timeout_ms":T}`, or an error when no guest is connected, it did not negotiate hinting, or a run is still running |
//! | `{"op":"hint_status"}` | — | `{"ok":true,"state":"idle"/"running"/"done"/"timed_out","cmd_id":…,"acknowledged":…,"pages_hinted":…,"bytes_discarded":…}` of the latest run |
//!
//! A bad request (not JSON, not UTF-8) gets `{"ok":false,"error":"…"}` and the
//! connection stays usable; a line longer than 4 KiB gets one and the connection is
//! closed. The socket is the daemon's user's (mode 0600, peer credentials checked);
//! connections are bounded in number and closed after a minute of silence
//! ([`crate::Limits`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use thiserror::Error;
use zeronce_balloon::{Backing, BalloonMetrics, DiscardPolicy, GuestStats, RegionBacking};
use zeronce_daemon::{read_line, refuse, AcceptBackoff, Line};
use zeronce_types::rate::log_this;

use crate::hub::Hub;

/// Longest request line accepted.
const MAX_LINE: usize = 4096;
/// Longest answer a client reads (a status with the guest's statistics is well below).
const MAX_ANSWER: u64 = 1 << 20;
/// Longest wait for fresh statistics.
const MAX_STATS_WAIT: Duration = Duration::from_secs(30);

/// Serves control connections until the hub stops: each in a thread of its own, at most
/// [`crate::Limits::control_connections`] at once (one more gets an error line), only
/// from allowed peers, each closed after [`crate::Limits::control_idle`] of silence.
pub(crate) fn serve(hub: &Arc<Hub>, listener: &UnixListener) {
    let mut backoff = AcceptBackoff::new("control");
    loop {
        let s = match listener.accept() {
            _ if hub.stopping() => return,
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                std::thread::sleep(backoff.failed(&e));
                continue;
            }
        };
        backoff.succeeded();
        if hub.control_peers.admit(&s).is_none() {
            continue;
        }
        let Some(slot) = hub.control_slots.try_acquire() else {
            let max = hub.control_slots.max();
            let n = hub.control_slots.refused();
            if log_this(n) {
                tracing::warn!(max, refused = n, "control connection refused: too many");
            }
            let msg = format!("too many control connections (at most {max}); try again");
            refuse(s, &error(&msg).to_string());
            continue;
        };
        let hub = Arc::clone(hub);
        let spawned = std::thread::Builder::new()
            .name("zeronce-control-conn".into())
            .spawn(move || {
                let _slot = slot;
                if let Err(e) = connection(&hub, s) {
                    tracing::debug!(error = %e, "control connection ended");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot serve a control connection");
        }
    }
}

fn connection(hub: &Hub, s: UnixStream) -> io::Result<()> {
    let idle = hub.config().limits.control_idle;
    s.set_read_timeout(Some(idle))?;
    // A client that does not read its answers does not hold the thread for ever.
    s.set_write_timeout(Some(idle))?;
    let mut out = s.try_clone()?;
    let mut reader = BufReader::new(s);
    loop {
        let (answer, close) = match read_line(&mut reader, MAX_LINE)? {
            Line::Eof => return Ok(()),
            Line::TooLong => (error("request line too long"), true),
            Line::NotUtf8 => (error("request line is not UTF-8"), false),
            Line::Text(line) => match serde_json::from_str::<Value>(&line) {
                Ok(req) => (handle(hub, &req), false),
                Err(e) => (error(&format!("not JSON: {e}")), false),
            },
        };
        writeln!(out, "{answer}")?;
        if close {
            return Ok(());
        }
    }
}

pub(crate) fn error(msg: &str) -> Value {
    json!({"ok": false, "error": msg})
}

/// Answers one request.
pub(crate) fn handle(hub: &Hub, req: &Value) -> Value {
    match req.get("op").and_then(Value::as_str) {
        Some("set") => {
            let Some(pages) = req
                .get("pages")
                .and_then(Value::as_u64)
                .and_then(|p| u32::try_from(p).ok())
            else {
                return error("set needs \"pages\": a 4 KiB page count below 2^32");
            };
            hub.set_target(pages);
            json!({"ok": true, "num_pages": pages})
        }
        Some("status") => status(hub, None),
        Some("stats") => {
            let wait = req
                .get("timeout_ms")
                .and_then(Value::as_u64)
                .map_or(Duration::from_secs(2), Duration::from_millis)
                .min(MAX_STATS_WAIT);
            let fresh = fresh_stats(hub, wait);
            status(hub, Some(fresh))
        }
        Some("hint") => crate::hint::start(hub),
        Some("hint_status") => crate::hint::status(hub),
        Some(op) => error(&format!(
            "unknown op {op:?} (set, status, stats, hint, hint_status)"
        )),
        None => error("missing \"op\""),
    }
}

/// Asks the guest for statistics and waits until they arrive or `wait` passes.
fn fresh_stats(hub: &Hub, wait: Duration) -> bool {
    let Some(backend) = hub.backend() else {
        return false;
    };
    let before = {
        let mut g = backend.lock();
        let before = g.device().stats().updates();
        match g.request_stats() {
            Ok(true) => before,
            Ok(false) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "statistics request failed");
                return false;
            }
        }
    };
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if backend.lock().device().stats().updates() > before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn status(hub: &Hub, fresh: Option<bool>) -> Value {
    let mut v = json!({
        "ok": true,
        "connected": false,
        "connections": hub.connections(),
        "rejected_connections": hub.rejected(),
        "refused_peers": hub.refused_peers(),
        "refused_control_connections": hub.control_slots.refused(),
        "num_pages": hub.target(),
        "host": host(hub.config().balloon.policy),
    });
    if let Some(backend) = hub.backend() {
        let mut g = backend.lock();
        v["regions"] = regions(g.regions());
        let dev = g.device();
        v["connected"] = json!(true);
        v["actual"] = json!(dev.config().actual());
        v["features"] = json!(dev.negotiated().map(|n| n.features().bits()));
        v["metrics"] = metrics(&dev.metrics());
        v["stats"] = stats(dev.stats());
    }
    if let Some(fresh) = fresh {
        v["fresh"] = json!(fresh);
    }
    v
}

/// The host policy: its name (as `--host` spells it) and, under `hold`, the delay.
fn host(policy: DiscardPolicy) -> Value {
    match policy {
        DiscardPolicy::Hold(d) => json!({"policy": policy.name(), "hold_ms": d.as_millis()}),
        _ => json!({"policy": policy.name()}),
    }
}

/// The regions of the latest memory table: where, how large, and their backing (with its
/// huge page size), or why they cannot be discarded.
fn regions(regions: &[RegionBacking]) -> Value {
    let one = |r: &RegionBacking| {
        let mut v = json!({"gpa": r.start.0, "size": r.len});
        match &r.backing {
            Ok(b) => v["backing"] = json!(backing_name(*b)),
            Err(e) => v["error"] = json!(e.to_string()),
        }
        if let Ok(Backing::Hugetlb { page_size }) = r.backing {
            v["page_size"] = json!(page_size);
        }
        v
    };
    Value::Array(regions.iter().map(one).collect())
}

/// A backing's name in the status.
fn backing_name(b: Backing) -> &'static str {
    match b {
        Backing::PrivateAnonymous => "private_anonymous",
        Backing::SharedFile => "shared_file",
        Backing::Hugetlb { .. } => "hugetlb",
    }
}

/// The device counters; `balloon_inflate` / `balloon_deflate` as Linux names the same
/// counts in /proc/vmstat.
pub(crate) fn metrics(m: &BalloonMetrics) -> Value {
    json!({
        "balloon_inflate": m.pages_inflated.get(),
        "balloon_deflate": m.pages_deflated.get(),
        "pages_reported": m.pages_reported.get(),
        "bytes_discarded": m.bytes_discarded.get(),
        "zero_promises": m.zero_promises.get(),
        "discard_errors": m.discard_errors.get(),
        "reports_skipped_poison": m.reports_skipped_poison.get(),
        "pages_hinted": m.pages_hinted.get(),
        "hints_stale": m.hints_stale.get(),
        "stats_updates": m.stats_updates.get(),
        "config_changes": m.config_changes.get(),
        "malformed": m.malformed_total(),
    })
}

fn stats(s: &GuestStats) -> Value {
    let map: Map<String, Value> = s
        .named()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), json!(v)))
        .collect();
    Value::Object(map)
}

/// Answers a control request that came to the vhost-user socket (`zeronce balloon
/// --socket` given the wrong path): one refusal naming the control socket, then the
/// connection ends. The request line is read first, so closing does not reset the
/// connection before the client reads the answer.
pub(crate) fn refuse_misdirected(stream: &UnixStream, control: &Path) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut line = String::new();
    let _ = BufReader::new(stream.take(MAX_LINE as u64)).read_line(&mut line);
    let control = control.display().to_string();
    let answer = json!({
        "ok": false,
        "not_control_socket": true,
        "control": control,
        "error": format!("this is the vhost-user socket; the control socket is {control}"),
    });
    writeln!(&*stream, "{answer}")?;
    stream.shutdown(std::net::Shutdown::Write)
}

/// A control client error.
#[derive(Debug, Error)]
pub enum ControlError {
    /// The socket could not be reached (most often: no daemon is listening there).
    #[error(
        "cannot reach the control socket {path}: {source}; is `zeronce serve` running? It \
         prints its control socket (default: the vhost-user socket's path + .ctl)"
    )]
    Connect {
        /// The control socket.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// The exchange failed.
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    /// The peer is not a control socket: it closed, reset the connection or answered
    /// something that is not the control protocol.
    #[error(
        "{path} is not a zeronce control socket ({why}); is it the vhost-user socket? \
         `zeronce serve` prints its control socket (default: the vhost-user socket's path + \
         .ctl)"
    )]
    NotControl {
        /// The socket given.
        path: String,
        /// What the peer did.
        why: String,
    },
    /// The peer is the vhost-user socket of a `zeronce serve` (it said so).
    #[error(
        "{path} is the vhost-user socket of `zeronce serve`, not its control socket: use \
         --socket {control}"
    )]
    VhostUserSocket {
        /// The socket given.
        path: String,
        /// The daemon's control socket.
        control: String,
    },
    /// The daemon refused the request.
    #[error("refused: {0}")]
    Refused(String),
}

/// Sends one request to the daemon at `path` and returns its answer (`ok` true).
pub fn request(path: &Path, req: &Value) -> Result<Value, ControlError> {
    let s = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.display().to_string(),
        source,
    })?;
    let not_control = |why: String| ControlError::NotControl {
        path: path.display().to_string(),
        why,
    };
    writeln!(&s, "{req}").map_err(|e| not_control(format!("sending the request: {e}")))?;
    let mut line = String::new();
    match BufReader::new(&s).take(MAX_ANSWER).read_line(&mut line) {
        Ok(0) => {
            return Err(not_control(
                "it closed the connection without an answer".into(),
            ))
        }
        Ok(_) => {}
        Err(e) => return Err(not_control(format!("reading the answer: {e}"))),
    }
    let v: Value = serde_json::from_str(&line)
        .ok()
        .filter(|v: &Value| v.get("ok").is_some_and(Value::is_boolean))
        .ok_or_else(|| {
            not_control("it answered something other than the control protocol".into())
        })?;
    if v.get("not_control_socket") == Some(&Value::Bool(true)) {
        return Err(ControlError::VhostUserSocket {
            path: path.display().to_string(),
            control: v["control"].as_str().unwrap_or("?").to_owned(),
        });
    }
    if v.get("ok") == Some(&Value::Bool(true)) {
        Ok(v)
    } else {
        let msg = v.get("error").and_then(Value::as_str).unwrap_or("?");
        Err(ControlError::Refused(msg.to_owned()))
    }
}
