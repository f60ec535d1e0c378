//! The interrupt callback the VMM implements.

use std::sync::Arc;

/// How the device tells the driver something happened: the VMM implements it over its
/// transport (MSI-X / irqfd / MMIO interrupt status).
pub trait InterruptSignal {
    /// Buffers were used on queue `queue_index` (a used buffer notification).
    fn signal_used_queue(&self, queue_index: u16);
    /// The configuration space changed (`num_pages`).
    fn signal_config_change(&self);
}

impl<T: InterruptSignal + ?Sized> InterruptSignal for Arc<T> {
    fn signal_used_queue(&self, queue_index: u16) {
        (**self).signal_used_queue(queue_index)
    }
    fn signal_config_change(&self) {
        (**self).signal_config_change()
    }
}
