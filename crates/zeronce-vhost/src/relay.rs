//! The normalising relay between a front-end's connection and rust-vmm's request handler.
//!
//! rust-vmm `vhost-user-backend` serves a connection it accepts itself; the daemon puts
//! a relay in between so that it can (a) bring front-end messages into the form `vhost`
//! 0.18 accepts ([`crate::wire::normalize`]) and (b) keep its own handle on the back-end
//! request channel (`SET_BACKEND_REQ_FD`), on which it sends `CONFIG_CHANGE_MSG`, a
//! message `vhost`'s `Backend` cannot send. Front-end to back-end messages are parsed
//! (header, file descriptors, payload) and forwarded; replies go back byte for byte
//! (the back-end sends no file descriptors for the features the daemon offers).
//!
//! Only control messages pass here: queue notifications and interrupts travel on the
//! eventfds / pipes the front-end hands over, directly between the two processes.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::Shutdown;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use zeronce_types::sync::lock;

use crate::hub::Limits;
use crate::slots::{MemSlots, Verdict};
use crate::wire::{self, Header, Normalized, HEADER_SIZE, MAX_REGIONS};

/// Refuses memory regions that reach past the end of the file backing them: mapped, the
/// part past the end is not backed, and the device's first access to it (a vring placed
/// there) would kill the daemon with SIGBUS. Files that are not regular files (no size
/// to check) pass.
fn check_regions(m: &Message) -> Result<(), String> {
    for (i, r) in wire::regions(&m.header, &m.payload).iter().enumerate() {
        let Some(fd) = m.fds.get(i) else {
            return Err(format!("region {i} has no file descriptor"));
        };
        let st = rustix::fs::fstat(fd).map_err(|e| format!("region {i}: fstat: {e}"))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            continue;
        }
        let file = u64::try_from(st.st_size).unwrap_or(0);
        let end = r.mmap_offset.checked_add(r.size);
        if end.is_none_or(|end| end > file) {
            return Err(format!(
                "region {i} ({} bytes at file offset {}) is larger than its file ({file} bytes): \
                 a ring in it would kill the daemon with SIGBUS",
                r.size, r.mmap_offset
            ));
        }
    }
    Ok(())
}

/// One front-end message with the file descriptors that came with it.
#[derive(Debug)]
pub struct Message {
    /// The header (its size equals `payload.len()`).
    pub header: Header,
    /// The payload.
    pub payload: Vec<u8>,
    /// File descriptors received with the header.
    pub fds: Vec<OwnedFd>,
}

/// Receives one message; `Ok(None)` on end of stream before a header.
#[cfg(test)]
pub fn recv_message(sock: &UnixStream) -> io::Result<Option<Message>> {
    recv_message_within(sock, None)
}

/// Receives one message, waiting as long as it takes for its first byte and then at most
/// `rest` for the others (`None`: no limit), so a front-end that sends part of a message
/// and stops is an error, not a relay thread stuck for ever.
pub fn recv_message_within(
    sock: &UnixStream,
    rest: Option<Duration>,
) -> io::Result<Option<Message>> {
    let mut timed = false;
    let result = recv_message_timed(sock, rest, &mut timed);
    if timed {
        sock.set_read_timeout(None)?;
    }
    result
}

fn recv_message_timed(
    sock: &UnixStream,
    rest: Option<Duration>,
    timed: &mut bool,
) -> io::Result<Option<Message>> {
    let mut head = [0u8; HEADER_SIZE];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < HEADER_SIZE {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_REGIONS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut head[got..])];
        let r = match recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if r.bytes == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += r.bytes;
        if rest.is_some() && !*timed {
            sock.set_read_timeout(rest)?;
            *timed = true;
        }
    }
    let header = Header::decode(&head);
    wire::check_header(&header).map_err(io::Error::other)?;
    let mut payload = vec![0u8; header.size as usize];
    (&*sock).read_exact(&mut payload)?;
    Ok(Some(Message {
        header,
        payload,
        fds,
    }))
}

/// Sends one message (header, payload, file descriptors) in one `sendmsg`.
pub fn send_message(
    sock: &UnixStream,
    header: &Header,
    payload: &[u8],
    fds: &[OwnedFd],
) -> io::Result<()> {
    let head = header.encode();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_REGIONS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !borrowed.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other("too many file descriptors in one message"));
    }
    let iov = [IoSlice::new(&head), IoSlice::new(payload)];
    let total = head.len() + payload.len();
    let sent = sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL)?;
    // The descriptors went with the first byte; the rest is plain data.
    let mut rest = Vec::with_capacity(total - sent);
    rest.extend_from_slice(&head[sent.min(HEADER_SIZE)..]);
    rest.extend_from_slice(&payload[sent.saturating_sub(HEADER_SIZE)..]);
    (&*sock).write_all(&rest)
}

/// Where the relay puts the back-end request channel when the front-end sends it.
pub type BackendChannelSlot = Arc<Mutex<Option<UnixStream>>>;

/// A running relay; ends when either side closes.
#[derive(Debug)]
pub struct Relay {
    frontend: UnixStream,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Relays between `frontend` (the front-end's connection) and `backend` (the
    /// handler's end), storing a duplicate of the back-end request channel in `slot`.
    /// A message whose first byte came must be whole within `limits.handshake`; the
    /// front-end may map at most `limits.mem_slots` regions.
    pub fn start(
        frontend: UnixStream,
        backend: UnixStream,
        slot: BackendChannelSlot,
        limits: Limits,
    ) -> io::Result<Relay> {
        let (f_in, b_out) = (frontend.try_clone()?, backend.try_clone()?);
        let (f_out, b_in) = (frontend.try_clone()?, backend);
        let forward = std::thread::Builder::new()
            .name("vhost-relay-in".into())
            .spawn(move || {
                if let Err(e) = forward(&f_in, &b_out, &slot, &limits) {
                    tracing::info!(error = %e, "front-end connection ended");
                }
                let _ = b_out.shutdown(Shutdown::Both);
                let _ = f_in.shutdown(Shutdown::Read);
            })?;
        let back = std::thread::Builder::new()
            .name("vhost-relay-out".into())
            .spawn(move || {
                let _ = io::copy(&mut &b_in, &mut &f_out);
                let _ = f_out.shutdown(Shutdown::Both);
            })?;
        Ok(Relay {
            frontend,
            threads: vec![forward, back],
        })
    }

    /// Closes the front-end connection (the relay then ends).
    pub fn shutdown(&self) {
        let _ = self.frontend.shutdown(Shutdown::Both);
    }

    /// Waits for both directions to end.
    pub fn join(self) {
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("a relay thread panicked");
            }
        }
    }
}

/// Front-end to handler: parse, normalise, check the memory regions (each one's file,
/// and the bound on memory slots), note the back-end channel, forward.
fn forward(
    from: &UnixStream,
    to: &UnixStream,
    slot: &BackendChannelSlot,
    limits: &Limits,
) -> io::Result<()> {
    let mut slots = MemSlots::new(limits.mem_slots);
    while let Some(mut m) = recv_message_within(from, Some(limits.handshake))? {
        if let Normalized::MemTableTrimmed { from, to } =
            wire::normalize(&mut m.header, &mut m.payload)
        {
            tracing::debug!(from, to, "SET_MEM_TABLE: unused region slots cut");
        }
        // SET_MEM_TABLE and ADD_MEM_REG: one check of their regions.
        match check_regions(&m).and_then(|()| slots.admit(&m.header, &m.payload)) {
            Err(why) => {
                tracing::error!(request = m.header.request, "memory region refused: {why}");
                if m.header.flags & wire::NEED_REPLY != 0 {
                    send_u64_reply(from, m.header.request, 1)?;
                }
                return Err(io::Error::new(io::ErrorKind::InvalidData, why));
            }
            // The front-end waits for this answer, so no reply of the handler's is on
            // its way to it meanwhile.
            Ok(Verdict::Answer(v)) => {
                send_u64_reply(from, m.header.request, v)?;
                continue;
            }
            Ok(Verdict::Forward) => {}
        }
        if m.header.request == wire::SET_BACKEND_REQ_FD {
            if let Some(fd) = m.fds.first() {
                let own = UnixStream::from(fd.try_clone()?);
                own.set_write_timeout(Some(std::time::Duration::from_secs(1)))?;
                *lock(slot) = Some(own);
            }
        }
        send_message(to, &m.header, &m.payload, &m.fds)?;
    }
    Ok(())
}

/// The relay's own reply to `request`: a u64 (an ack's status, or a value asked for).
fn send_u64_reply(to: &UnixStream, request: u32, value: u64) -> io::Result<()> {
    let h = Header {
        request,
        flags: wire::VERSION_1 | wire::REPLY,
        size: 8,
    };
    send_message(to, &h, &value.to_le_bytes(), &[])
}
