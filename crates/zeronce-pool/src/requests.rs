//! The answers to a connection's requests ([`proto`](crate::proto)), from the [`Pool`]:
//! one reply line each (with a descriptor for `take` with `fd`), or a stream of events
//! for `watch`.

use std::io::{IoSlice, Write};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde_json::{json, Value};

use crate::daemon::{Pool, PoolError};
use crate::proto::{error_reply, Request};
use crate::state::{Claim, Connection, FileId, Returner};
use crate::usage::FileUser;

/// Sends one reply line, with `fd` attached when given.
pub(crate) fn send_line(
    stream: &UnixStream,
    reply: &Value,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let line = format!("{reply}\n");
    let mut sent = 0;
    let fds;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if let Some(fd) = fd {
        fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    while sent < line.len() {
        let n = sendmsg(
            stream,
            &[IoSlice::new(&line.as_bytes()[sent..])],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        sent += n;
        // The descriptor went with the first bytes.
        control = SendAncillaryBuffer::default();
    }
    Ok(())
}

/// Answers one request (not `watch`) of connection `conn`; `leases` are its leased
/// files, `connections` the connection counters `stats` reports (as JSON).
pub(crate) fn answer(
    pool: &Pool,
    connections: &dyn Fn() -> Value,
    conn: Connection,
    stream: &UnixStream,
    request: Request,
    leases: &mut Vec<FileId>,
) -> std::io::Result<()> {
    match request {
        Request::Watch => unreachable!("watch streams: see watch()"),
        Request::Take {
            bytes,
            fd,
            wait,
            lease,
        } => match pool.take_by(bytes, wait, Some(conn)) {
            Ok(taken) => {
                if lease {
                    // Before the client learns the path: a client dying from here
                    // on orphans the file.
                    match pool.lease(taken.file) {
                        Ok(()) => leases.push(taken.file),
                        Err(e) => tracing::error!(%e, "lease not recorded; the file is held"),
                    }
                }
                let mut reply = json!({
                    "ok": true, "path": taken.path, "bytes": taken.bytes,
                    "served": taken.served.name(), "fd": fd, "token": taken.token,
                });
                match fd.then(|| pool.client_fd(taken.file)) {
                    Some(Err(e)) => {
                        // The file is the client's (recorded held): it can open the path.
                        reply["fd"] = false.into();
                        reply["fd_error"] = e.to_string().into();
                        send_line(stream, &reply, None)
                    }
                    Some(Ok(owned)) => send_line(stream, &reply, Some(owned.as_fd())),
                    None => send_line(stream, &reply, None),
                }
            }
            Err(e) => send_line(stream, &pool_error(&e), None),
        },
        Request::Return { path, token } => {
            let claim = Claim {
                connection: conn.id,
                user: returner(conn.uid),
                token: token.as_deref(),
            };
            let reply = match pool.return_file(Path::new(&path), Some(&claim)) {
                Ok(r) => {
                    leases.retain(|&f| pool.path(f) != r.path);
                    let mut v = json!({"ok": true, "path": r.path, "in_use": r.in_use.is_some()});
                    if let Some(FileUser::Process(pid)) = r.in_use {
                        v["used_by"] = pid.into();
                    }
                    v
                }
                Err(e) => pool_error(&e),
            };
            send_line(stream, &reply, None)
        }
        Request::Stats => {
            let stats = pool.stats();
            let mut v = stats.to_json();
            v["ok"] = true.into();
            v["nodes"] = node_counters(stats.page_bytes);
            v["connections"] = connections();
            send_line(stream, &v, None)
        }
        Request::Prezero { pages } => {
            let r = pool.prezero(pages);
            let reply = json!({
                "ok": true, "pages_zeroed": r.pages_zeroed,
                "pages_repopulated": r.pages_repopulated,
                "elapsed_ms": r.elapsed.as_secs_f64() * 1e3,
                "zeroable_left": r.zeroable_left,
            });
            send_line(stream, &reply, None)
        }
    }
}

/// Who a return from `uid` comes from: root and the daemon's own user are trusted with
/// any token (they can read the state file that records them); anyone else's token
/// returns only what that user took.
fn returner(uid: u32) -> Returner {
    if uid == 0 || uid == rustix::process::geteuid().as_raw() {
        Returner::Trusted
    } else {
        Returner::Uid(uid)
    }
}

/// Streams events until the client hangs up or the pool stops.
pub(crate) fn watch(pool: &Pool, mut stream: &UnixStream) -> std::io::Result<()> {
    let events = pool.subscribe();
    send_line(stream, &json!({"ok": true}), None)?;
    while !pool.is_shut_down() {
        match events.recv_timeout(Duration::from_millis(200)) {
            Ok(e) => {
                let line = json!({
                    "event": "zeroable", "pages": e.zeroable, "trailing": e.trailing,
                    "at_ms": e.at.as_secs_f64() * 1e3,
                });
                stream.write_all(format!("{line}\n").as_bytes())?;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(())
}

/// An error reply for a pool error, with a stable kind.
fn pool_error(e: &PoolError) -> Value {
    use crate::state::StateError;
    let kind = match e {
        PoolError::State(StateError::TooLarge { .. }) => "too_large",
        PoolError::State(StateError::ZeroBytes) => "bad_request",
        PoolError::State(StateError::Exhausted { .. }) => "exhausted",
        PoolError::State(StateError::Unknown(_)) => "unknown_file",
        PoolError::State(StateError::NotHeld(_)) => "not_held",
        PoolError::State(StateError::NotOwner(_)) => "not_owner",
        PoolError::ShuttingDown => "shutting_down",
        _ => "internal",
    };
    tracing::info!(%e, kind, "request refused");
    error_reply(kind, &e.to_string())
}

/// The kernel's per-node counters of this page size (empty without NUMA sysfs).
fn node_counters(page_bytes: u64) -> Value {
    let kb = page_bytes / 1024;
    let mut nodes = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else {
        return Value::Array(nodes);
    };
    let mut entries: Vec<_> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id: u32 = name.strip_prefix("node")?.parse().ok()?;
            Some((id, e.path()))
        })
        .collect();
    entries.sort();
    for (id, path) in entries {
        let read = |f: &str| -> Option<u64> {
            let p = path.join(format!("hugepages/hugepages-{kb}kB/{f}"));
            std::fs::read_to_string(p).ok()?.trim().parse().ok()
        };
        if let (Some(total), Some(free)) = (read("nr_hugepages"), read("free_hugepages")) {
            nodes.push(json!({"node": id, "kernel_total": total, "kernel_free": free}));
        }
    }
    Value::Array(nodes)
}
