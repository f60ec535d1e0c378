//! The daemon against the two VMMs whose vhost-user front-end is rust-vmm `vhost`'s
//! `Frontend`, each replaying the VMM's opening sequence message by message as its
//! source sends it (flags included), then driving the device as the guest's Linux
//! driver does: libkrun (`src/devices/src/virtio/vhost_user/device.rs`:
//! `VhostUserDevice::new`, `read_config`/`write_config`, `activate_vhost_user`) and
//! cloud-hypervisor's `--generic-vhost-user` (`virtio-devices/src/vhost_user/
//! generic_vhost_user.rs`: `GenericVhostUser::new`, over `vu_common_ctrl.rs`'s
//! `connect_vhost_user`, `negotiate_features_vhost_user` and `setup_vhost_user`).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use serde_json::json;
use vm_memory::{Bytes, GuestAddress};
use zeronce_balloon::guest_ring::DriverBuf;
use zeronce_mem::file_allocated_bytes;

use crate::backing_tests::{memfd, share_memory, status, BLOCK};
use crate::protocol_tests::{
    ack, backend_channel, reply, send, u64_payload, Daemon, GET_CONFIG, GET_FEATURES,
    GET_PROTOCOL_FEATURES, NEED_REPLY, SET_FEATURES, SET_OWNER, SET_PROTOCOL_FEATURES,
};
use crate::relay::recv_message;
use crate::restart_tests::{send_pfn, setup_ring, Ring, RingMsg};
use crate::vmm_tests::{
    config_msg, get_u64, le32, BACKEND_REQ, CONFIG, CONFIGURE_MEM_SLOTS, CONFIG_WRITABLE,
    GET_QUEUE_NUM, MQ, MUST_TELL_HOST, PAGE_POISON, PROTOCOL_FEATURES, REPLY_ACK, REPORTING,
    SET_CONFIG, STATS_VQ, VERSION_1,
};
use crate::wire;

/// `GET_CONFIG` of the 4 bytes at `offset` (one guest access), header `flags`: the value.
fn read_u32(s: &UnixStream, offset: u32, flags: u32) -> u32 {
    send(s, GET_CONFIG, flags, &config_msg(offset, 0, &[0; 4]), &[]);
    let r = reply(s, GET_CONFIG);
    assert_eq!(r.len(), 12 + 4, "GET_CONFIG answered {} bytes", r.len());
    le32(&r, 12)
}

/// libkrun's `VhostUserDevice::new` for `krun_add_vhost_user_device(…, num_queues, …)`:
/// GET_FEATURES, then (bit 30 offered) GET_PROTOCOL_FEATURES and SET_PROTOCOL_FEATURES
/// with CONFIG and MQ only (of what is offered), then GET_QUEUE_NUM only when the caller
/// passed 0 queues. No SET_OWNER yet (it comes at activation), no request asks for a
/// reply (no REPLY_ACK). The device's features (bit 30 removed) and its queues.
fn libkrun_connect(s: &UnixStream, num_queues: u16) -> (u64, u64) {
    let offered = get_u64(s, GET_FEATURES);
    assert_ne!(offered & PROTOCOL_FEATURES, 0, "bit 30: {offered:#x}");
    let proto = get_u64(s, GET_PROTOCOL_FEATURES);
    assert_eq!(
        proto & (CONFIG | MQ),
        CONFIG | MQ,
        "protocol features {proto:#x}"
    );
    send(s, SET_PROTOCOL_FEATURES, 0, &u64_payload(CONFIG | MQ), &[]);
    let queues = if num_queues == 0 {
        get_u64(s, GET_QUEUE_NUM)
    } else {
        u64::from(num_queues)
    };
    (offered & !PROTOCOL_FEATURES, queues)
}

/// libkrun with `krun_add_vhost_user_device(ctx, 5, path, "balloon", 4, {256, …})`, a
/// Linux guest booted with `init_on_free=1`. The guest's feature acknowledgement stays
/// in libkrun's MMIO transport (`ack_features_by_page`: no message); its config accesses
/// are forwarded one by one as they come (`read_config`: GET_CONFIG of the access,
/// flags 0; `write_config`: SET_CONFIG of the access, flags 0), the first ones before
/// DRIVER_OK (poison_val, 0 for `init_on_free=1`). At DRIVER_OK `activate_vhost_user`
/// sends SET_OWNER, SET_MEM_TABLE (its memfd-backed regions), SET_FEATURES (the guest's
/// features and bit 30), then per queue SET_VRING_NUM, _BASE 0, _ADDR, _KICK, _CALL (one
/// call eventfd for every queue) and SET_VRING_ENABLE. No SET_BACKEND_REQ_FD ever: a new
/// target cannot be announced, the guest sees it only when it reads `num_pages` again
/// (Linux's `towards_target`: at probe, after DRIVER_OK, and while it is still moving
/// towards a target; a settled guest does not read it again). The device must serve
/// every queue, discard a report in the memfd, and take a target without blocking or
/// failing for lack of a channel (a back-end that blocks there hangs this test until
/// the runner's timeout).
#[test]
fn libkrun_gets_every_queue_reports_discard_and_a_target_without_a_channel() {
    let d = Daemon::start("libkrun");
    let s = UnixStream::connect(&d.socket).unwrap();
    let (offered, queues) = libkrun_connect(&s, 4);
    let guest = MUST_TELL_HOST | STATS_VQ | PAGE_POISON | REPORTING | VERSION_1;
    assert_eq!(
        offered & guest,
        guest,
        "features pass through: {offered:#x}"
    );
    assert_eq!(queues, 4, "inflate, deflate, stats, reporting");

    // Probe, before DRIVER_OK: poison_val (offset 12) written, 0 for init_on_free=1.
    send(
        &s,
        SET_CONFIG,
        0,
        &config_msg(12, 0, &0u32.to_le_bytes()),
        &[],
    );

    // DRIVER_OK.
    send(&s, SET_OWNER, 0, &[], &[]);
    let file = memfd();
    let mem = share_memory(&s, &file, 0);
    send(
        &s,
        SET_FEATURES,
        0,
        &u64_payload(guest | PROTOCOL_FEATURES),
        &[],
    );
    let call = Ring::nth(&mem, 0).call;
    let mut rings: Vec<Ring> = (0..queues)
        .map(|i| Ring {
            call: call.try_clone().unwrap(),
            ..Ring::nth(&mem, i)
        })
        .collect();
    let order = [
        RingMsg::Num,
        RingMsg::Base,
        RingMsg::Addr,
        RingMsg::Kick,
        RingMsg::Call,
        RingMsg::Enable,
    ];
    for (i, r) in rings.iter().enumerate() {
        setup_ring(&s, i as u32, r, 0, &order, 0);
    }
    // towards_target: the first read after DRIVER_OK; its answer is also the sign that
    // every message before it was taken without a reply.
    assert_eq!(read_u32(&s, 0, 0), 0, "no target yet");
    let st = status(&d);
    assert_eq!(
        st["features"], guest,
        "the features SET_FEATURES carried: {st}"
    );

    // A free page report on queue 3 (its place with stats negotiated): discarded in the
    // memfd, then used.
    mem.write_slice(&vec![0x5a; BLOCK as usize], GuestAddress(BLOCK))
        .unwrap();
    let before = file_allocated_bytes(&file).unwrap();
    let used = rings[3].roundtrip(&mem, &[DriverBuf::write(BLOCK, BLOCK as u32)]);
    assert_eq!(used, 0, "no zero promise: bit 6 not negotiated");
    let after = file_allocated_bytes(&file).unwrap();
    assert_eq!(before - after, BLOCK, "the block's pages left the memfd");
    assert!(is_signalled(&call), "the report's use was notified");

    // The operator's target: answered at once though no channel exists to announce it,
    // and the guest's next read of num_pages has it.
    let answer = crate::control::request(&d.control, &json!({"op": "set", "pages": 1})).unwrap();
    assert_eq!(answer["num_pages"], 1, "{answer}");
    assert_eq!(read_u32(&s, 0, 0), 1, "the target at the next config read");
    send_pfn(&mem, &mut rings[0], 0x300);
    send(
        &s,
        SET_CONFIG,
        0,
        &config_msg(4, 0, &1u32.to_le_bytes()),
        &[],
    );
    assert_eq!(read_u32(&s, 4, 0), 1, "actual, written by the guest");
    let st = status(&d);
    assert_eq!(st["connected"], true, "{st}");
    assert_eq!(st["metrics"]["balloon_inflate"], 1, "{st}");
    assert_eq!(st["metrics"]["malformed"], 0, "{st}");
}

/// `krun_add_vhost_user_device(ctx, 5, path, "balloon", 0, NULL)`: libkrun asks
/// GET_QUEUE_NUM (the vhost `Frontend` refuses to without MQ negotiated, and libkrun then
/// fails to create the device) and sets up that many queues.
#[test]
fn libkrun_asking_the_queue_count_gets_what_the_offered_features_imply() {
    let d = Daemon::start("libkrun0");
    let s = UnixStream::connect(&d.socket).unwrap();
    let (_, queues) = libkrun_connect(&s, 0);
    assert_eq!(queues, 4, "inflate, deflate, stats, reporting");
    assert_eq!(read_u32(&s, 0, 0), 0, "still served");
}

/// Whether `call` was signalled (and clears it).
fn is_signalled(call: &OwnedFd) -> bool {
    let mut buf = [0u8; 8];
    rustix::io::read(call, &mut buf).is_ok()
}

/// cloud-hypervisor's `DEFAULT_VIRTIO_FEATURES` (`virtio-devices/src/vhost_user/mod.rs`):
/// INDIRECT_DESC, EVENT_IDX, VERSION_1, IN_ORDER, ORDER_PLATFORM, NOTIFICATION_DATA,
/// bit 30 and LOG_ALL (26).
const CH_DEFAULT_FEATURES: u64 = (1 << 28)
    | (1 << 29)
    | VERSION_1
    | (1 << 35)
    | (1 << 36)
    | (1 << 38)
    | PROTOCOL_FEATURES
    | (1 << 26);
/// The protocol features `GenericVhostUser::new` accepts (INFLIGHT_SHMFD, LOG_SHMFD and
/// DEVICE_STATE too, which zeronce does not offer).
const CH_PROTOCOL: u64 =
    CONFIG | MQ | CONFIGURE_MEM_SLOTS | REPLY_ACK | (1 << 12) | (1 << 1) | (1 << 19) | BACKEND_REQ;

/// cloud-hypervisor ≥ v52 `--generic-vhost-user socket=…,virtio_id=5,
/// queue_sizes=[256,256,256,256]`: `connect_vhost_user` sends SET_OWNER and
/// GET_FEATURES; `negotiate_features_vhost_user` acks `DEFAULT_VIRTIO_FEATURES` ∩
/// offered, then GET_PROTOCOL_FEATURES and SET_PROTOCOL_FEATURES (its list ∩ offered),
/// and with REPLY_ACK negotiated every later request asks for a reply (`set_hdr_flags`);
/// GET_QUEUE_NUM (MQ) must answer at least the 4 queues asked for. The guest is offered
/// `DEFAULT_VIRTIO_FEATURES` and nothing of the device's: no balloon feature reaches it,
/// so Linux's driver runs inflate and deflate only (2 queues). Config accesses are
/// forwarded one by one (GET_CONFIG flags 0, SET_CONFIG flags WRITABLE; a failed one
/// panics the VMM). At DRIVER_OK `setup_vhost_user` sends SET_FEATURES (the guest's ∩
/// the back-end's: VERSION_1 and bit 30), SET_MEM_TABLE, SET_VRING_NUM of each ring,
/// then per ring _ADDR, _BASE (the ring's avail index: 0 here), _CALL, _KICK, then
/// SET_VRING_ENABLE of each, then SET_BACKEND_REQ_FD (config changes become the guest's
/// config interrupt).
///
/// What the guest gets besides: cloud-hypervisor offers it EVENT_IDX and INDIRECT_DESC
/// (and IN_ORDER, NOTIFICATION_DATA) whether the back-end offers them or not, and tells
/// the back-end only what both have. zeronce offers neither, so a Linux guest uses
/// event-index notification the device does not know about: the device never writes
/// `avail_event`, and the guest stops kicking after its first buffer on each ring. This
/// test drives the rings as a guest without EVENT_IDX would.
///
/// What a patch in cloud-hypervisor would need for reporting to reach the guest: offer
/// the guest `GET_FEATURES` minus bit 30, intersected with the transport features it
/// supports (the device-type bits 0–23 passed through, as crosvm and QEMU do), not its
/// own list; size the queues from `GET_QUEUE_NUM` (reporting is queue 3 with stats);
/// and start a ring at index 0 on first activation, not at the ring's avail index
/// (Linux's driver queues the stats buffer before DRIVER_OK, which that base skips).
#[test]
fn cloud_hypervisor_generic_gets_inflate_and_deflate_only_and_each_is_served() {
    let d = Daemon::start("chv");
    let s = UnixStream::connect(&d.socket).unwrap();
    send(&s, SET_OWNER, 0, &[], &[]);
    let offered = get_u64(&s, GET_FEATURES);
    let acked = CH_DEFAULT_FEATURES & offered;
    assert_eq!(
        acked,
        VERSION_1 | PROTOCOL_FEATURES,
        "none of the device's features, none of the ring features: {offered:#x}"
    );
    let proto = get_u64(&s, GET_PROTOCOL_FEATURES) & CH_PROTOCOL;
    assert_eq!(
        proto,
        CONFIG | MQ | CONFIGURE_MEM_SLOTS | REPLY_ACK | BACKEND_REQ,
        "negotiated protocol features"
    );
    send(&s, SET_PROTOCOL_FEATURES, 0, &u64_payload(proto), &[]);
    assert!(
        get_u64_asking(&s, GET_QUEUE_NUM) >= 4,
        "queue_sizes=[256,256,256,256] fits (else BadQueueNum)"
    );

    // DRIVER_OK. The guest acked VERSION_1 (and EVENT_IDX, INDIRECT_DESC, masked off here).
    let guest = VERSION_1 | (1 << 28) | (1 << 29);
    let features = (acked | guest) & offered;
    send(&s, SET_FEATURES, NEED_REPLY, &u64_payload(features), &[]);
    assert_eq!(ack(&s, SET_FEATURES), 0);
    let file = memfd();
    let mem = share_memory(&s, &file, NEED_REPLY);
    let mut rings: Vec<Ring> = (0..2).map(|i| Ring::nth(&mem, i)).collect();
    let ring_steps: [&[RingMsg]; 3] = [
        &[RingMsg::Num],
        &[RingMsg::Addr, RingMsg::Base, RingMsg::Call, RingMsg::Kick],
        &[RingMsg::Enable],
    ];
    for steps in ring_steps {
        for (i, r) in rings.iter().enumerate() {
            setup_ring(&s, i as u32, r, 0, steps, NEED_REPLY);
        }
    }
    let channel = backend_channel(&s);
    let st = status(&d);
    assert_eq!(st["features"], VERSION_1, "what SET_FEATURES carried: {st}");

    // The guest reads num_pages (towards_target), the operator sets a target: a config
    // change on the channel, the guest reads it, inflates, writes actual.
    assert_eq!(read_u32(&s, 0, NEED_REPLY), 0);
    crate::control::request(&d.control, &json!({"op": "set", "pages": 1})).unwrap();
    let m = recv_message(&channel).unwrap().expect("CONFIG_CHANGE_MSG");
    assert_eq!(m.header.request, wire::BACKEND_CONFIG_CHANGE_MSG);
    assert_eq!(read_u32(&s, 0, NEED_REPLY), 1);
    send_pfn(&mem, &mut rings[0], 0x300);
    let write = config_msg(4, CONFIG_WRITABLE, &1u32.to_le_bytes());
    send(&s, SET_CONFIG, NEED_REPLY, &write, &[]);
    assert_eq!(ack(&s, SET_CONFIG), 0, "the write of actual is accepted");
    // Then the target goes back to 0: the guest deflates.
    crate::control::request(&d.control, &json!({"op": "set", "pages": 0})).unwrap();
    recv_message(&channel).unwrap().expect("CONFIG_CHANGE_MSG");
    send_pfn(&mem, &mut rings[1], 0x300);
    let st = status(&d);
    assert_eq!(st["actual"], 1, "{st}");
    assert_eq!(st["metrics"]["balloon_inflate"], 1, "{st}");
    assert_eq!(st["metrics"]["balloon_deflate"], 1, "{st}");
    assert_eq!(st["metrics"]["malformed"], 0, "{st}");
}

/// A request with a reply of its own, sent with NEED_REPLY (as cloud-hypervisor sends
/// every request once REPLY_ACK is negotiated): the value, and no second reply.
fn get_u64_asking(s: &UnixStream, request: u32) -> u64 {
    send(s, request, NEED_REPLY, &[], &[]);
    let v = ack(s, request);
    // The next reply is the next request's (`reply` checks), not a stray ack.
    read_u32(s, 0, NEED_REPLY);
    v
}
