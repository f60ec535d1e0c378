//! What the harness checks beyond "nothing panicked": every descriptor is returned at
//! most as often as the device popped it from the available ring, and every zero promise (an inflate
//! bitmap bit, a reporting `used_len` under bit 6) is true in guest memory when the
//! descriptor comes back (the recording discarder really writes the zeros).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::mutation::Applied;
use super::QUEUE_SIZE;
use crate::features::QueueKind;
use crate::spec::PFN_PAGE_SIZE;

/// What a well-formed request promised to check when it is used.
#[derive(Clone, Debug)]
pub(super) enum Promise {
    /// An inflate with its PFNs (array at `arr`), the bitmap the device writes, and per
    /// PFN the value the guest wrote over it during the call (`alt`, else the same): the
    /// device read one or the other, and a set bit promises that page zero.
    Inflate {
        pfns: Vec<u32>,
        alt: Vec<u32>,
        arr: u64,
        bitmap: u64,
    },
    /// A report of these blocks `(gpa, len)`; a `used_len` of `total` promises all zero.
    Report { blocks: Vec<(u64, u64)>, total: u32 },
}

/// Per queue: heads popped and not yet used, and the promises recorded per head.
#[derive(Debug, Default)]
pub(super) struct Oracle {
    avail: Vec<[u32; QUEUE_SIZE as usize]>,
    promises: Vec<Vec<Option<Promise>>>,
    /// Promises checked (the harness is not vacuous).
    pub checked: usize,
}

impl Oracle {
    /// Fresh queues (`n` of them).
    pub fn reset(&mut self, n: usize) {
        self.avail = vec![[0; QUEUE_SIZE as usize]; n];
        self.promises = vec![vec![None; usize::from(QUEUE_SIZE)]; n];
    }

    /// The device read `head` from queue `q`'s available ring (the guest made it
    /// available once more). Counted when read, not when the guest wrote it: a guest
    /// moving `avail.idx` back and forth exposes stale entries again.
    pub fn popped(&mut self, q: usize, head: u16) {
        if let Some(n) = self
            .avail
            .get_mut(q)
            .and_then(|a| a.get_mut(usize::from(head)))
        {
            *n += 1;
        }
    }

    /// How many times `head` of queue `q` was popped and not yet used.
    pub fn outstanding(&self, q: usize, head: u16) -> u32 {
        self.avail
            .get(q)
            .and_then(|a| a.get(usize::from(head)))
            .copied()
            .unwrap_or(0)
    }

    /// Records what `head` of queue `q` promises when used, if its use can only be the
    /// request just written: the head was not in flight before the notification
    /// (`before` pops outstanding: 0) and was popped exactly once by it. A head the
    /// device still held when the guest published it again is refused and never used;
    /// the use that follows is the held request's, with its own promise.
    pub fn expect(&mut self, q: usize, head: u16, before: u32, p: Promise) {
        if before != 0 || self.outstanding(q, head) != 1 {
            return;
        }
        if let Some(slot) = self
            .promises
            .get_mut(q)
            .and_then(|v| v.get_mut(usize::from(head)))
        {
            *slot = Some(p);
        }
    }

    /// Forgets every recorded promise (the guest rewrote buffers or descriptors).
    pub fn forget(&mut self) {
        for v in &mut self.promises {
            v.fill(None);
        }
    }

    /// The guest overwrote a word during a call on queue `q` that popped `batch`
    /// ([`Applied`]). A rewritten PFN of a batch request's array becomes its alternative
    /// (the device read the old or the new value); a promise whose zero pages or bitmap
    /// hold the word is dropped (the guest wrote there itself), and so is every promise
    /// of `q` when the word was a descriptor (the chain the device walked is unknown).
    pub fn mutated(&mut self, q: usize, batch: &[u16], a: Applied) {
        let page = a.at / PFN_PAGE_SIZE;
        for (qi, v) in self.promises.iter_mut().enumerate() {
            for (head, slot) in v.iter_mut().enumerate() {
                let this_batch = qi == q && batch.contains(&(head as u16));
                let keep = match slot.as_mut() {
                    None => true,
                    Some(_) if a.desc => qi != q,
                    Some(Promise::Inflate {
                        pfns,
                        alt,
                        arr,
                        bitmap,
                    }) => {
                        let n = pfns.len() as u64;
                        if this_batch && (*arr..*arr + 4 * n).contains(&a.at) {
                            alt[((a.at - *arr) / 4) as usize] = a.new;
                        }
                        let on_page = |p: &u32| u64::from(*p) == page;
                        let bitmap_hit = a.at + 4 > *bitmap && a.at < *bitmap + n.div_ceil(8);
                        !(bitmap_hit || pfns.iter().any(on_page) || alt.iter().any(on_page))
                    }
                    Some(Promise::Report { blocks, .. }) => {
                        !blocks.iter().any(|&(g, l)| a.at + 4 > g && a.at < g + l)
                    }
                };
                if !keep {
                    *slot = None;
                }
            }
        }
    }

    /// The device used `id` on queue `q` with `len`: it was popped, and what its
    /// request promised holds in `mem`.
    pub fn used(
        &mut self,
        mem: &GuestMemoryMmap,
        q: usize,
        kind: Option<QueueKind>,
        id: u32,
        len: u32,
    ) {
        assert!(id < u32::from(QUEUE_SIZE), "used id {id} out of the table");
        let head = id as usize;
        let n = &mut self.avail[q][head];
        assert!(
            *n > 0,
            "queue {q}: descriptor {id} returned more often than it was popped"
        );
        *n -= 1;
        let Some(p) = self.promises[q][head].take() else {
            return;
        };
        match (kind, p) {
            (
                Some(QueueKind::Inflate),
                Promise::Inflate {
                    pfns, alt, bitmap, ..
                },
            ) if len > 0 => {
                let mut bytes = vec![0u8; len as usize];
                mem.read_slice(&mut bytes, GuestAddress(bitmap))
                    .expect("bitmap in RAM");
                for (i, pfn) in pfns.iter().enumerate() {
                    if bytes.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0) {
                        let zero =
                            |p: u32| reads_zero(mem, u64::from(p) * PFN_PAGE_SIZE, PFN_PAGE_SIZE);
                        assert!(
                            zero(*pfn) || zero(alt[i]),
                            "inflate bit {i} promised PFN {pfn:#x} (or {:#x} written over it during the call) zero; it is not", alt[i]
                        );
                    }
                }
                self.checked += 1;
            }
            (Some(QueueKind::Reporting), Promise::Report { blocks, total }) if len == total => {
                for (gpa, l) in blocks {
                    assert!(
                        reads_zero(mem, gpa, l),
                        "used_len {len} promised {gpa:#x}+{l:#x} zero; it is not"
                    );
                }
                self.checked += 1;
            }
            _ => {}
        }
    }
}

fn reads_zero(mem: &GuestMemoryMmap, gpa: u64, len: u64) -> bool {
    let mut buf = vec![0u8; len as usize];
    mem.read_slice(&mut buf, GuestAddress(gpa)).is_ok() && buf.iter().all(|&b| b == 0)
}
