//! The in-process transport: the [`BalloonDevice`] runs in its own thread of the same
//! process and serves the guest driver's transport accesses (features, config, queue
//! setup, kicks, reset) from a channel, as a VMM's vCPU exit handler would. Guest memory
//! is shared: the device gets its own [`GuestMemoryMmap`] (e.g. over a dup of the guest
//! RAM's memfd), and raises used-buffer interrupts through its [`InterruptSignal`].
//!
//! A panic of the device thread is fail-stop: the thread is not restarted. The device's
//! state (held requests, partial huge pages, the rings' positions) is lost with it, and
//! a new device would start from a reset the driver did not ask for, while the driver
//! may still have buffers in flight naming memory it is about to reuse; only a reset
//! the driver performs (and its renegotiation) makes that safe. So the thread records
//! why it stopped, wakes every queue's waiter, and every later access fails with
//! [`TransportError::DeviceFailed`] carrying the panic message ([`Transport::failure`]):
//! the driver's pending report fails at once (not at its timeout), the driver stops
//! reporting, and the engine gives every block back unreported.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use vm_memory::GuestMemoryMmap;

use zeronce_balloon::guest_ring::QueueAddrs;
use zeronce_balloon::BalloonMetrics;
use zeronce_balloon::Discarder;
use zeronce_balloon::FeatureSet;
use zeronce_balloon::{BalloonDevice, InterruptSignal};
use zeronce_balloon::{BalloonError, QueueError};

use crate::transport::{Transport, TransportError};

type Reply<T> = Sender<T>;

/// One transport access, carried to the device thread.
enum Access {
    Features(Reply<FeatureSet>),
    DriverFeatures(FeatureSet, Reply<Result<(), BalloonError>>),
    WriteConfig(u64, Vec<u8>, Reply<Result<(), BalloonError>>),
    Activate(Vec<QueueAddrs>, Reply<Result<(), BalloonError>>),
    Notify(u16),
    Reset(Reply<()>),
}

/// A [`Transport`] to a device thread; dropping it stops and joins the thread.
pub struct InProcessTransport {
    tx: Option<Sender<Access>>,
    thread: Option<JoinHandle<()>>,
    metrics: Arc<BalloonMetrics>,
    /// Why the device thread stopped (its panic), once it has.
    failure: Arc<Mutex<Option<String>>>,
}

impl InProcessTransport {
    /// Starts `device` in a thread named `zeronce-balloon`, serving `mem`.
    pub fn spawn<D, I>(device: BalloonDevice<D, I>, mem: GuestMemoryMmap) -> std::io::Result<Self>
    where
        D: Discarder<GuestMemoryMmap> + Send + 'static,
        I: InterruptSignal + Send + 'static,
    {
        let metrics = device.metrics();
        let (tx, rx) = mpsc::channel();
        let failure = Arc::new(Mutex::new(None));
        let failed = Arc::clone(&failure);
        let thread = std::thread::Builder::new()
            .name("zeronce-balloon".into())
            .spawn(move || run(device, &mem, rx, &failed))?;
        Ok(InProcessTransport {
            tx: Some(tx),
            thread: Some(thread),
            metrics,
            failure,
        })
    }

    /// The device's metrics.
    pub fn metrics(&self) -> Arc<BalloonMetrics> {
        Arc::clone(&self.metrics)
    }

    fn send(&self, access: Access) -> Result<(), TransportError> {
        let tx = self.tx.as_ref().ok_or(TransportError::DeviceGone)?;
        tx.send(access).map_err(|_| self.gone())
    }

    fn call<R>(&self, access: impl FnOnce(Reply<R>) -> Access) -> Result<R, TransportError> {
        let (reply, answer) = mpsc::channel();
        self.send(access(reply))?;
        answer.recv().map_err(|_| self.gone())
    }

    /// The error for a device thread that no longer answers: why it failed, if known.
    fn gone(&self) -> TransportError {
        self.failure()
            .map_or(TransportError::DeviceGone, TransportError::DeviceFailed)
    }
}

fn refused(e: BalloonError) -> TransportError {
    TransportError::Refused(e.to_string())
}

impl Transport for InProcessTransport {
    fn device_features(&mut self) -> Result<FeatureSet, TransportError> {
        self.call(Access::Features)
    }

    fn set_driver_features(&mut self, features: FeatureSet) -> Result<(), TransportError> {
        self.call(|r| Access::DriverFeatures(features, r))?
            .map_err(refused)
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.call(|r| Access::WriteConfig(offset, data.to_vec(), r))?
            .map_err(refused)
    }

    fn activate(&mut self, queues: &[QueueAddrs]) -> Result<(), TransportError> {
        self.call(|r| Access::Activate(queues.to_vec(), r))?
            .map_err(refused)
    }

    fn notify(&mut self, index: u16) -> Result<(), TransportError> {
        self.send(Access::Notify(index))
    }

    fn reset(&mut self) -> Result<(), TransportError> {
        self.call(Access::Reset)
    }

    fn failure(&self) -> Option<String> {
        self.failure.lock().map_or(None, |f| f.clone())
    }
}

impl Drop for InProcessTransport {
    fn drop(&mut self) {
        // Closing the channel ends the device loop.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the balloon device thread panicked");
            }
        }
    }
}

/// The device thread: [`serve`] until the channel closes or the device panics; a panic is
/// recorded in `failure` (fail-stop, see the module docs), then every queue's waiter is
/// woken so the driver sees it at once.
fn run<D, I>(
    mut dev: BalloonDevice<D, I>,
    mem: &GuestMemoryMmap,
    rx: Receiver<Access>,
    failure: &Mutex<Option<String>>,
) where
    D: Discarder<GuestMemoryMmap>,
    I: InterruptSignal,
{
    let Err(panic) = catch_unwind(AssertUnwindSafe(|| serve(&mut dev, mem, &rx))) else {
        return;
    };
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown payload".into());
    let why = format!("the device thread panicked: {msg}");
    tracing::error!(reason = %why, "balloon device stopped for good (fail-stop)");
    if let Ok(mut f) = failure.lock() {
        *f = Some(why);
    }
    // Accesses from now on fail; then wake whoever waits for used buffers.
    drop(rx);
    for index in 0..dev.layout().map_or(0, |l| l.len()) {
        dev.interrupt()
            .signal_used_queue(u16::try_from(index).unwrap_or(u16::MAX));
    }
}

/// Serves accesses until the channel closes; completes held requests at their deadlines.
fn serve<D, I>(dev: &mut BalloonDevice<D, I>, mem: &GuestMemoryMmap, rx: &Receiver<Access>)
where
    D: Discarder<GuestMemoryMmap>,
    I: InterruptSignal,
{
    loop {
        let access = match dev.next_deadline() {
            None => rx.recv().ok(),
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(a) => Some(a),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = dev.tick(mem, Instant::now()) {
                        tracing::warn!(error = %e, "balloon device: completing held requests failed");
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => None,
            },
        };
        let Some(access) = access else { return };
        // A reply nobody waits for any more is fine to lose.
        match access {
            Access::Features(r) => {
                let _ = r.send(dev.device_features());
            }
            Access::DriverFeatures(f, r) => {
                let _ = r.send(dev.ack_features(f).map(drop));
            }
            Access::WriteConfig(offset, data, r) => {
                let _ = r.send(dev.write_config(offset, &data));
            }
            Access::Activate(addrs, r) => {
                let _ = r.send(activate(dev, &addrs));
            }
            // One call serves at most a queue's worth; the rest is served at once.
            Access::Notify(index) => loop {
                match dev.process_queue(mem, index) {
                    Ok(r) if r.more => {}
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, index, "balloon device: queue notification failed");
                        break;
                    }
                }
            },
            Access::Reset(r) => {
                dev.reset();
                let _ = r.send(());
            }
        }
    }
}

fn activate<D, I: InterruptSignal>(
    dev: &mut BalloonDevice<D, I>,
    addrs: &[QueueAddrs],
) -> Result<(), BalloonError> {
    let queues = addrs
        .iter()
        .map(|a| {
            a.device_queue()
                .ok_or_else(|| BalloonError::Queue(QueueError::InvalidSize(a.size)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    dev.activate(queues)
}
