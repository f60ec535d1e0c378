//! Memory hot-plug over vhost-user (`CONFIGURE_MEM_SLOTS`), message by message as QEMU
//! sends it (`hw/virtio/vhost-user.c`): `vhost_user_backend_init` asks
//! `GET_MAX_MEM_SLOTS` when the back-end offers the feature, and from then on
//! `vhost_user_set_mem_table` sends no `SET_MEM_TABLE` but `vhost_user_add_remove_regions`:
//! one `REM_MEM_REG` per region gone (no file descriptor, `mmap_offset` 0), then one
//! `ADD_MEM_REG` per new region (its file descriptor), each asking for a reply when
//! `REPLY_ACK` is negotiated. The device's view of guest memory follows: a report into
//! an added region is discarded, one into a removed region is refused (typed, counted),
//! and the queue keeps serving.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use serde_json::{json, Value};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};
use zeronce_balloon::guest_ring::DriverBuf;

use crate::protocol_tests::{
    ack, backend_channel, recv_or_closed, send, u64_payload, Daemon, GET_FEATURES,
    GET_PROTOCOL_FEATURES, NEED_REPLY, SET_FEATURES, SET_OWNER, SET_PROTOCOL_FEATURES,
};
use crate::restart_tests::{start_rings, VA_BASE};
use crate::vmm_tests::{
    get_u64, memfd, BACKEND_REQ, CONFIG, CONFIGURE_MEM_SLOTS, GET_QUEUE_NUM, MQ, PROTOCOL_FEATURES,
    REPLY_ACK, RESET_DEVICE, STATUS,
};
use crate::wire;

const MIB: u64 = 1 << 20;
/// The hot-plugged region: 2 MiB at guest address 1 GiB.
const PLUGGED: u64 = 1 << 30;
const PLUGGED_SIZE: u64 = 2 * MIB;
const BOOT_SIZE: u64 = 4 * MIB;

/// `struct VhostUserMemRegMsg`: a u64 of padding, then the region.
fn mem_reg(gpa: u64, size: u64, mmap_offset: u64) -> Vec<u8> {
    let mut p = vec![0u8; 8];
    for v in [gpa, size, VA_BASE + gpa, mmap_offset] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

/// `send_add_regions`: ADD_MEM_REG with the region's file descriptor; the ack.
fn add_region(s: &UnixStream, gpa: u64, size: u64, fd: &OwnedFd) -> u64 {
    let fd = fd.try_clone().unwrap();
    send(
        s,
        wire::ADD_MEM_REG,
        NEED_REPLY,
        &mem_reg(gpa, size, 0),
        &[fd],
    );
    ack(s, wire::ADD_MEM_REG)
}

/// `send_remove_regions`: REM_MEM_REG, no file descriptor, `mmap_offset` 0; the ack.
fn remove_region(s: &UnixStream, gpa: u64, size: u64) -> u64 {
    send(
        s,
        wire::REM_MEM_REG,
        NEED_REPLY,
        &mem_reg(gpa, size, 0),
        &[],
    );
    ack(s, wire::REM_MEM_REG)
}

/// `vhost_user_backend_init` with QEMU's protocol mask, then `vhost_dev_init`'s
/// SET_OWNER and GET_FEATURES: the slot bound the back-end announced.
fn qemu_init(s: &UnixStream) -> u64 {
    let offered = get_u64(s, GET_FEATURES);
    assert_ne!(offered & PROTOCOL_FEATURES, 0);
    let mask = MQ | REPLY_ACK | BACKEND_REQ | CONFIG | RESET_DEVICE | CONFIGURE_MEM_SLOTS | STATUS;
    let proto = get_u64(s, GET_PROTOCOL_FEATURES) & mask;
    assert_ne!(
        proto & CONFIGURE_MEM_SLOTS,
        0,
        "CONFIGURE_MEM_SLOTS offered (protocol features {proto:#x})"
    );
    send(s, SET_PROTOCOL_FEATURES, 0, &u64_payload(proto), &[]);
    assert_eq!(get_u64(s, GET_QUEUE_NUM), 4);
    let slots = get_u64(s, wire::GET_MAX_MEM_SLOTS);
    let _ours = backend_channel(s);
    send(s, SET_OWNER, 0, &[], &[]);
    assert_eq!(get_u64(s, GET_FEATURES), offered);
    slots
}

/// 512-byte blocks the file holds.
fn blocks(fd: &OwnedFd) -> u64 {
    rustix::fs::fstat(fd.as_fd()).unwrap().st_blocks as u64
}

fn status(d: &Daemon) -> Value {
    crate::control::request(&d.control, &json!({"op": "status"})).unwrap()
}

#[test]
fn qemu_hot_plug_regions_one_by_one_and_the_device_follows() {
    let d = Daemon::start("memslots");
    let s = UnixStream::connect(&d.socket).unwrap();
    assert_eq!(qemu_init(&s), 509, "the default bound");

    // vhost_dev_start: SET_FEATURES (reporting: rings 0, 1 and 2), then the memory as
    // ADD_MEM_REG, one region at a time: boot RAM, and a DIMM plugged at 1 GiB.
    let features = (1u64 << 32) | (1 << 5) | PROTOCOL_FEATURES;
    send(&s, SET_FEATURES, 0, &u64_payload(features), &[]);
    let (boot, dimm) = (memfd(BOOT_SIZE), memfd(PLUGGED_SIZE));
    assert_eq!(add_region(&s, 0, BOOT_SIZE, &boot), 0);
    assert_eq!(add_region(&s, PLUGGED, PLUGGED_SIZE, &dimm), 0);
    let file = |fd: &OwnedFd| Some(FileOffset::new(fd.try_clone().unwrap().into(), 0));
    let mem = GuestMemoryMmap::<()>::from_ranges_with_files([
        (GuestAddress(0), BOOT_SIZE as usize, file(&boot)),
        (GuestAddress(PLUGGED), PLUGGED_SIZE as usize, file(&dimm)),
    ])
    .unwrap();
    let mut rings = start_rings(&s, &mem, 3);

    // A report into the plugged region is discarded: the DIMM's file gives its blocks back.
    let report = [DriverBuf::write(PLUGGED, MIB as u32)];
    mem.write_slice(&[0xa5; MIB as usize], GuestAddress(PLUGGED))
        .unwrap();
    let written = blocks(&dimm);
    assert!(written >= MIB / 512, "{written} blocks written");
    rings[2].roundtrip(&mem, &report);
    assert!(
        blocks(&dimm) <= written - MIB / 512,
        "{} blocks left of {written}",
        blocks(&dimm)
    );
    let st = status(&d);
    assert_eq!(st["metrics"]["bytes_discarded"], MIB, "{st}");

    // The DIMM is unplugged: a report into it now is refused, not a discard into memory
    // the daemon no longer maps, and the daemon goes on serving.
    assert_eq!(remove_region(&s, PLUGGED, PLUGGED_SIZE), 0);
    mem.write_slice(&[0x5a; MIB as usize], GuestAddress(PLUGGED))
        .unwrap();
    let refilled = blocks(&dimm);
    assert_eq!(rings[2].roundtrip(&mem, &report), 0, "refused: used_len 0");
    assert_eq!(blocks(&dimm), refilled, "nothing discarded");
    let st = status(&d);
    assert_eq!(st["metrics"]["bytes_discarded"], MIB, "{st}");
    assert_eq!(st["metrics"]["malformed"], 1, "the report is counted: {st}");

    // Plugged again: served again.
    assert_eq!(add_region(&s, PLUGGED, PLUGGED_SIZE, &dimm), 0);
    rings[2].roundtrip(&mem, &report);
    let st = status(&d);
    assert_eq!(st["metrics"]["bytes_discarded"], 2 * MIB, "{st}");
    assert!(blocks(&dimm) <= refilled - MIB / 512);
}

#[test]
fn regions_past_the_slot_bound_or_past_their_file_are_refused() {
    let d = Daemon::start_custom("memslots-bound", |c| c.limits.mem_slots = 1);
    let s = UnixStream::connect(&d.socket).unwrap();
    assert_eq!(qemu_init(&s), 1, "the configured bound");
    let (boot, dimm) = (memfd(BOOT_SIZE), memfd(PLUGGED_SIZE));
    assert_eq!(add_region(&s, 0, BOOT_SIZE, &boot), 0);
    assert_eq!(
        add_region(&s, PLUGGED, PLUGGED_SIZE, &dimm),
        1,
        "past the bound"
    );
    assert!(
        recv_or_closed(&s),
        "the connection is closed after a refusal"
    );

    // The next front-end: a region larger than its file is refused as SET_MEM_TABLE's
    // would be (the same check): mapped, its tail would kill the daemon with SIGBUS.
    let s = UnixStream::connect(&d.socket).unwrap();
    qemu_init(&s);
    let short = memfd(MIB);
    assert_eq!(
        add_region(&s, 0, BOOT_SIZE, &short),
        1,
        "larger than its file"
    );
    assert!(recv_or_closed(&s));
    let s = UnixStream::connect(&d.socket).unwrap();
    qemu_init(&s);
    assert_eq!(add_region(&s, 0, BOOT_SIZE, &boot), 0, "still serving");
    assert_eq!(status(&d)["connections"], 3);
}
