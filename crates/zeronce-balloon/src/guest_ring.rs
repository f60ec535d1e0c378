//! The driver side of one split virtqueue in guest memory: what a guest driver writes
//! (descriptor table, available ring) and reads (used ring). The guest balloon driver
//! (crate `zeronce-balloon-driver`), the tests, the fuzz harness and the example all
//! talk to the device through it, over real rings in guest memory. Compiled with the
//! `guest-ring` feature; the raw writers a hostile driver needs (any descriptor, any
//! head, any available index) only with `test-utils`.
//!
//! Descriptors are allocated round-robin, so at most `size` descriptors may be in flight.

use std::sync::atomic::Ordering;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

/// `VIRTQ_DESC_F_NEXT`.
pub const DESC_F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE` (device-writable).
pub const DESC_F_WRITE: u16 = 2;
/// `VIRTQ_DESC_F_INDIRECT` (the buffer is a table of descriptors; never negotiated here).
pub const DESC_F_INDIRECT: u16 = 4;

/// One buffer of a chain the driver adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverBuf {
    /// Guest physical address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Device-writable (an "in" buffer for the driver).
    pub writable: bool,
}

impl DriverBuf {
    /// A device-readable buffer.
    pub fn read(addr: u64, len: u32) -> DriverBuf {
        DriverBuf {
            addr,
            len,
            writable: false,
        }
    }

    /// A device-writable buffer.
    pub fn write(addr: u64, len: u32) -> DriverBuf {
        DriverBuf {
            addr,
            len,
            writable: true,
        }
    }
}

/// Where a queue's rings are, as the driver tells the transport (the queue address
/// registers of virtio-pci / virtio-mmio).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueAddrs {
    /// Queue size (entries).
    pub size: u16,
    /// Descriptor table.
    pub desc: GuestAddress,
    /// Available ring.
    pub avail: GuestAddress,
    /// Used ring.
    pub used: GuestAddress,
}

impl QueueAddrs {
    /// The device-side [`Queue`] for these rings, set ready (what the transport does when
    /// the driver enables the queue). `None` if the size is not a valid queue size.
    pub fn device_queue(&self) -> Option<Queue> {
        let mut q = Queue::new(self.size).ok()?;
        q.set_size(self.size);
        let split = |a: GuestAddress| (Some(a.0 as u32), Some((a.0 >> 32) as u32));
        let (lo, hi) = split(self.desc);
        q.set_desc_table_address(lo, hi);
        let (lo, hi) = split(self.avail);
        q.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(self.used);
        q.set_used_ring_address(lo, hi);
        q.set_ready(true);
        Some(q)
    }
}

/// The driver's side of one split virtqueue.
#[derive(Clone, Debug)]
pub struct DriverQueue {
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    size: u16,
    next_desc: u16,
    avail_idx: u16,
    last_used: u16,
}

impl DriverQueue {
    /// Bytes the rings of a queue of `size` entries take from their base (16-aligned).
    pub fn footprint(size: u16) -> u64 {
        let n = u64::from(size);
        let avail_end = 16 * n + 6 + 2 * n;
        let used = avail_end.div_ceil(4) * 4;
        used + 6 + 8 * n
    }

    /// Lays out a queue of `size` (a power of two ≤ 32768) at `base` and zeroes its rings.
    pub fn new<M: GuestMemory>(
        mem: &M,
        base: GuestAddress,
        size: u16,
    ) -> Result<Self, GuestMemoryError> {
        let n = u64::from(size);
        let avail = GuestAddress(base.0 + 16 * n);
        let used = GuestAddress((avail.0 + 6 + 2 * n).div_ceil(4) * 4);
        mem.write_slice(&vec![0u8; Self::footprint(size) as usize], base)?;
        Ok(DriverQueue {
            desc: base,
            avail,
            used,
            size,
            next_desc: 0,
            avail_idx: 0,
            last_used: 0,
        })
    }

    /// Where the rings are.
    pub fn addrs(&self) -> QueueAddrs {
        QueueAddrs {
            size: self.size,
            desc: self.desc,
            avail: self.avail,
            used: self.used,
        }
    }

    /// The device-side [`Queue`] for these rings, set ready (what the transport would do).
    pub fn device_queue(&self) -> Queue {
        self.addrs().device_queue().expect("valid queue size")
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Writes descriptor `index` verbatim (for hostile chains: loops, bad `next`).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn write_desc<M: GuestMemory>(
        &self,
        mem: &M,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<(), GuestMemoryError> {
        self.write_raw_desc(mem, index, addr, len, flags, next)
    }

    fn write_raw_desc<M: GuestMemory>(
        &self,
        mem: &M,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<(), GuestMemoryError> {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..].copy_from_slice(&next.to_le_bytes());
        let at = GuestAddress(self.desc.0 + 16 * u64::from(index % self.size));
        mem.write_slice(&raw, at)
    }

    /// Adds a chain of `bufs` and makes it available; returns its head index.
    pub fn add_chain<M: GuestMemory>(
        &mut self,
        mem: &M,
        bufs: &[DriverBuf],
    ) -> Result<u16, GuestMemoryError> {
        let head = self.next_desc;
        for (i, b) in bufs.iter().enumerate() {
            let index = (self.next_desc + i as u16) % self.size;
            let last = i + 1 == bufs.len();
            let flags =
                if b.writable { DESC_F_WRITE } else { 0 } | if last { 0 } else { DESC_F_NEXT };
            self.write_raw_desc(mem, index, b.addr, b.len, flags, (index + 1) % self.size)?;
        }
        self.next_desc = (self.next_desc + bufs.len().max(1) as u16) % self.size;
        self.publish_head(mem, head)?;
        Ok(head)
    }

    /// Makes `head` available (advancing the available index), whatever it holds.
    #[cfg(any(test, feature = "test-utils"))]
    pub fn publish<M: GuestMemory>(&mut self, mem: &M, head: u16) -> Result<(), GuestMemoryError> {
        self.publish_head(mem, head)
    }

    fn publish_head<M: GuestMemory>(&mut self, mem: &M, head: u16) -> Result<(), GuestMemoryError> {
        let slot = GuestAddress(self.avail.0 + 4 + 2 * u64::from(self.avail_idx % self.size));
        mem.write_obj(head.to_le(), slot)?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // Release: the device, loading the index with Acquire, sees the entry and its
        // descriptors.
        mem.store(
            self.avail_idx.to_le(),
            GuestAddress(self.avail.0 + 2),
            Ordering::Release,
        )
    }

    /// Sets the raw available index (hostile drivers claim more entries than exist).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn set_avail_idx<M: GuestMemory>(
        &mut self,
        mem: &M,
        idx: u16,
    ) -> Result<(), GuestMemoryError> {
        self.avail_idx = idx;
        mem.write_obj(idx.to_le(), GuestAddress(self.avail.0 + 2))
    }

    /// Takes the used elements `(head, used_len)` added since the last call.
    pub fn take_used<M: GuestMemory>(
        &mut self,
        mem: &M,
    ) -> Result<Vec<(u32, u32)>, GuestMemoryError> {
        // Acquire: pairs with the device's Release store of the used index, so the
        // elements below it are visible.
        let idx = u16::from_le(mem.load::<u16>(GuestAddress(self.used.0 + 2), Ordering::Acquire)?);
        let mut out = Vec::new();
        while self.last_used != idx {
            let at = GuestAddress(self.used.0 + 4 + 8 * u64::from(self.last_used % self.size));
            let id = u32::from_le(mem.read_obj::<u32>(at)?);
            let len = u32::from_le(mem.read_obj::<u32>(GuestAddress(at.0 + 4))?);
            out.push((id, len));
            self.last_used = self.last_used.wrapping_add(1);
        }
        Ok(out)
    }
}
