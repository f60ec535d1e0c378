//! `zeronce pool serve`: what its in-use check sees and whom it trusts (issue 20). A
//! returned file whose only remaining user is a descriptor in flight in a socket's queue
//! (invisible to `/proc`), one user holding every connection, a token presented by a
//! user other than its taker's. Needs a hugetlbfs mount of 2 MiB pages
//! (`ZERONCE_HUGETLBFS_2M`): ignored by a plain `cargo nextest run`; `.ci/run` mounts one
//! and runs them.

mod common;

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde_json::{json, Value};

use common::pool::{
    check_zero_then_write, counter, map, open, pool_as_nobody, refused, take, Daemon, Raw, PAGE,
    PAGES,
};

/// Sends `fd` over `socket` (one byte with it) and closes this process's descriptor.
fn send_fd(socket: &UnixStream, fd: OwnedFd) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [std::os::fd::AsFd::as_fd(&fd)];
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    let sent = sendmsg(
        socket,
        &[std::io::IoSlice::new(b"x")],
        &mut control,
        SendFlags::empty(),
    )
    .unwrap();
    assert_eq!(sent, 1);
}

/// Receives the descriptor [`send_fd`] sent.
fn recv_fd(socket: &UnixStream) -> OwnedFd {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .unwrap();
    let fd = control.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    fd.expect("a descriptor with the byte")
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn a_returned_file_whose_descriptor_is_in_flight_in_a_socket_is_not_zeroed() {
    let mut daemon = Daemon::start("inflight");
    daemon.wait_idle();
    let mut taker = Raw::connect(&daemon.socket);
    let taken = taker.request(&take(PAGE)).expect("a take reply");
    let path = PathBuf::from(taken["path"].as_str().expect("a path"));
    // The guest writes the file; then the VMM hands its descriptor to another process
    // (sent, not yet received) and closes its own: no process has the file open or
    // mapped, only the socket's queue holds it.
    check_zero_then_write(&mut map(open(&path)));
    let (sender, receiver) = UnixStream::pair().unwrap();
    send_fd(&sender, open(&path));
    let reply = taker
        .request(&json!({"op": "return", "path": path}))
        .unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    // Whatever the daemon decided, it is done with it.
    daemon.wait_idle();
    let ram = map(recv_fd(&receiver));
    assert!(
        !ram.is_zero(0, ram.len()).unwrap(),
        "the daemon zeroed a returned file whose descriptor was in flight in a socket"
    );
    assert_eq!(reply["in_use"], true, "{reply}");
    assert_eq!(daemon.stats()["pages"]["orphaned"], PAGES);
    drop((ram, sender, receiver));
    daemon.wait_for(
        |d| counter(&d.stats(), "orphans_reclaimed") == 1,
        "the reclaim once the descriptor is gone",
    );
    daemon.wait_idle();
    check_zero_then_write(&mut map(open(&daemon.take_waiting().path)));
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M; .ci/run mounts one and runs it"]
fn one_user_cannot_take_every_connection() {
    let metrics = std::env::temp_dir().join(format!("zeronce-pmu-{}.sock", std::process::id()));
    let args = [
        "--max-connections-per-pid",
        "8",
        "--max-connections-per-uid",
        "2",
        "--metrics",
        metrics.to_str().unwrap(),
    ];
    let mut daemon = Daemon::start_with("peruid", &args);
    daemon.wait_idle();
    let stats = |raw: &mut Raw| raw.request(&json!({"op": "stats"})).expect("a stats reply");
    let mut first = Raw::connect(&daemon.socket);
    // Until the connections of the waits above are gone, this user has more than one.
    let start = std::time::Instant::now();
    while stats(&mut first)["connections"]["open"] != 1 {
        assert!(
            start.elapsed() < common::pool::PATIENCE,
            "earlier connections still open"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut second = Raw::connect(&daemon.socket);
    assert_eq!(stats(&mut second)["ok"], true);
    let reply = Raw::connect(&daemon.socket).reply();
    assert!(refused(&reply, "too_many_connections"), "{reply:?}");
    let message = reply.unwrap()["message"].to_string();
    assert!(
        message.contains("user 0 ") && message.contains("--max-connections-per-uid"),
        "{message}"
    );
    let c = &stats(&mut first)["connections"];
    assert_eq!(
        (c["refused_per_uid"].as_u64(), c["refused_per_pid"].as_u64()),
        (Some(1), Some(0)),
        "{c}"
    );
    let addr = zeronce_daemon::endpoint::MetricsAddr::Unix(metrics.clone());
    let page = zeronce_daemon::endpoint::scrape(&addr).expect("the metrics page");
    let m = zeronce_daemon::prometheus::parse(&page).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        m["zeronce_pool_refused_per_user_connections_total"], 1.0,
        "{page}"
    );
    // A slot given back is this user's again.
    drop(second);
    daemon.wait_for(|d| d.client().stats().is_ok(), "a slot for this user");
}

/// The token `zeronce pool take` prints on stderr.
fn printed_token(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let token = text
        .split_whitespace()
        .skip_while(|w| *w != "token")
        .nth(1)
        .map(|t| t.trim_end_matches(':').to_owned());
    token.unwrap_or_else(|| panic!("no token in {text}"))
}

#[test]
#[ignore = "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M and root (setpriv); .ci/run runs it so"]
fn a_token_returns_a_file_only_for_the_user_that_took_it() {
    let args = ["--socket-mode", "0666", "--allow-uid", "65534"];
    let mut daemon = Daemon::start_with("tokenuid", &args);
    daemon.wait_idle();
    // Taken by this (root's) connection; its token leaks to user nobody.
    let mut taker = Raw::connect(&daemon.socket);
    let taken: Value = taker.request(&take(PAGE)).expect("a take reply");
    let (path, token) = (
        taken["path"].as_str().unwrap(),
        taken["token"].as_str().unwrap(),
    );
    let out = pool_as_nobody(&["return", path, "--token", token], &daemon.socket);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("another client"),
        "{out:?}"
    );
    let s = daemon.stats();
    assert_eq!(s["pages"]["in_use"], PAGES, "{s}");
    assert_eq!(counter(&s, "returns_refused"), 1, "{s}");
    // Root, from another connection, with the token: trusted.
    let mut other = Raw::connect(&daemon.socket);
    let reply = other.request(&json!({"op": "return", "path": path, "token": token}));
    assert_eq!(reply.unwrap()["ok"], true);
    daemon.wait_idle();
    // Taken by nobody, returned by nobody from another process with its token.
    let out = pool_as_nobody(
        &["take", "--size", &PAGE.to_string(), "--wait"],
        &daemon.socket,
    );
    assert!(out.status.success(), "{out:?}");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let token = printed_token(&out.stderr);
    let out = pool_as_nobody(&["return", &path, "--token", &token], &daemon.socket);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(counter(&daemon.stats(), "returns"), 2);
}
