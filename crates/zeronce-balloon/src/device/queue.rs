//! Serving a queue notification: popping the available chains, refusing descriptors the
//! device already has, parsing each chain by its queue's kind, and holding or completing
//! the work it asks for.

use std::sync::atomic::Ordering;
use std::time::Instant;

use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::{BalloonDevice, State};
use crate::discard::{hold_deadline, Discarder};
use crate::error::{BalloonError, NotReadyReason};
use crate::features::{Negotiated, QueueKind};
use crate::inflight::{Held, Work};
use crate::interrupt::InterruptSignal;
use crate::options::QueueReport;
use crate::queues::inflate;
use crate::queues::stats;
use crate::queues::{collect_chain, reporting, Desc};
use crate::spec::limits::MAX_PAGES_PER_CALL;
use crate::spec::PFN_PAGE_SIZE;

/// One popped chain: its queue's kind and index, and its head descriptor.
#[derive(Clone, Copy)]
struct Chain {
    kind: QueueKind,
    index: u16,
    head: u16,
}

impl<D, I: InterruptSignal> BalloonDevice<D, I> {
    /// Handles a notification of queue `index` now (see [`Self::process_queue_at`]).
    pub fn process_queue<M>(&mut self, mem: &M, index: u16) -> Result<QueueReport, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        self.process_queue_at(mem, index, Instant::now())
    }

    /// Handles a notification of queue `index` at time `now`: pops the available chains
    /// (at most a queue's worth: [`QueueReport::more`] says to call again), validates and
    /// serves each, uses it (or holds it), and signals the driver. Malformed chains are
    /// logged (rate-limited), counted and used with `used_len` 0; the queue keeps being
    /// served. An available entry naming no descriptor, or a descriptor the device already
    /// holds, is counted and never used (a descriptor is returned exactly once).
    pub fn process_queue_at<M>(
        &mut self,
        mem: &M,
        index: u16,
        now: Instant,
    ) -> Result<QueueReport, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let (kind, neg) = self.ready_queue(mem, index)?;
        let State::Active { queues, .. } = &self.state else {
            unreachable!("checked active above");
        };
        let q = &queues[usize::from(index)];
        let (size, desc_table) = (q.size(), GuestAddress(q.desc_table()));
        // One call serves at most a queue's worth of chains (a guest advancing avail.idx
        // as fast as the device pops cannot keep it here) and about MAX_PAGES_PER_CALL
        // pages of work, and every good chain is completed whatever its neighbours hold.
        let mut report = QueueReport::default();
        let mut taken = vec![false; usize::from(size)];
        let pages_before = self.pages_served();
        let mut drained = false;
        while report.chains < usize::from(size)
            && self.pages_served() - pages_before < MAX_PAGES_PER_CALL
        {
            let Some(head) = self.pop_head(mem, index) else {
                drained = true;
                break;
            };
            report.chains += 1;
            let chain = Chain { kind, index, head };
            let outcome = self
                .take_head(chain, &mut taken)
                .and_then(|()| collect_chain(mem, desc_table, size, head, kind))
                .and_then(|d| self.serve(mem, neg, chain, &d, now));
            match outcome {
                Ok(Some(len)) => report.used.push((head, len)),
                Ok(None) => report.held += 1,
                Err(e) => self.chain_failed(mem, chain, e, &mut report)?,
            }
        }
        report.more = !drained && self.has_available(mem, index);
        self.inflight.end_batch();
        self.push_used(mem, index, &report.used)?;
        Ok(report)
    }

    /// The kind of queue `index` and the negotiated features, if the device is active and
    /// the queue ready; otherwise the refusal, counted and logged.
    fn ready_queue<M: GuestMemoryBackend>(
        &self,
        mem: &M,
        index: u16,
    ) -> Result<(QueueKind, Negotiated), BalloonError> {
        let reason = match &self.state {
            State::Reset => NotReadyReason::FeaturesNotNegotiated,
            State::FeaturesOk(_) => NotReadyReason::DriverNotOk,
            State::Active {
                neg,
                layout,
                queues,
            } => match layout.kind(index) {
                None => return Err(self.refuse(BalloonError::UnknownQueue { index })),
                Some(_) if !queues[usize::from(index)].is_valid(mem) => {
                    NotReadyReason::QueueNotReady
                }
                Some(k) => return Ok((k, *neg)),
            },
        };
        Err(self.refuse(BalloonError::NotReady { index, reason }))
    }

    /// A chain that could not be served: counted and logged, then returned with
    /// `used_len` 0 (a statistics buffer is held instead), unless it has no descriptor to
    /// return (an invalid head) or is returned by whoever already holds it.
    fn chain_failed<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        chain: Chain,
        e: BalloonError,
        report: &mut QueueReport,
    ) -> Result<(), BalloonError> {
        let returnable = !matches!(
            e,
            BalloonError::InvalidHead { .. } | BalloonError::DescriptorInFlight { .. }
        );
        if e.kind().is_some() {
            report.malformed += 1;
            self.refuse(e);
        } else {
            self.failed(1, &e);
        }
        if !returnable {
        } else if chain.kind == QueueKind::Stats {
            self.hold_stats(mem, chain.index, chain.head)?;
            report.held += 1;
        } else {
            report.used.push((chain.head, 0));
        }
        Ok(())
    }

    /// Pops the next available head of queue `index`.
    fn pop_head<M: GuestMemoryBackend>(&mut self, mem: &M, index: u16) -> Option<u16> {
        let State::Active { queues, .. } = &mut self.state else {
            return None;
        };
        queues[usize::from(index)]
            .pop_descriptor_chain(mem)
            .map(|c| c.head_index())
    }

    /// Whether queue `index` has chains available beyond those popped.
    fn has_available<M: GuestMemoryBackend>(&self, mem: &M, index: u16) -> bool {
        let State::Active { queues, .. } = &self.state else {
            return false;
        };
        let q = &queues[usize::from(index)];
        q.avail_idx(mem, Ordering::Acquire)
            .is_ok_and(|i| i.0 != q.next_avail())
    }

    /// Takes the chain's head for this batch, refusing one the device already has: taken
    /// earlier in the batch, held, or the held statistics buffer.
    fn take_head(&self, chain: Chain, taken: &mut [bool]) -> Result<(), BalloonError> {
        let Chain { kind, index, head } = chain;
        let Some(slot) = taken.get_mut(usize::from(head)) else {
            return Ok(()); // an invalid head: the chain walk refuses it
        };
        let stats_token = kind == QueueKind::Stats && self.stats_head == Some(head);
        if *slot || stats_token || self.inflight.is_held(index, head) {
            return Err(BalloonError::DescriptorInFlight { queue: kind, head });
        }
        *slot = true;
        Ok(())
    }

    /// Serves one chain: `Some(used_len)` to use it now, `None` when held. Deflate and
    /// statistics are answered at once; inflate and report requests become [`Work`] that
    /// is checked against what is in flight, then completed now or held.
    fn serve<M>(
        &mut self,
        mem: &M,
        neg: Negotiated,
        chain: Chain,
        descs: &[Desc],
        now: Instant,
    ) -> Result<Option<u32>, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let work = match chain.kind {
            QueueKind::Deflate => return self.serve_deflate(mem, descs),
            QueueKind::Stats => return self.serve_stats(mem, chain, descs),
            QueueKind::FreePageHint => return self.serve_hint(mem, descs),
            QueueKind::Inflate => {
                let req = inflate::parse(mem, chain.kind, descs, neg.inflate_bitmap())?;
                Work::Inflate {
                    pfns: req.pfns,
                    bitmap: req.bitmap.map(|b| b.0),
                }
            }
            QueueKind::Reporting => {
                let r = reporting::plan(mem, &mut self.discarder, descs, chain.kind)?;
                Work::Report {
                    blocks: r.blocks,
                    total_len: r.total_len,
                }
            }
        };
        self.inflight
            .check(chain.kind, &self.ring_ranges(), &work)?;
        self.count_work(&work);
        Ok(self.hold_or_complete(mem, neg, chain, work, now))
    }

    /// A deflate request: used at once with length 0.
    fn serve_deflate<M>(&mut self, mem: &M, descs: &[Desc]) -> Result<Option<u32>, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let req = inflate::parse(mem, QueueKind::Deflate, descs, false)?;
        self.deflate(mem, &req.pfns);
        Ok(Some(0))
    }

    /// A statistics buffer: its entries are applied and the buffer held until the next
    /// [`Self::request_stats`]. A malformed buffer is held by [`Self::chain_failed`].
    fn serve_stats<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        chain: Chain,
        descs: &[Desc],
    ) -> Result<Option<u32>, BalloonError> {
        let entries = stats::parse(mem, descs)?;
        self.hold_stats(mem, chain.index, chain.head)?;
        self.stats.apply(&entries);
        self.metrics.stats_updates.inc();
        Ok(None)
    }

    /// Pages inflated, deflated, reported and hinted so far (the work budget of a call).
    fn pages_served(&self) -> u64 {
        let m = &self.metrics;
        m.pages_inflated.get()
            + m.pages_deflated.get()
            + m.pages_reported.get()
            + m.pages_hinted.get()
    }

    /// Counts the pages an admitted request inflates or reports.
    fn count_work(&self, work: &Work) {
        match work {
            Work::Inflate { pfns, .. } => self.metrics.pages_inflated.add(pfns.len() as u64),
            Work::Report { blocks, .. } => self
                .metrics
                .pages_reported
                .add(blocks.iter().map(|b| b.len / PFN_PAGE_SIZE).sum()),
        }
    }

    /// Holds `work` until its deadline if the policy holds and the budget allows, else
    /// completes it now: `None` when held, else `Some(used_len)`.
    fn hold_or_complete<M>(
        &mut self,
        mem: &M,
        neg: Negotiated,
        chain: Chain,
        work: Work,
        now: Instant,
    ) -> Option<u32>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        self.inflight.admit(&work);
        let deadline =
            hold_deadline(self.options.policy, now).filter(|_| self.inflight.can_hold(&work));
        if let Some(deadline) = deadline {
            let held = Held {
                queue_index: chain.index,
                head: chain.head,
                work,
            };
            self.inflight.hold(deadline, held);
            return None;
        }
        self.inflight.completed();
        Some(self.complete(mem, neg, &work))
    }

    /// The guest ranges `[start, end)` of every active queue's descriptor table,
    /// available ring and used ring (split layout), which the device must never discard.
    pub(super) fn ring_ranges(&self) -> Vec<(u64, u64)> {
        let State::Active { queues, .. } = &self.state else {
            return Vec::new();
        };
        queues
            .iter()
            .flat_map(|q| {
                let n = u64::from(q.size());
                [
                    (q.desc_table(), 16 * n),
                    (q.avail_ring(), 6 + 2 * n),
                    (q.used_ring(), 6 + 8 * n),
                ]
            })
            .map(|(a, l)| (a, a.saturating_add(l)))
            .collect()
    }

    /// Holds stats buffer `head`, returning a previously held one (driver violation).
    fn hold_stats<M: GuestMemoryBackend>(
        &mut self,
        mem: &M,
        index: u16,
        head: u16,
    ) -> Result<(), BalloonError> {
        if let Some(old) = self.stats_head.replace(head) {
            self.refuse(BalloonError::StatsOverflow);
            self.push_used(mem, index, &[(old, 0)])?;
        }
        Ok(())
    }
}
