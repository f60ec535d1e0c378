//! [`VhostUserTransport`]: the guest driver's [`Transport`] over vhost-user, with rust-vmm
//! `vhost`'s `Frontend` — so zeronce's own driver can drive a device served by
//! `zeronce serve` in another process, as a VMM's virtio transport would.
//!
//! The guest RAM is one memfd shared with the back-end (`SET_MEM_TABLE`, one region at
//! guest address 0). Addresses in vring messages are "front-end virtual addresses"; this
//! front-end declares the region at [`VA_BASE`] so that they are `VA_BASE + guest
//! address`. Kicks are eventfds the transport writes; used-buffer interrupts arrive on
//! call eventfds, which a thread turns into [`UsedSignal`] raises. The same thread watches
//! the vhost-user socket for a hang-up: a back-end that exited or crashed answers nothing
//! more, so the transport records it ([`Transport::failure`]) and wakes every waiting
//! driver, which fails at once instead of at its timeout.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use zeronce_balloon::guest_ring::QueueAddrs;
use zeronce_balloon::{FeatureSet, InterruptSignal};
use zeronce_balloon_driver::{Transport, TransportError, UsedSignal};

use crate::backend::PROTOCOL_FEATURES_BIT;

/// The front-end virtual address of guest address 0.
pub const VA_BASE: u64 = 1 << 40;

/// Most queues the balloon has (inflate, deflate, stats, reporting).
const MAX_QUEUES: u64 = 4;

fn err(e: impl std::fmt::Display) -> TransportError {
    TransportError::Refused(e.to_string())
}

/// A driver transport to a vhost-user balloon back-end.
pub struct VhostUserTransport {
    frontend: Frontend,
    ram: File,
    ram_size: u64,
    kicks: Vec<EventFd>,
    /// Ends the call thread (written on drop).
    stop: EventFd,
    calls: Option<JoinHandle<()>>,
    irq: Arc<UsedSignal>,
    owned: bool,
    /// Why the back-end is gone for good, once the call thread saw its socket hang up.
    failed: Arc<OnceLock<String>>,
}

/// Epoll data of the stop event.
const STOP: u64 = u64::MAX;
/// Epoll data of the vhost-user socket (watched for a hang-up only).
const SOCKET: u64 = u64::MAX - 1;

impl VhostUserTransport {
    /// Connects to the back-end at `socket`, sharing `ram` (`ram_size` bytes, guest
    /// address 0); used-buffer interrupts raise `irq`.
    pub fn connect(
        socket: &Path,
        ram: File,
        ram_size: u64,
        irq: Arc<UsedSignal>,
    ) -> Result<VhostUserTransport, TransportError> {
        let frontend = Frontend::connect(socket, MAX_QUEUES).map_err(err)?;
        Ok(VhostUserTransport {
            frontend,
            ram,
            ram_size,
            kicks: Vec::new(),
            stop: EventFd::new(EFD_NONBLOCK).map_err(err)?,
            calls: None,
            irq,
            owned: false,
            failed: Arc::new(OnceLock::new()),
        })
    }

    fn stop_calls(&mut self) {
        if let Some(t) = self.calls.take() {
            let _ = self.stop.write(1);
            if t.join().is_err() {
                tracing::error!("the vhost-user call thread panicked");
            }
            // A fresh stop event for the next activation.
            let _ = self.stop.read();
        }
    }
}

impl Transport for VhostUserTransport {
    fn device_features(&mut self) -> Result<FeatureSet, TransportError> {
        if !self.owned {
            self.frontend.set_owner().map_err(err)?;
            self.owned = true;
        }
        let f = self.frontend.get_features().map_err(err)?;
        Ok(FeatureSet::from_bits(f & !PROTOCOL_FEATURES_BIT))
    }

    fn set_driver_features(&mut self, features: FeatureSet) -> Result<(), TransportError> {
        let offered = self.frontend.get_features().map_err(err)?;
        let mut bits = features.bits();
        if offered & PROTOCOL_FEATURES_BIT != 0 {
            bits |= PROTOCOL_FEATURES_BIT;
            let proto = self.frontend.get_protocol_features().map_err(err)?;
            let want = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::CONFIG;
            self.frontend
                .set_protocol_features(proto & want)
                .map_err(err)?;
        }
        self.frontend.set_features(bits).map_err(err)?;
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: self.ram_size,
            userspace_addr: VA_BASE,
            mmap_offset: 0,
            mmap_handle: self.ram.as_raw_fd(),
        };
        self.frontend.set_mem_table(&[region]).map_err(err)?;
        Ok(())
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        let offset = u32::try_from(offset).map_err(err)?;
        self.frontend
            .set_config(offset, VhostUserConfigFlags::WRITABLE, data)
            .map_err(err)
    }

    fn activate(&mut self, queues: &[QueueAddrs]) -> Result<(), TransportError> {
        self.stop_calls();
        let epoll = Epoll::new().map_err(err)?;
        let mut calls = Vec::new();
        let mut kicks = Vec::new();
        for (i, q) in queues.iter().enumerate() {
            let call = EventFd::new(EFD_NONBLOCK).map_err(err)?;
            let kick = EventFd::new(EFD_NONBLOCK).map_err(err)?;
            let f = &self.frontend;
            f.set_vring_num(i, q.size).map_err(err)?;
            let config = VringConfigData {
                queue_max_size: q.size,
                queue_size: q.size,
                flags: 0,
                desc_table_addr: VA_BASE + q.desc.0,
                used_ring_addr: VA_BASE + q.used.0,
                avail_ring_addr: VA_BASE + q.avail.0,
                log_addr: None,
            };
            f.set_vring_addr(i, &config).map_err(err)?;
            f.set_vring_base(i, 0).map_err(err)?;
            f.set_vring_call(i, &call).map_err(err)?;
            f.set_vring_kick(i, &kick).map_err(err)?;
            epoll
                .ctl(
                    ControlOperation::Add,
                    call.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, i as u64),
                )
                .map_err(err)?;
            calls.push(call);
            kicks.push(kick);
        }
        for i in 0..queues.len() {
            self.frontend.set_vring_enable(i, true).map_err(err)?;
        }
        let stop = self.stop.try_clone().map_err(err)?;
        epoll
            .ctl(
                ControlOperation::Add,
                stop.as_raw_fd(),
                EpollEvent::new(EventSet::IN, STOP),
            )
            .map_err(err)?;
        // Not readable (replies are the front-end's to read): only a hang-up or an error.
        epoll
            .ctl(
                ControlOperation::Add,
                self.frontend.as_raw_fd(),
                EpollEvent::new(EventSet::READ_HANG_UP, SOCKET),
            )
            .map_err(err)?;
        let (irq, failed) = (Arc::clone(&self.irq), Arc::clone(&self.failed));
        let queues = u16::try_from(queues.len()).map_err(err)?;
        self.calls = Some(
            std::thread::Builder::new()
                .name("vhost-user-calls".into())
                .spawn(move || call_loop(&epoll, &calls, &irq, &failed, queues))
                .map_err(err)?,
        );
        self.kicks = kicks;
        Ok(())
    }

    fn notify(&mut self, index: u16) -> Result<(), TransportError> {
        let kick = self
            .kicks
            .get(usize::from(index))
            .ok_or_else(|| err(format!("queue {index} is not set up")))?;
        kick.write(1).map_err(|_| TransportError::DeviceGone)
    }

    fn reset(&mut self) -> Result<(), TransportError> {
        // GET_VRING_BASE stops a ring: when it returns, the back-end no longer serves it.
        for i in 0..self.kicks.len() {
            self.frontend.get_vring_base(i).map_err(err)?;
        }
        self.kicks.clear();
        self.stop_calls();
        Ok(())
    }

    fn failure(&self) -> Option<String> {
        self.failed.get().cloned()
    }
}

impl Drop for VhostUserTransport {
    fn drop(&mut self) {
        self.stop_calls();
    }
}

/// Turns call eventfds into used-buffer interrupts until the stop event; on a hang-up of
/// the socket, records the failure and wakes the waiters of all `queues`, then ends.
fn call_loop(
    epoll: &Epoll,
    calls: &[EventFd],
    irq: &UsedSignal,
    failed: &OnceLock<String>,
    queues: u16,
) {
    let mut events = vec![EpollEvent::default(); calls.len() + 2];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!(error = %e, "vhost-user call thread: epoll failed");
                return;
            }
        };
        for ev in &events[..n] {
            if ev.data() == SOCKET {
                // Recorded before the wake-ups: a woken driver checks it first.
                let why = "the vhost-user back-end closed its socket (it exited or crashed)";
                tracing::error!("{why}");
                let _ = failed.set(why.into());
                for q in 0..queues {
                    irq.signal_used_queue(q);
                }
                return;
            }
            let Some(call) = calls.get(ev.data() as usize) else {
                return;
            };
            if call.read().is_ok() {
                irq.signal_used_queue(ev.data() as u16);
            }
        }
    }
}
