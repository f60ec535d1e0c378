//! The daemon against clients that misbehave (issue 20): a client that connects and
//! sends nothing, or one byte, does not keep the next front-end waiting; a memory region
//! larger than its file is refused at `SET_MEM_TABLE` (a ring in it would be a SIGBUS);
//! the control socket answers bytes that are not UTF-8 and bounds its connections.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::protocol_tests::{
    ack, handshake, reply, send, uml_mem_table, Daemon, GET_FEATURES, NEED_REPLY, SET_OWNER,
};
use crate::relay::recv_message;
use crate::wire;

/// "Is it served at all": far above the daemon's handshake timeout (500 ms here).
const SERVED_WITHIN: Duration = Duration::from_secs(30);

fn frontend(d: &Daemon) -> UnixStream {
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(SERVED_WITHIN)).unwrap();
    s
}

fn get_features(s: &UnixStream) {
    send(s, SET_OWNER, 0, &[], &[]);
    send(s, GET_FEATURES, 0, &[], &[]);
    assert_eq!(reply(s, GET_FEATURES).len(), 8, "GET_FEATURES answered");
}

#[test]
fn silent_and_one_byte_clients_do_not_keep_the_next_front_end_waiting() {
    let d = Daemon::start("idle");
    let _silent = UnixStream::connect(&d.socket).unwrap();
    let one_byte = UnixStream::connect(&d.socket).unwrap();
    (&one_byte).write_all(&[1]).unwrap();
    // A header, then only part of its payload.
    let partial = UnixStream::connect(&d.socket).unwrap();
    let h = wire::Header {
        request: 2,
        flags: wire::VERSION_1,
        size: 8,
    };
    (&partial).write_all(&h.encode()).unwrap();
    (&partial).write_all(&[0; 3]).unwrap();
    // All three stay connected; the real front-end is served once each timed out.
    let s = frontend(&d);
    get_features(&s);
    assert!(
        d.hub.rejected() >= 2,
        "the silent ones are counted as refused"
    );
}

#[test]
fn a_region_larger_than_its_file_is_refused_and_the_daemon_serves_on() {
    let d = Daemon::start("sigbus");
    let s = frontend(&d);
    let _channel = handshake(&s);
    let memfd: OwnedFd =
        rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    // The region says 4 MiB; the file has 1 MiB. A ring past 1 MiB would be a SIGBUS.
    rustix::fs::ftruncate(&memfd, 1 << 20).unwrap();
    send(
        &s,
        wire::SET_MEM_TABLE,
        NEED_REPLY,
        &uml_mem_table(4 << 20),
        &[memfd],
    );
    assert_ne!(ack(&s, wire::SET_MEM_TABLE), 0, "refused");
    assert!(
        recv_message(&s).map_or(true, |m| m.is_none()),
        "and the connection closed"
    );
    let s = frontend(&d);
    get_features(&s);
}

fn control(d: &Daemon) -> (UnixStream, BufReader<UnixStream>) {
    let s = UnixStream::connect(&d.control).unwrap();
    s.set_read_timeout(Some(SERVED_WITHIN)).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn answer(r: &mut BufReader<UnixStream>) -> serde_json::Value {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn the_control_socket_answers_bad_bytes_and_bounds_its_connections() {
    let d = Daemon::start("ctl-hostile");
    let (mut s, mut r) = control(&d);
    s.write_all(b"\xff\xfe{\"op\"\n").unwrap();
    let a = answer(&mut r);
    assert_eq!(a["ok"], false);
    assert!(a["error"].as_str().unwrap().contains("UTF-8"), "{a}");
    s.write_all(b"{\"op\":\"status\"}\n").unwrap();
    assert_eq!(answer(&mut r)["ok"], true, "the connection stays usable");
    drop((s, r));

    let before = threads();
    let max = crate::Limits::default().control_connections;
    let mut held = Vec::new();
    for _ in 0..max {
        let (s, mut r) = control(&d);
        (&s).write_all(b"{\"op\":\"status\"}\n").unwrap();
        assert_eq!(answer(&mut r)["ok"], true);
        held.push((s, r));
    }
    for _ in 0..50 {
        let (_s, mut r) = control(&d);
        let a = answer(&mut r);
        assert_eq!(a["ok"], false);
        assert!(a["error"].as_str().unwrap().contains("too many"), "{a}");
    }
    assert!(
        threads() <= before + max + 1,
        "{} threads for {max} clients (before: {before})",
        threads()
    );
    drop(held);
}
