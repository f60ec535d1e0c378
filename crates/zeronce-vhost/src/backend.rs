//! [`BalloonBackend`]: the [`BalloonDevice`] behind rust-vmm `vhost-user-backend`'s
//! [`VhostUserBackend`] trait, one per front-end connection.
//!
//! `vhost-user-backend` keeps its own copy of each virtqueue's addresses and indices; the
//! device owns the queues it serves. At the first notification after the rings are set
//! up, the backend copies each ring's addresses and indices into the device's queues
//! ([`BalloonDevice::activate`]); from then on only the device moves them, and
//! `GET_VRING_BASE` gets the device's `next_avail` back ([`VhostUserBackend::stop_vring`]).
//! Used-buffer interrupts go through the framework's call descriptors; configuration
//! changes go as `CONFIG_CHANGE_MSG` on the back-end request channel the relay kept.
//!
//! Each memory table (`SET_MEM_TABLE`, `ADD_MEM_REG`) has every region's backing learnt
//! at once ([`MmapDiscarder::learn`]: `fstatfs` of the region's file tells shmem/memfd
//! from hugetlbfs and its page size), logged and shown in the status. Requests held by
//! `--host hold` complete from the vring thread's [`HoldTimer`], and at once when the
//! front-end stops the rings (`GET_VRING_BASE`), so that no buffer is lost across a stop.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use zeronce_balloon::{
    BalloonDevice, BalloonError, BalloonOptions, DiscardPolicy, FeatureSet, InterruptSignal,
    MmapDiscarder, RegionBacking,
};
use zeronce_types::clock::deadline_after;
use zeronce_types::rate::log_this;
use zeronce_types::sync::lock;

use crate::relay::BackendChannelSlot;
use crate::timer::HoldTimer;
use crate::wire;

/// Guest memory as `vhost-user-backend` hands it over.
pub type Memory = GuestMemoryAtomic<GuestMemoryMmap>;

/// `VHOST_USER_F_PROTOCOL_FEATURES` (bit 30): a vhost-user bit, not a balloon feature.
pub const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;

/// The largest queue the back-end accepts (Linux `virtio_uml` always asks for 256).
pub const MAX_QUEUE_SIZE: usize = 1024;

/// The vhost-user protocol features spoken: acknowledged replies, the back-end request
/// channel (for `CONFIG_CHANGE_MSG`), the configuration space messages, `MQ` (so that
/// `GET_QUEUE_NUM` is answered: crosvm asks it only with `MQ`, and otherwise creates two
/// queues, too few for a guest that negotiates stats or reporting), `RESET_DEVICE` and
/// `CONFIGURE_MEM_SLOTS` (memory hot-plug: QEMU then sends its regions one by one with
/// `ADD_MEM_REG` / `REM_MEM_REG` instead of `SET_MEM_TABLE`; the relay answers
/// `GET_MAX_MEM_SLOTS` and checks each region as it checks a table's).
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::BACKEND_REQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::RESET_DEVICE
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

/// The device's interrupts over vhost-user.
struct Irq {
    vrings: Mutex<Vec<VringRwLock>>,
    channel: BackendChannelSlot,
}

impl InterruptSignal for Irq {
    fn signal_used_queue(&self, queue_index: u16) {
        let vrings = lock(&self.vrings);
        if let Some(v) = vrings.get(usize::from(queue_index)) {
            if let Err(e) = v.signal_used_queue() {
                tracing::warn!(queue_index, error = %e, "cannot signal the front-end");
            }
        }
    }

    fn signal_config_change(&self) {
        let mut slot = lock(&self.channel);
        let Some(sock) = slot.as_mut() else {
            tracing::debug!(
                "no back-end request channel: the guest sees the target at its next config read"
            );
            return;
        };
        if let Err(e) = sock.write_all(&wire::config_change_msg()) {
            tracing::warn!(error = %e, "cannot send CONFIG_CHANGE_MSG");
        }
    }
}

/// The event that ends a session's vring thread: an eventfd the session owns (and so
/// closes), registered with the thread's epoll as a listener the backend answers with
/// an error, which ends the thread's loop.
pub(crate) struct ExitEvent {
    fd: EventFd,
}

impl ExitEvent {
    /// The epoll data of the exit event: past the queues and the framework's own event.
    fn id(num_queues: usize) -> usize {
        num_queues + 1
    }

    /// Registers a fresh exit event with every vring thread of `daemon`, and the
    /// back-end's hold timer with the first (the one thread that serves every queue).
    pub(crate) fn register(
        daemon: &vhost_user_backend::VhostUserDaemon<BalloonBackend>,
        backend: &BalloonBackend,
    ) -> io::Result<ExitEvent> {
        use std::os::fd::AsRawFd;
        let fd = EventFd::new(EFD_NONBLOCK)?;
        let n = backend.inner.num_queues;
        let handlers = daemon.get_epoll_handlers();
        for h in &handlers {
            h.register_listener(fd.as_raw_fd(), EventSet::IN, ExitEvent::id(n) as u64)?;
        }
        if let Some(h) = handlers.first() {
            let timer = backend.inner.timer.as_raw_fd();
            h.register_listener(timer, EventSet::IN, timer_id(n) as u64)?;
        }
        Ok(ExitEvent { fd })
    }

    /// Tells the vring threads to end.
    pub(crate) fn fire(&self) {
        if let Err(e) = self.fd.write(1) {
            tracing::error!(error = %e, "cannot end the vring thread");
        }
    }
}

/// The epoll data of the hold timer: past the exit event.
fn timer_id(num_queues: usize) -> usize {
    ExitEvent::id(num_queues) + 1
}

type Device = BalloonDevice<MmapDiscarder, Arc<Irq>>;

struct State {
    dev: Device,
    mem: Option<Memory>,
    /// The regions of the latest memory table, with their backings.
    regions: Vec<RegionBacking>,
}

struct Inner {
    state: Mutex<State>,
    irq: Arc<Irq>,
    num_queues: usize,
    policy: DiscardPolicy,
    /// Completes held requests on time (armed at the device's next deadline).
    timer: HoldTimer,
    /// Memory tables received (their backings are logged rate-limited).
    tables: AtomicU64,
}

/// The balloon device as a vhost-user back-end (cheap to clone: one shared device).
#[derive(Clone)]
pub struct BalloonBackend {
    inner: Arc<Inner>,
}

/// A back-end that does not keep its device (and the guest memory it maps) alive: for a
/// timer that may outlive the front-end's connection.
#[derive(Clone)]
pub(crate) struct WeakBackend(Weak<Inner>);

impl WeakBackend {
    /// The back-end, while its connection's device is still there.
    pub(crate) fn upgrade(&self) -> Option<BalloonBackend> {
        self.0.upgrade().map(|inner| BalloonBackend { inner })
    }
}

/// Access to the device of a running back-end, for the control socket.
pub struct DeviceGuard<'a> {
    state: MutexGuard<'a, State>,
}

impl DeviceGuard<'_> {
    /// The device.
    pub fn device(&mut self) -> &mut BalloonDevice<MmapDiscarder, impl InterruptSignal> {
        &mut self.state.dev
    }

    /// The regions of the front-end's latest memory table, with the backing learnt for
    /// each.
    pub fn regions(&self) -> &[RegionBacking] {
        &self.state.regions
    }

    /// Returns the held statistics buffer so that the guest sends fresh statistics.
    pub fn request_stats(&mut self) -> Result<bool, BalloonError> {
        let Some(mem) = self.state.mem.as_ref().map(GuestAddressSpace::memory) else {
            return Ok(false);
        };
        self.state.dev.request_stats(&*mem)
    }
}

impl BalloonBackend {
    /// A back-end serving a fresh device with `options`, its target set to `num_pages`,
    /// sending configuration changes on the channel the relay stores in `channel`.
    pub fn new(
        options: BalloonOptions,
        num_pages: u32,
        channel: BackendChannelSlot,
    ) -> io::Result<Self> {
        let irq = Arc::new(Irq {
            vrings: Mutex::new(Vec::new()),
            channel,
        });
        let mut dev = BalloonDevice::new(options, MmapDiscarder::new(), Arc::clone(&irq));
        // Before the driver is there: nothing to notify, the first config read sees it.
        dev.reset();
        let num_queues = dev.max_queues();
        let backend = BalloonBackend {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    dev,
                    mem: None,
                    regions: Vec::new(),
                }),
                irq,
                num_queues,
                policy: options.policy,
                timer: HoldTimer::new()?,
                tables: AtomicU64::new(0),
            }),
        };
        backend.set_initial_target(num_pages);
        Ok(backend)
    }

    /// Arms the hold timer at the device's earliest deadline (disarms it when nothing
    /// is held).
    fn rearm(&self, dev: &Device) {
        if let Err(e) = self.inner.timer.arm(dev.next_deadline(), Instant::now()) {
            tracing::error!(error = %e, "cannot arm the hold timer: held requests wait");
        }
    }

    /// Logs what each region of a new memory table is and how it is discarded
    /// (rate-limited: a front-end decides how many tables it sends).
    fn log_regions(&self, regions: &[RegionBacking]) {
        let n = self.inner.tables.fetch_add(1, Ordering::Relaxed) + 1;
        if !log_this(n) {
            return;
        }
        let policy = self.inner.policy;
        for r in regions {
            match &r.backing {
                Ok(b) => {
                    let op = policy.op_for(*b).unwrap_or_else(|fallback| fallback);
                    tracing::info!(
                        gpa = r.start.0, len = r.len, backing = %b, %op,
                        zero = policy.promises_zero(*b), tables = n, "guest memory region"
                    );
                }
                Err(e) => tracing::warn!(
                    gpa = r.start.0, len = r.len, error = %e, tables = n,
                    "guest memory region cannot be discarded: its reports are refused"
                ),
            }
        }
    }

    fn set_initial_target(&self, num_pages: u32) {
        let mut g = self.lock();
        if num_pages != 0 {
            // No channel yet: this only sets the field.
            g.state.dev.set_num_pages(num_pages);
        }
    }

    /// A handle that does not keep the device alive.
    pub(crate) fn downgrade(&self) -> WeakBackend {
        WeakBackend(Arc::downgrade(&self.inner))
    }

    /// Locks the device.
    pub fn lock(&self) -> DeviceGuard<'_> {
        DeviceGuard {
            state: lock(&self.inner.state),
        }
    }

    /// Copies the framework's rings into device queues and activates the device.
    fn activate(&self, st: &mut State, vrings: &[VringRwLock]) -> Result<(), String> {
        let neg = st
            .dev
            .negotiated()
            .ok_or("queue notification before SET_FEATURES")?;
        let layout = neg.layout();
        let mut queues = Vec::with_capacity(layout.len());
        for (index, vring) in vrings.iter().enumerate().take(layout.len()) {
            let g = vring.get_ref();
            let q = g.get_queue();
            if !q.ready() {
                return Err(format!("queue {index} not set up yet"));
            }
            queues.push(copy_queue(q).ok_or(format!("queue {index}: bad size"))?);
        }
        if queues.len() != layout.len() {
            return Err(format!(
                "{} rings for {} queues",
                queues.len(),
                layout.len()
            ));
        }
        st.dev.activate(queues).map_err(|e| e.to_string())?;
        *lock(&self.inner.irq.vrings) = vrings.to_vec();
        tracing::info!(?neg, "balloon device active");
        Ok(())
    }
}

/// A device-side copy of a ring the framework set up (addresses, size, indices).
fn copy_queue(q: &Queue) -> Option<Queue> {
    let mut c = Queue::new(q.max_size()).ok()?;
    c.set_size(q.size());
    let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
    let (lo, hi) = split(q.desc_table());
    c.set_desc_table_address(lo, hi);
    let (lo, hi) = split(q.avail_ring());
    c.set_avail_ring_address(lo, hi);
    let (lo, hi) = split(q.used_ring());
    c.set_used_ring_address(lo, hi);
    c.set_next_avail(q.next_avail());
    c.set_next_used(q.next_used());
    c.set_ready(true);
    Some(c)
}

impl VhostUserBackend for BalloonBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.inner.num_queues
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        self.lock().state.dev.device_features().bits() | PROTOCOL_FEATURES_BIT
    }

    fn acked_features(&self, features: u64) {
        let acked = FeatureSet::from_bits(features & !PROTOCOL_FEATURES_BIT);
        if let Err(e) = self.lock().state.dev.ack_features(acked) {
            tracing::warn!(error = %e, "feature acknowledgement refused");
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    fn reset_device(&self) {
        let mut g = self.lock();
        g.state.dev.reset();
        self.rearm(&g.state.dev);
    }

    fn set_event_idx(&self, _enabled: bool) {
        // EVENT_IDX is never offered.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut buf = vec![0u8; size as usize];
        match self
            .lock()
            .state
            .dev
            .read_config(u64::from(offset), &mut buf)
        {
            Ok(()) => buf,
            Err(_) => Vec::new(),
        }
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        self.lock()
            .state
            .dev
            .write_config(u64::from(offset), buf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
    }

    fn update_memory(&self, mem: Memory) -> io::Result<()> {
        let mut g = self.lock();
        let regions = g.state.dev.discarder_mut().learn(&mem.memory());
        self.log_regions(&regions);
        g.state.regions = regions;
        g.state.mem = Some(mem);
        Ok(())
    }

    /// None: `vhost-user-backend` 0.24 registers the exit event's consumer with
    /// `into_raw_fd` and never closes it, one eventfd leaked per session. The vring
    /// thread is ended by the session's own `ExitEvent` instead.
    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        None
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        let mut g = self.lock();
        let st = &mut *g.state;
        if !st.dev.is_active() {
            return Ok(());
        }
        // The device serves all its queues or none: stopping one stops the device. Every
        // ring's position goes back to the framework first, so that each GET_VRING_BASE
        // (this one and the ones that follow for the other rings) answers the device's
        // own `next_avail`, and SET_VRING_BASE with it resumes where the device was. The
        // held statistics buffer is given back first (the guest refills the queue, served
        // after the restart); the next notification after the rings are set up again
        // reactivates the device with the features and config it had.
        // Held requests complete now (discarded, then used): a stop would drop them, and
        // the guest, whose ring position is past them, would never get them back.
        if let Some(mem) = st.mem.as_ref().map(GuestAddressSpace::memory) {
            if let Err(e) = st.dev.request_stats(&*mem) {
                tracing::debug!(error = %e, "stats buffer not returned at stop");
            }
            let all = deadline_after(Instant::now(), Duration::MAX);
            if let Err(e) = st.dev.tick(&*mem, all) {
                tracing::debug!(error = %e, "held requests not all used at stop");
            }
        }
        let vrings = lock(&self.inner.irq.vrings);
        for (index, v) in vrings.iter().enumerate() {
            let q = u16::try_from(index).ok().and_then(|i| st.dev.queue(i));
            if let Some(q) = q {
                v.set_queue_next_avail(q.next_avail());
                v.set_queue_next_used(q.next_used());
            }
        }
        drop(vrings);
        tracing::debug!(queue_index, "rings stopped");
        st.dev.stop();
        self.rearm(&st.dev);
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if usize::from(device_event) == ExitEvent::id(self.inner.num_queues) {
            // Ends the vring thread's loop (its error is the framework's way out).
            return Err(io::Error::other("the session ended"));
        }
        let timer = usize::from(device_event) == timer_id(self.inner.num_queues);
        if usize::from(device_event) >= self.inner.num_queues && !timer {
            return Ok(());
        }
        if timer {
            // Read first: an expiry left unread would wake the thread again at once.
            self.inner.timer.acknowledge();
        }
        let mut g = self.lock();
        let st = &mut *g.state;
        let Some(mem) = st.mem.as_ref().map(GuestAddressSpace::memory) else {
            tracing::warn!("notification before SET_MEM_TABLE");
            return Ok(());
        };
        if timer {
            if let Err(e) = st.dev.tick(&*mem, Instant::now()) {
                tracing::debug!(error = %e, "held requests not all used");
            }
            self.rearm(&st.dev);
            return Ok(());
        }
        let queues = if st.dev.is_active() {
            device_event..device_event + 1
        } else {
            if let Err(e) = self.activate(st, vrings) {
                // Not an error of the guest's: a ring enabled before its siblings are
                // set up. The notification is served at activation.
                tracing::debug!(queue = device_event, error = %e, "not active yet");
                return Ok(());
            }
            // Notifications that came before activation were not served: serve every queue.
            0..st.dev.layout().map_or(0, |l| l.len() as u16)
        };
        for index in queues {
            // Errors are logged and counted by the device; a broken request never stops
            // the queue thread.
            // The device serves at most a queue's worth per call; the rest on the next.
            loop {
                match st.dev.process_queue(&*mem, index) {
                    Ok(r) if r.more => continue,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::debug!(queue = index, error = %e, "queue notification refused");
                        break;
                    }
                }
            }
        }
        self.rearm(&st.dev);
        Ok(())
    }
}
