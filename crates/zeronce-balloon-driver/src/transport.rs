//! What the guest driver needs from its transport (virtio-pci / virtio-mmio registers in a
//! real VM), and the interrupt line the device raises when it used buffers.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use zeronce_balloon::guest_ring::QueueAddrs;
use zeronce_balloon::FeatureSet;
use zeronce_balloon::InterruptSignal;

/// A transport access the device side refused or could not serve.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The device is gone (its thread ended, the connection closed).
    #[error("the balloon device is gone")]
    DeviceGone,
    /// The device stopped for good, and says why (e.g. its thread panicked).
    #[error("the balloon device failed: {0}")]
    DeviceFailed(String),
    /// The device refused the access (unoffered features, wrong queue count, ...).
    #[error("the balloon device refused: {0}")]
    Refused(String),
}

/// The driver's view of the transport: status, feature and config registers, queue
/// setup and notifications.
pub trait Transport: Send {
    /// The device's feature bits (all 64, as read through the feature select registers).
    fn device_features(&mut self) -> Result<FeatureSet, TransportError>;
    /// Writes the driver's features and sets FEATURES_OK; an error means the device did
    /// not accept them (FEATURES_OK did not stick).
    fn set_driver_features(&mut self, features: FeatureSet) -> Result<(), TransportError>;
    /// Writes `data` at `offset` of the device's configuration space.
    fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), TransportError>;
    /// Enables one queue per index of the negotiated layout and sets DRIVER_OK.
    fn activate(&mut self, queues: &[QueueAddrs]) -> Result<(), TransportError>;
    /// Notifies the device that queue `index` has new available buffers (the kick).
    fn notify(&mut self, index: u16) -> Result<(), TransportError>;
    /// Resets the device: when this returns, the device no longer touches any queue.
    fn reset(&mut self) -> Result<(), TransportError>;
    /// Why the device stopped for good, once it has ([`TransportError::DeviceFailed`]);
    /// a driver waiting for used buffers checks it when woken, so it fails at once
    /// instead of at its timeout. `None` by default (a transport that cannot tell).
    fn failure(&self) -> Option<String> {
        None
    }
}

/// A boxed transport is a transport (the driver can then be one type whatever carries it).
impl<T: Transport + ?Sized> Transport for Box<T> {
    fn device_features(&mut self) -> Result<FeatureSet, TransportError> {
        (**self).device_features()
    }
    fn set_driver_features(&mut self, features: FeatureSet) -> Result<(), TransportError> {
        (**self).set_driver_features(features)
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        (**self).write_config(offset, data)
    }
    fn activate(&mut self, queues: &[QueueAddrs]) -> Result<(), TransportError> {
        (**self).activate(queues)
    }
    fn notify(&mut self, index: u16) -> Result<(), TransportError> {
        (**self).notify(index)
    }
    fn reset(&mut self) -> Result<(), TransportError> {
        (**self).reset()
    }
    fn failure(&self) -> Option<String> {
        (**self).failure()
    }
}

/// Used-buffer interrupts as the driver sees them: a counter per queue under one mutex,
/// and a condvar the driver waits on. The device side raises it through
/// [`InterruptSignal`] (in-process: the device thread calls it directly; a VMM would
/// inject an interrupt whose handler calls it).
#[derive(Debug, Default)]
pub struct UsedSignal {
    counts: Mutex<Vec<u64>>,
    cv: Condvar,
}

impl UsedSignal {
    /// A line with no interrupt raised yet.
    pub fn new() -> UsedSignal {
        UsedSignal::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<u64>> {
        zeronce_types::sync::lock(&self.counts)
    }

    /// Interrupts raised for queue `index` so far.
    pub fn count(&self, index: u16) -> u64 {
        self.lock().get(usize::from(index)).copied().unwrap_or(0)
    }

    /// Waits until queue `index` has seen more than `seen` interrupts or `deadline`
    /// passed; returns whether an interrupt came.
    pub fn wait_past(&self, index: u16, seen: u64, deadline: Instant) -> bool {
        let mut counts = self.lock();
        loop {
            if counts.get(usize::from(index)).copied().unwrap_or(0) > seen {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            counts = zeronce_types::sync::wait_timeout(&self.cv, counts, deadline - now);
        }
    }
}

impl InterruptSignal for UsedSignal {
    fn signal_used_queue(&self, queue_index: u16) {
        let mut counts = self.lock();
        let i = usize::from(queue_index);
        if counts.len() <= i {
            counts.resize(i + 1, 0);
        }
        counts[i] += 1;
        self.cv.notify_all();
    }

    fn signal_config_change(&self) {
        // The driver does not inflate: a new target is noted by the device only.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn wait_past_sees_interrupts_per_queue() {
        let s = Arc::new(UsedSignal::new());
        assert_eq!(s.count(3), 0);
        assert!(!s.wait_past(3, 0, Instant::now()), "nothing raised");
        s.signal_used_queue(2);
        assert!(!s.wait_past(3, 0, Instant::now()), "another queue");
        let raiser = Arc::clone(&s);
        let t = std::thread::spawn(move || raiser.signal_used_queue(3));
        assert!(s.wait_past(3, 0, Instant::now() + Duration::from_secs(60)));
        t.join().unwrap();
        assert_eq!(s.count(3), 1);
    }
}
