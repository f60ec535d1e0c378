//! Free page hinting end to end over vhost-user, with a scripted guest on real rings in a
//! memfd: the operator's `zeronce balloon hint` (the control request the CLI sends), the
//! new `free_page_hint_cmd_id` announced by `CONFIG_CHANGE_MSG` and read through
//! `GET_CONFIG`, the guest's command id, hint buffers and STOP on free_page_vq (Linux
//! `virtio_balloon_report_free_page`: `send_cmd_id_start`, `send_free_pages`,
//! `send_cmd_id_stop`), the discards (the memfd's blocks drop), DONE, and
//! `hint --status`; and a run whose guest goes silent, ended by the daemon's time limit.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::DriverBuf;
use zeronce_balloon::{BalloonOptions, FeatureOffer};

use crate::backing_tests::share_memory;
use crate::cli::{action_request, BalloonAction};
use crate::protocol_tests::{
    ack, backend_channel, send, u64_payload, Daemon, GET_FEATURES, GET_PROTOCOL_FEATURES,
    NEED_REPLY, SET_FEATURES, SET_OWNER, SET_PROTOCOL_FEATURES,
};
use crate::relay::recv_message;
use crate::restart_tests::{start_rings, Ring};
use crate::vmm_tests::{
    get_config, get_u64, le32, memfd, BACKEND_REQ, CONFIG, PROTOCOL_FEATURES, REPLY_ACK,
};
use crate::{wire, ServeConfig};

const FREE_PAGE_HINT: u64 = 1 << 3;
const VERSION_1: u64 = 1 << 32;
const SIZE: u64 = 8 << 20;
const MIB: u64 = 1 << 20;
/// The guest's command id buffer (`vb->cmd_id_active` / `cmd_id_stop`).
const CMD: u64 = 0x10_0000;
/// Where the guest's free pages are.
const FREE: u64 = 4 * MIB;
/// Offset of `free_page_hint_cmd_id` in the config space.
const CMD_ID_FIELD: usize = 8;
const CMD_ID_STOP: u32 = 0;
const CMD_ID_DONE: u32 = 1;
/// The free page queue: after inflate and deflate when stats are not negotiated.
const FREE_PAGE_VQ: usize = 2;

/// A daemon offering hinting, runs limited to `limit`.
fn hinting(name: &str, limit: Duration) -> Daemon {
    Daemon::start_custom(name, |c: &mut ServeConfig| {
        c.balloon = BalloonOptions {
            offer: FeatureOffer {
                free_page_hint: true,
                ..FeatureOffer::default()
            },
            ..BalloonOptions::default()
        };
        c.limits.hint_run = limit;
    })
}

/// What the operator's `zeronce balloon hint [--status]` gets.
fn hint(d: &Daemon, status: bool) -> Result<Value, crate::control::ControlError> {
    let req = action_request(&BalloonAction::Hint { status }).unwrap();
    crate::control::request(&d.control, &req)
}

/// A guest with the three rings of `VERSION_1 | FREE_PAGE_HINT` running, in a memfd it
/// maps too.
struct Guest {
    s: UnixStream,
    channel: UnixStream,
    mem: GuestMemoryMmap,
    file: File,
    rings: Vec<Ring>,
}

impl Guest {
    fn connect(d: &Daemon) -> Guest {
        let s = UnixStream::connect(&d.socket).unwrap();
        send(&s, SET_OWNER, 0, &[], &[]);
        let offered = get_u64(&s, GET_FEATURES);
        assert_ne!(offered & FREE_PAGE_HINT, 0, "FREE_PAGE_HINT offered");
        get_u64(&s, GET_PROTOCOL_FEATURES);
        let proto = REPLY_ACK | BACKEND_REQ | CONFIG;
        send(&s, SET_PROTOCOL_FEATURES, 0, &u64_payload(proto), &[]);
        let channel = backend_channel(&s);
        channel
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let features = VERSION_1 | FREE_PAGE_HINT | PROTOCOL_FEATURES;
        send(&s, SET_FEATURES, NEED_REPLY, &u64_payload(features), &[]);
        assert_eq!(ack(&s, SET_FEATURES), 0);
        let file = File::from(memfd(SIZE));
        let mem = share_memory(&s, &file, NEED_REPLY);
        let rings = start_rings(&s, &mem, 3);
        Guest {
            s,
            channel,
            mem,
            file,
            rings,
        }
    }

    /// The guest's config interrupt: one `CONFIG_CHANGE_MSG`, then the guest reads
    /// `free_page_hint_cmd_id`.
    fn config_change(&self) -> u32 {
        let m = recv_message(&self.channel)
            .expect("CONFIG_CHANGE_MSG in time")
            .expect("CONFIG_CHANGE_MSG");
        assert_eq!(m.header.request, wire::BACKEND_CONFIG_CHANGE_MSG);
        self.cmd_id()
    }

    fn cmd_id(&self) -> u32 {
        le32(&get_config(&self.s, 0, 16, 0), CMD_ID_FIELD)
    }

    /// An output buffer with a command id on free_page_vq.
    fn send_cmd_id(&mut self, id: u32) {
        self.mem.write_obj(id.to_le(), GuestAddress(CMD)).unwrap();
        let used = self.rings[FREE_PAGE_VQ].roundtrip(&self.mem, &[DriverBuf::read(CMD, 4)]);
        assert_eq!(used, 0);
    }

    /// One free block as an input buffer on free_page_vq.
    fn hint_block(&mut self, gpa: u64, len: u64) {
        let bufs = [DriverBuf::write(gpa, len as u32)];
        assert_eq!(self.rings[FREE_PAGE_VQ].roundtrip(&self.mem, &bufs), 0);
    }

    /// 512-byte blocks its memory file holds.
    fn blocks(&self) -> u64 {
        rustix::fs::fstat(self.file.as_fd()).unwrap().st_blocks as u64
    }
}

#[test]
fn a_hint_run_discards_the_guests_free_pages_and_reports_them() {
    let d = hinting("hint", Duration::from_secs(600));
    let mut g = Guest::connect(&d);
    assert_eq!(hint(&d, true).unwrap()["state"], "idle");

    let started = hint(&d, false).unwrap();
    let id = started["cmd_id"].as_u64().unwrap() as u32;
    assert!(id >= 2, "{started}");
    assert_eq!(g.config_change(), id, "the guest sees the new command id");
    let again = hint(&d, false).unwrap_err().to_string();
    assert!(
        again.contains("still running") && again.contains(&format!("cmd_id {id}")),
        "a second run while one runs: {again}"
    );
    assert_eq!(hint(&d, true).unwrap()["state"], "running");

    g.send_cmd_id(id);
    // The guest's free pages held data (its freed page cache, say).
    g.mem
        .write_slice(&[0xa5; MIB as usize], GuestAddress(FREE))
        .unwrap();
    let written = g.blocks();
    assert!(written >= MIB / 512, "{written} blocks");
    g.hint_block(FREE, MIB / 2);
    g.hint_block(FREE + MIB / 2, MIB / 2);
    assert!(
        g.blocks() <= written - MIB / 512,
        "{} blocks left of {written}",
        g.blocks()
    );
    g.send_cmd_id(CMD_ID_STOP);
    assert_eq!(
        g.config_change(),
        CMD_ID_DONE,
        "DONE after the guest's STOP"
    );

    let st = hint(&d, true).unwrap();
    assert_eq!(st["state"], "done", "{st}");
    assert_eq!(st["cmd_id"], id);
    assert_eq!(st["acknowledged"], true);
    assert_eq!(st["pages_hinted"], MIB / 4096);
    assert_eq!(st["bytes_discarded"], MIB);
    let next = hint(&d, false).unwrap();
    assert_ne!(next["cmd_id"], id, "a new run after DONE");
}

#[test]
fn a_run_whose_guest_goes_silent_ends_with_stop_and_says_it_timed_out() {
    let d = hinting("hint-timeout", Duration::from_millis(200));
    let mut g = Guest::connect(&d);
    let started = hint(&d, false).unwrap();
    assert_eq!(started["timeout_ms"], 200, "{started}");
    let id = started["cmd_id"].as_u64().unwrap() as u32;
    // The run's announcement (on a loaded machine the guest may read the field after
    // the timeout already set STOP: what it reads is not the point here).
    g.config_change();
    // The guest starts hinting, then never sends its STOP.
    g.send_cmd_id(id);
    let t0 = Instant::now();
    let st = loop {
        let st = hint(&d, true).unwrap();
        if st["state"] != "running" {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the run did not end: {st}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st["state"], "timed_out", "{st}");
    assert_eq!(st["acknowledged"], true);
    assert_eq!(g.config_change(), CMD_ID_STOP, "the device sends STOP");
    // A block the guest still sends is not discarded; its late STOP gets DONE, so it
    // gives its hinted pages back.
    g.mem
        .write_slice(&[0xa5; MIB as usize], GuestAddress(FREE))
        .unwrap();
    let written = g.blocks();
    g.hint_block(FREE, MIB);
    assert_eq!(g.blocks(), written, "nothing discarded after the timeout");
    g.send_cmd_id(CMD_ID_STOP);
    assert_eq!(g.config_change(), CMD_ID_DONE);
    let st = hint(&d, true).unwrap();
    assert_eq!(
        (st["pages_hinted"].as_u64(), st["state"].as_str()),
        (Some(0), Some("timed_out"))
    );
    let next = hint(&d, false).unwrap();
    assert_ne!(next["cmd_id"], id, "a new run can start");
}
