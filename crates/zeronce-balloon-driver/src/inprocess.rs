//! The in-process transport: the [`BalloonDevice`] runs in its own thread of the same
//! process and serves the guest driver's transport accesses (features, config, queue
//! setup, kicks, reset) from a channel, as a VMM's vCPU exit handler would. Guest memory
//! is shared: the device gets its own [`GuestMemoryMmap`] (e.g. over a dup of the guest
//! RAM's memfd), and raises used-buffer interrupts through its [`InterruptSignal`].

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use vm_memory::GuestMemoryMmap;

use crate::{QueueAddrs, Transport, TransportError};
use zeronce_balloon::device::{BalloonDevice, InterruptSignal};
use zeronce_balloon::discard::Discarder;
use zeronce_balloon::error::BalloonError;
use zeronce_balloon::features::FeatureSet;
use zeronce_balloon::metrics::BalloonMetrics;

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
        let thread = std::thread::Builder::new()
            .name("zeronce-balloon".into())
            .spawn(move || serve(device, &mem, &rx))?;
        Ok(InProcessTransport {
            tx: Some(tx),
            thread: Some(thread),
            metrics,
        })
    }

    /// The device's metrics.
    pub fn metrics(&self) -> Arc<BalloonMetrics> {
        Arc::clone(&self.metrics)
    }

    fn send(&self, access: Access) -> Result<(), TransportError> {
        let tx = self.tx.as_ref().ok_or(TransportError::DeviceGone)?;
        tx.send(access).map_err(|_| TransportError::DeviceGone)
    }

    fn call<R>(&self, access: impl FnOnce(Reply<R>) -> Access) -> Result<R, TransportError> {
        let (reply, answer) = mpsc::channel();
        self.send(access(reply))?;
        answer.recv().map_err(|_| TransportError::DeviceGone)
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

/// The device thread: serves accesses until the channel closes; completes held requests
/// at their deadlines.
fn serve<D, I>(mut dev: BalloonDevice<D, I>, mem: &GuestMemoryMmap, rx: &Receiver<Access>)
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
                let _ = r.send(activate(&mut dev, &addrs));
            }
            Access::Notify(index) => {
                if let Err(e) = dev.process_queue(mem, index) {
                    tracing::warn!(error = %e, index, "balloon device: queue notification failed");
                }
            }
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
                .ok_or_else(|| BalloonError::Queue(format!("invalid queue size {}", a.size)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    dev.activate(queues)
}
