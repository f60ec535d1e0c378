//! The daemon against each VMM's vhost-user opening sequence, message by message as the
//! VMM's source sends it (flags included: which messages ask for a reply), up to the
//! point where the guest's driver runs: crosvm
//! (`devices/src/virtio/vhost_user_frontend/mod.rs`: `VhostUserFrontend::new`,
//! `read_config`/`write_config`, `activate`) and QEMU's generic vhost-user device
//! (`hw/virtio/vhost-user-base.c` over `hw/virtio/vhost-user.c`'s
//! `vhost_user_backend_init` and `vhost_dev_init`), plus Linux `virtio_uml` re-sending
//! `SET_FEATURES` when the balloon driver drops `PAGE_POISON`. libkrun's and
//! cloud-hypervisor's (rust-vmm `vhost` front-ends): `rust_vmm_frontend_tests`.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use crate::protocol_tests::{
    ack, backend_channel, mem_table, reply, send, u64_payload, Daemon, GET_CONFIG, GET_FEATURES,
    GET_PROTOCOL_FEATURES, NEED_REPLY, SET_FEATURES, SET_OWNER, SET_PROTOCOL_FEATURES,
};
use crate::restart_tests::SET_VRING_NUM;
use crate::wire;

pub(crate) const GET_QUEUE_NUM: u32 = 17;
pub(crate) const SET_CONFIG: u32 = 25;

// Protocol feature bits.
pub(crate) const MQ: u64 = 1 << 0;
pub(crate) const REPLY_ACK: u64 = 1 << 3;
pub(crate) const BACKEND_REQ: u64 = 1 << 5;
pub(crate) const CONFIG: u64 = 1 << 9;
pub(crate) const RESET_DEVICE: u64 = 1 << 13;
pub(crate) const CONFIGURE_MEM_SLOTS: u64 = 1 << 15;
pub(crate) const STATUS: u64 = 1 << 16;
const DEVICE_STATE: u64 = 1 << 19;
const SHMEM: u64 = 1 << 22;

// Virtio feature bits.
pub(crate) const MUST_TELL_HOST: u64 = 1 << 0;
pub(crate) const STATS_VQ: u64 = 1 << 1;
pub(crate) const PAGE_POISON: u64 = 1 << 4;
pub(crate) const REPORTING: u64 = 1 << 5;
pub(crate) const VERSION_1: u64 = 1 << 32;
pub(crate) const PROTOCOL_FEATURES: u64 = 1 << 30;

/// `VHOST_USER_CONFIG_WRITABLE`: crosvm's flag on `GET_CONFIG`.
pub(crate) const CONFIG_WRITABLE: u32 = 1;
const POISON: u32 = 0xaaaa_aaaa;

pub(crate) fn get_u64(s: &UnixStream, request: u32) -> u64 {
    send(s, request, 0, &[], &[]);
    u64::from_le_bytes(reply(s, request)[..8].try_into().unwrap())
}

pub(crate) fn config_msg(offset: u32, flags: u32, data: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [offset, data.len() as u32, flags] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.extend_from_slice(data);
    p
}

/// `GET_CONFIG` of `size` bytes at `offset`: the bytes the back-end answers.
pub(crate) fn get_config(s: &UnixStream, offset: u32, size: usize, flags: u32) -> Vec<u8> {
    send(
        s,
        GET_CONFIG,
        0,
        &config_msg(offset, flags, &vec![0; size]),
        &[],
    );
    let r = reply(s, GET_CONFIG);
    assert_eq!(r.len(), 12 + size, "GET_CONFIG answered {} bytes", r.len());
    r[12..].to_vec()
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub(crate) fn memfd(size: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, size).unwrap();
    fd
}

/// DRIVER_OK in crosvm and QEMU: SET_FEATURES (the guest's features and bit 30) without
/// a reply; the guest's features.
fn driver_ok(s: &UnixStream) -> u64 {
    let acked = MUST_TELL_HOST | STATS_VQ | PAGE_POISON | REPORTING | VERSION_1;
    send(
        s,
        SET_FEATURES,
        0,
        &u64_payload(acked | PROTOCOL_FEATURES),
        &[],
    );
    acked
}

fn vring_state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

/// crosvm `--vhost-user balloon,socket=PATH`: `VhostUserFrontend::new` sends SET_OWNER,
/// GET_FEATURES, GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES (what it allows of what is
/// offered), SET_BACKEND_REQ_FD, and GET_QUEUE_NUM only if MQ was negotiated (else the
/// device gets `min_queues()`, 2 for a balloon: a guest that negotiates stats or
/// reporting then finds no queue 2). No request asks for a reply (crosvm negotiates
/// REPLY_ACK only for back-end requests). The guest's config accesses are forwarded as
/// they come (`read_config`: GET_CONFIG of the access with WRITABLE; `write_config`:
/// SET_CONFIG of the access); at DRIVER_OK `activate` sends SET_FEATURES (the guest's
/// features and bit 30), SET_MEM_TABLE, then per queue SET_VRING_NUM, _ADDR, _BASE,
/// _CALL, _KICK and SET_VRING_ENABLE.
#[test]
fn crosvm_gets_every_queue_and_keeps_the_guests_poison() {
    let d = Daemon::start("crosvm");
    let s = UnixStream::connect(&d.socket).unwrap();
    send(&s, SET_OWNER, 0, &[], &[]);
    let offered = get_u64(&s, GET_FEATURES);
    assert_ne!(offered & PROTOCOL_FEATURES, 0);
    assert_ne!(
        offered & PAGE_POISON,
        0,
        "PAGE_POISON offered: {offered:#x}"
    );
    let allowed = CONFIG | MQ | BACKEND_REQ | DEVICE_STATE | SHMEM | REPLY_ACK;
    let proto = get_u64(&s, GET_PROTOCOL_FEATURES) & allowed;
    assert_ne!(proto & MQ, 0, "MQ offered (protocol features {proto:#x})");
    send(&s, SET_PROTOCOL_FEATURES, 0, &u64_payload(proto), &[]);
    let (_ours, theirs) = UnixStream::pair().unwrap();
    send(
        &s,
        wire::SET_BACKEND_REQ_FD,
        0,
        &[],
        &[OwnedFd::from(theirs)],
    );
    assert_eq!(
        get_u64(&s, GET_QUEUE_NUM),
        4,
        "inflate, deflate, stats, reporting: what the offered features imply"
    );

    // The guest's driver: reads num_pages, then (init, before DRIVER_OK) writes
    // poison_val, 4 bytes at offset 12.
    assert_eq!(le32(&get_config(&s, 0, 4, CONFIG_WRITABLE), 0), 0);
    send(
        &s,
        SET_CONFIG,
        0,
        &config_msg(12, 0, &POISON.to_le_bytes()),
        &[],
    );
    // DRIVER_OK: activate.
    let acked = driver_ok(&s);
    let size = 4 << 20;
    send(
        &s,
        wire::SET_MEM_TABLE,
        0,
        &mem_table(size, 1),
        &[memfd(size)],
    );
    send(&s, SET_VRING_NUM, 0, &vring_state(0, 256), &[]);
    assert_eq!(
        le32(&get_config(&s, 12, 4, CONFIG_WRITABLE), 0),
        POISON,
        "the poison written before SET_FEATURES survives it"
    );
    let status = crate::control::request(&d.control, &serde_json::json!({"op": "status"})).unwrap();
    assert_eq!(status["features"], acked, "{status}");
}

/// QEMU ≥ 10.2 `-device vhost-user-test-device-pci,chardev=…,virtio-id=5,num_vqs=4,
/// config_size=16`: `vhost_user_backend_init` sends GET_FEATURES, GET_PROTOCOL_FEATURES,
/// SET_PROTOCOL_FEATURES (offered ∩ QEMU's mask; CONFIG kept since config_size is set),
/// GET_QUEUE_NUM if MQ, GET_MAX_MEM_SLOTS if CONFIGURE_MEM_SLOTS, SET_BACKEND_REQ_FD with
/// NEED_REPLY (REPLY_ACK); then `vhost_dev_init` SET_OWNER and GET_FEATURES again.
/// `vub_get_config` reads the whole config space (offset 0, config_size, flags 0);
/// `vub_set_config` forwards a guest write as the whole space at offset 0, as QEMU last
/// read it, asking for a reply (REPLY_ACK); `vub_start` (DRIVER_OK) sends SET_FEATURES
/// with bit 30.
#[test]
fn qemu_vhost_user_base_whole_space_config_writes_reach_the_device() {
    let d = Daemon::start("qemu");
    crate::control::request(&d.control, &serde_json::json!({"op": "set", "pages": 256})).unwrap();
    let s = UnixStream::connect(&d.socket).unwrap();
    let offered = get_u64(&s, GET_FEATURES);
    assert_ne!(offered & PROTOCOL_FEATURES, 0);
    let mask = MQ | REPLY_ACK | BACKEND_REQ | CONFIG | RESET_DEVICE | CONFIGURE_MEM_SLOTS | STATUS;
    let proto = get_u64(&s, GET_PROTOCOL_FEATURES) & mask;
    assert_ne!(proto & CONFIG, 0, "QEMU refuses a back-end without CONFIG");
    send(&s, SET_PROTOCOL_FEATURES, 0, &u64_payload(proto), &[]);
    if proto & MQ != 0 {
        assert_eq!(get_u64(&s, GET_QUEUE_NUM), 4, "num_vqs=4 fits");
    }
    if proto & CONFIGURE_MEM_SLOTS != 0 {
        // Its regions then come as ADD_MEM_REG (memslot_tests).
        assert_eq!(
            get_u64(&s, wire::GET_MAX_MEM_SLOTS),
            509,
            "the default bound"
        );
    }
    let _ours = backend_channel(&s);
    send(&s, SET_OWNER, 0, &[], &[]);
    assert_eq!(get_u64(&s, GET_FEATURES), offered);

    // The guest writes poison_val before any config read: QEMU forwards its zeroed copy
    // of the space with the poison in it (num_pages 0 there, 256 in the device).
    let mut space = [0u8; 16];
    space[12..].copy_from_slice(&POISON.to_le_bytes());
    // vhost_user_set_config asks for a reply when REPLY_ACK is negotiated.
    send(&s, SET_CONFIG, NEED_REPLY, &config_msg(0, 0, &space), &[]);
    assert_eq!(ack(&s, SET_CONFIG), 0, "the whole-space write is accepted");
    let c = get_config(&s, 0, 16, 0);
    assert_eq!(le32(&c, 12), POISON, "the poison arrived");
    assert_eq!(le32(&c, 0), 256, "the device's own target is kept");
    driver_ok(&s);
    assert_eq!(le32(&get_config(&s, 0, 16, 0), 12), POISON);
}

/// Linux `virtio_uml` (6.1), guest without poisoning or init_on_free (the message order
/// traced from the real guest): the balloon driver's `validate` drops PAGE_POISON, the
/// virtio core finalizes the features again, and `vu_finalize_features` then sends a
/// second SET_FEATURES without bit 30; having dropped it, it sends no SET_VRING_ENABLE
/// either (rings start enabled, as the specification says without bit 30). The
/// device must take the second set as the negotiated one.
#[test]
fn virtio_uml_resending_set_features_without_page_poison_and_bit_30() {
    let d = Daemon::start("uml2");
    let s = UnixStream::connect(&d.socket).unwrap();
    send(&s, SET_OWNER, 0, &[], &[]);
    let offered = get_u64(&s, GET_FEATURES);
    assert_ne!(
        offered & PAGE_POISON,
        0,
        "PAGE_POISON offered: {offered:#x}"
    );
    let proto = get_u64(&s, GET_PROTOCOL_FEATURES) & (REPLY_ACK | BACKEND_REQ | CONFIG);
    send(
        &s,
        SET_PROTOCOL_FEATURES,
        NEED_REPLY,
        &u64_payload(proto),
        &[],
    );
    assert_eq!(ack(&s, SET_PROTOCOL_FEATURES), 0);
    let all = MUST_TELL_HOST | STATS_VQ | REPORTING | VERSION_1;
    for features in [all | PAGE_POISON | PROTOCOL_FEATURES, all] {
        send(&s, SET_FEATURES, NEED_REPLY, &u64_payload(features), &[]);
        assert_eq!(ack(&s, SET_FEATURES), 0);
    }
    let size = 4 << 20;
    send(
        &s,
        wire::SET_MEM_TABLE,
        NEED_REPLY,
        &mem_table(size, 1),
        &[memfd(size)],
    );
    assert_eq!(ack(&s, wire::SET_MEM_TABLE), 0);
    send(&s, SET_VRING_NUM, NEED_REPLY, &vring_state(0, 256), &[]);
    assert_eq!(ack(&s, SET_VRING_NUM), 0);
    let status = crate::control::request(&d.control, &serde_json::json!({"op": "status"})).unwrap();
    assert_eq!(
        status["features"], all,
        "the second set is the negotiated one"
    );
}

/// `RESET_DEVICE` (QEMU's `vhost_user_reset_device` when the back-end offers it; in
/// place of `RESET_OWNER`) is a device reset: the negotiated features and the
/// driver-written config fields go, the operator's target stays, and the connection
/// keeps being served.
#[test]
fn reset_device_clears_the_drivers_state_and_keeps_the_target() {
    const RESET_DEVICE_MSG: u32 = 34;
    let d = Daemon::start("reset");
    crate::control::request(&d.control, &serde_json::json!({"op": "set", "pages": 64})).unwrap();
    let s = UnixStream::connect(&d.socket).unwrap();
    send(&s, SET_OWNER, 0, &[], &[]);
    get_u64(&s, GET_FEATURES);
    let proto = get_u64(&s, GET_PROTOCOL_FEATURES);
    assert_ne!(proto & RESET_DEVICE, 0, "RESET_DEVICE offered: {proto:#x}");
    let proto = REPLY_ACK | CONFIG | RESET_DEVICE;
    send(&s, SET_PROTOCOL_FEATURES, 0, &u64_payload(proto), &[]);
    driver_ok(&s);
    send(
        &s,
        SET_CONFIG,
        NEED_REPLY,
        &config_msg(12, 0, &POISON.to_le_bytes()),
        &[],
    );
    assert_eq!(ack(&s, SET_CONFIG), 0);
    send(&s, RESET_DEVICE_MSG, NEED_REPLY, &[], &[]);
    assert_eq!(ack(&s, RESET_DEVICE_MSG), 0);
    let c = get_config(&s, 0, 16, 0);
    assert_eq!(
        (le32(&c, 0), le32(&c, 12)),
        (64, 0),
        "target kept, poison cleared"
    );
    let status = crate::control::request(&d.control, &serde_json::json!({"op": "status"})).unwrap();
    assert_eq!(status["features"], serde_json::Value::Null, "{status}");
    driver_ok(&s);
    assert_eq!(le32(&get_config(&s, 0, 4, 0), 0), 64, "still served");
}
