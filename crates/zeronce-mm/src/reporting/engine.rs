//! The reporting engine: passes over the free lists, modelled on Linux
//! `mm/page_reporting.c` (v16.1 with its rotation and budget patches) plus the "skip redundant zeroing" series'
//! flush. Pure logic: time is a parameter, the device and allocator are traits.

use super::config::{ReportingConfig, ReportingConfigError};
use super::device::{ReportError, ReportingDevice, ReportingHooks, Wanted};
use super::state::{Phase, RequestState};
use crate::error::PutBackError;
use crate::manager::{PutBack, ZeroGuarantee};
use crate::sync::lock;
use crate::types::{Block, Order, PageRange, ZoneId};
use std::sync::Mutex;
use std::time::Instant;

/// What kind of pass to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassKind {
    /// The scheduled pass: per-list budget from the [`super::BudgetPolicy`].
    Scheduled,
    /// Report now, no budget, until nothing unreported is left or `max_pages` pages were
    /// reported (rounded up to whole blocks).
    Flush {
        /// Page limit of the flush.
        max_pages: u64,
    },
    /// Give held blocks (reported, not known zero) back to the device for discard.
    Settle,
}

/// Counters of one pass (and, summed, of the engine's life).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Report (or settle) calls made to the device.
    pub calls: u64,
    /// Blocks the device took.
    pub blocks: u64,
    /// Pages the device took.
    pub pages: u64,
    /// Pages the device answered [`ZeroGuarantee::Zeroed`] for.
    pub zeroed_pages: u64,
    /// Report calls that failed (their blocks went back unreported).
    pub errors: u64,
    /// Free lists left early because their budget was spent.
    pub budget_stops: u64,
    /// Zones skipped by the watermark gate.
    pub gated_zones: u64,
    /// Put-backs the allocator refused or that failed verification (a bug somewhere).
    pub put_back_errors: u64,
}

impl PassStats {
    fn add(&mut self, o: &PassStats) {
        self.calls += o.calls;
        self.blocks += o.blocks;
        self.pages += o.pages;
        self.zeroed_pages += o.zeroed_pages;
        self.errors += o.errors;
        self.budget_stops += o.budget_stops;
        self.gated_zones += o.gated_zones;
        self.put_back_errors += o.put_back_errors;
    }
}

/// Result of one pass (or of the passes one call ran, summed).
#[derive(Debug, Default)]
pub struct PassReport {
    /// What the pass did.
    pub stats: PassStats,
    /// The device error that stopped the pass, if any.
    pub error: Option<ReportError>,
    /// Every put-back failure of the pass, in order: in verify mode, each false "zeroed"
    /// the allocator caught (the block went back reported, not known zero).
    pub put_back_errors: Vec<PutBackError>,
}

impl PassReport {
    /// Adds `other` (a pass run by the same call) into this report; the first device
    /// error is kept.
    pub(crate) fn absorb(&mut self, other: PassReport) {
        self.stats.add(&other.stats);
        self.error = self.error.take().or(other.error);
        self.put_back_errors.extend(other.put_back_errors);
    }
}

/// Lifetime counters of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportingStats {
    /// Scheduled passes run.
    pub passes: u64,
    /// Flushes run.
    pub flushes: u64,
    /// Settle passes run.
    pub settles: u64,
    /// Sum over all passes.
    pub total: PassStats,
    /// Sum over the settle passes alone (part of `total`): blocks already reported, offered
    /// again when their hold ended, so `total` minus this counts each report once.
    pub settled: PassStats,
}

/// When the next scheduled pass is due, and the churn mark for the adaptive budget.
#[derive(Debug, Default)]
struct Schedule {
    /// Deadline of the pending scheduled pass (`None`: not armed).
    due: Option<Instant>,
    /// `reportable_allocs()` when the delay began.
    allocs_mark: u64,
}

/// The reporting engine: request state, schedule and pass logic. One pass at a time: the
/// caller serialises passes by holding the device exclusively (`&mut D`).
#[derive(Debug)]
pub struct ReportingEngine {
    config: ReportingConfig,
    state: RequestState,
    schedule: Mutex<Schedule>,
    stats: Mutex<ReportingStats>,
}

impl ReportingEngine {
    /// An engine for a device that takes at most `device_capacity` blocks per call.
    pub fn new(
        config: ReportingConfig,
        device_capacity: usize,
    ) -> Result<Self, ReportingConfigError> {
        Ok(ReportingEngine {
            config: config.fitted(device_capacity)?,
            state: RequestState::new(),
            schedule: Mutex::new(Schedule::default()),
            stats: Mutex::new(ReportingStats::default()),
        })
    }

    /// The configuration in force (capacity fitted to the device).
    pub fn config(&self) -> &ReportingConfig {
        &self.config
    }

    /// Where the request cycle is.
    #[cfg(test)]
    pub(crate) fn phase(&self) -> Phase {
        self.state.phase()
    }

    /// Lifetime counters.
    pub fn stats(&self) -> ReportingStats {
        *lock(&self.stats)
    }

    /// Free-path hook (Linux `page_reporting_notify_free`): a block of `order` (after
    /// merging) became free. Returns `true` when the caller must wake the worker; costs one
    /// atomic load in the common case.
    pub fn notify_free(&self, order: Order) -> bool {
        // Below the reporting order nothing becomes reportable.
        if order < self.config.order {
            return false;
        }
        self.state.request()
    }

    /// Worker: a request is pending and not yet scheduled → start the delay now and take the
    /// churn mark. Idempotent.
    pub fn arm(&self, hooks: &impl ReportingHooks, now: Instant) {
        let mut s = lock(&self.schedule);
        if s.due.is_none() && self.state.phase() == Phase::Requested {
            // A delay past what the clock can represent: never (passes only on flush).
            s.due = now.checked_add(self.config.delay);
            s.allocs_mark = hooks.reportable_allocs();
        }
    }

    /// The next instant the worker must act at: the pending pass, or the device's earliest
    /// hold expiry. `None`: sleep until notified.
    pub(crate) fn next_wakeup(&self, device: &impl ReportingDevice) -> Option<Instant> {
        let due = lock(&self.schedule).due;
        match (due, device.hold_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Worker: runs whatever is due at `now` (a settle pass for expired holds, then the
    /// scheduled pass). Returns the report of what ran (both passes summed), `None` when
    /// nothing was due.
    pub fn run_due<H: ReportingHooks, D: ReportingDevice>(
        &self,
        hooks: &H,
        device: &mut D,
        now: Instant,
    ) -> Option<PassReport> {
        let settled = device
            .hold_expiry()
            .is_some_and(|t| t <= now)
            .then(|| self.pass(hooks, device, now, PassKind::Settle));
        let quiet = {
            let mut s = lock(&self.schedule);
            match s.due {
                Some(t) if t <= now => s.due = None,
                _ => return settled,
            }
            // Adaptive budget: nothing of reportable order allocated during the delay.
            hooks.reportable_allocs() == s.allocs_mark
        };
        // ACTIVE: a free during the pass turns it REQUESTED and we go again after the delay.
        self.state.begin_pass();
        let mut report = self.pass_inner(hooks, device, now, PassKind::Scheduled, quiet);
        if let Some(settled) = settled {
            report.absorb(settled);
        }
        if self.state.end_pass() {
            // More to do (new frees or a spent budget): Linux reschedules after the delay.
            let mut s = lock(&self.schedule);
            s.due = now.checked_add(self.config.delay);
            s.allocs_mark = hooks.reportable_allocs();
        }
        Some(report)
    }

    /// After a pass panicked (the device panicked in it): the request cycle is left
    /// requested and the next scheduled pass set for `at` (the worker's back-off), so
    /// reporting resumes instead of waiting for a wake that never comes.
    pub(crate) fn retry_at(&self, hooks: &impl ReportingHooks, at: Instant) {
        self.state.set_requested();
        let mut s = lock(&self.schedule);
        s.due = Some(at);
        s.allocs_mark = hooks.reportable_allocs();
    }

    /// Runs one pass of `kind` now, outside the request cycle (flush, settle, tests).
    pub fn pass<H: ReportingHooks, D: ReportingDevice>(
        &self,
        hooks: &H,
        device: &mut D,
        now: Instant,
        kind: PassKind,
    ) -> PassReport {
        self.pass_inner(hooks, device, now, kind, false)
    }

    fn pass_inner<H: ReportingHooks, D: ReportingDevice>(
        &self,
        hooks: &H,
        device: &mut D,
        now: Instant,
        kind: PassKind,
        quiet: bool,
    ) -> PassReport {
        if kind != PassKind::Settle {
            hooks.before_pass();
        }
        let mut run = Pass {
            hooks,
            device,
            now,
            kind,
            cap: self.config.capacity,
            batch: Vec::with_capacity(self.config.capacity),
            deferred: Vec::new(),
            report: PassReport::default(),
            pages_left: match kind {
                PassKind::Flush { max_pages } => max_pages,
                _ => u64::MAX,
            },
        };
        for zone in (0..hooks.zone_count()).map(ZoneId) {
            if run.zone(&self.config, zone, quiet, &self.state).is_err() {
                break;
            }
        }
        let report = std::mem::take(&mut run.report);
        drop(run);
        if kind == PassKind::Settle {
            device.end_settle(now);
        }
        let mut st = lock(&self.stats);
        match kind {
            PassKind::Scheduled => st.passes += 1,
            PassKind::Flush { .. } => st.flushes += 1,
            PassKind::Settle => {
                st.settles += 1;
                st.settled.add(&report.stats);
            }
        }
        st.total.add(&report.stats);
        report
    }
}

/// One pass in progress (Linux: the scatterlist and its offset, carried across free lists).
struct Pass<'a, H: ReportingHooks, D: ReportingDevice> {
    hooks: &'a H,
    device: &'a mut D,
    now: Instant,
    kind: PassKind,
    cap: usize,
    batch: Vec<Block>,
    /// Settle pass: every block the device answered for, put back only once its zone has
    /// been walked. Whatever the verdict, a block put back at once could land on the list
    /// being walked ("not zero", or a "zeroed" that verify mode refutes) and be isolated
    /// again and again, or merge into a larger block offered again: deferred, each block
    /// is offered at most once per pass and the pass ends.
    deferred: Vec<(Block, PutBack)>,
    report: PassReport,
    pages_left: u64,
}

impl<H: ReportingHooks, D: ReportingDevice> Drop for Pass<'_, H, D> {
    /// A batch is empty whenever a pass ends normally; blocks still in it mean the device
    /// panicked while it held them: they go back as after a failed call, never lost.
    fn drop(&mut self) {
        for block in self.batch.drain(..) {
            let _ = self.hooks.put_back(block, PutBack::Failed);
        }
        self.put_back_deferred();
    }
}

/// The pass must stop (device error, or a flush reached its page limit).
struct Stop;

impl<H: ReportingHooks, D: ReportingDevice> Pass<'_, H, D> {
    /// Linux `page_reporting_process_zone`.
    fn zone(
        &mut self,
        cfg: &ReportingConfig,
        zone: ZoneId,
        quiet: bool,
        state: &RequestState,
    ) -> Result<(), Stop> {
        // Linux: low watermark + one full batch of minimum-order blocks, so that reporting
        // never pushes a zone into reclaim.
        let watermark =
            self.hooks.zone_low_watermark(zone) + ((self.cap as u64) << cfg.order.get());
        if cfg.watermark_gate && self.hooks.zone_free_pages(zone) < watermark {
            self.report.stats.gated_zones += 1;
            return Ok(());
        }
        let wanted = match self.kind {
            PassKind::Settle => Wanted::ReportedNotZero,
            _ => Wanted::Unreported,
        };
        let mut result = Ok(());
        for order in cfg.order.up_to(self.hooks.max_order()) {
            result = self.free_list(cfg, zone, order, wanted, quiet, state);
            if result.is_err() {
                break;
            }
        }
        // Linux: report the leftover (partial) batch before leaving the zone.
        if !self.batch.is_empty() {
            result = self.flush_batch().and(result);
        }
        self.put_back_deferred();
        result
    }

    /// Puts back the blocks a settle pass kept aside.
    fn put_back_deferred(&mut self) {
        for (block, how) in std::mem::take(&mut self.deferred) {
            self.put_back(block, how);
        }
    }

    /// Puts one block back, recording a failure (a lie caught in verify mode).
    fn put_back(&mut self, block: Block, how: PutBack) {
        if let Err(e) = self.hooks.put_back(block, how) {
            self.report.stats.put_back_errors += 1;
            self.report.put_back_errors.push(e);
        }
    }

    /// Linux `page_reporting_cycle` for one free list.
    fn free_list(
        &mut self,
        cfg: &ReportingConfig,
        zone: ZoneId,
        order: Order,
        wanted: Wanted,
        quiet: bool,
        state: &RequestState,
    ) -> Result<(), Stop> {
        // Report calls this list may make (Linux: DIV_ROUND_UP(nr_free, CAPACITY * 16) + 1).
        let mut budget = match self.kind {
            PassKind::Scheduled => {
                cfg.budget
                    .calls(self.hooks.nr_free(zone, order), self.cap, quiet)
            }
            _ => u64::MAX,
        };
        loop {
            if self.pages_left == 0 {
                return Err(Stop);
            }
            let room = self.cap - self.batch.len();
            // A flush takes no more whole blocks than its page limit needs.
            let room = room.min(
                self.pages_left
                    .div_ceil(order.pages())
                    .try_into()
                    .unwrap_or(usize::MAX),
            );
            let before = self.batch.len();
            // Isolate from the head of the unreported list; the per-state free lists keep
            // reported blocks apart, so the next unreported block is always at the head
            // (Linux's rotation after a full batch, for free).
            self.hooks
                .isolate(zone, order, wanted, room, &mut self.batch);
            let got = (self.batch.len() - before) as u64;
            self.pages_left = self.pages_left.saturating_sub(got * order.pages());
            if got == 0 {
                // List exhausted: the partial batch carries over to the next list.
                return Ok(());
            }
            if self.batch.len() < self.cap && self.pages_left > 0 {
                continue;
            }
            // Full batch (or flush limit reached): one report call, charged to this list.
            self.flush_batch()?;
            budget -= 1;
            if budget == 0 {
                // Budget spent: Linux sets REQUESTED so the pass resumes after the delay.
                state.set_requested();
                self.report.stats.budget_stops += 1;
                return Ok(());
            }
        }
    }

    /// Reports the batch and drains it back (Linux `report` + `page_reporting_drain`).
    fn flush_batch(&mut self) -> Result<(), Stop> {
        let ranges: Vec<PageRange> = self.batch.iter().map(Block::range).collect();
        let mut verdicts = vec![ZeroGuarantee::NotZeroed; ranges.len()];
        let answer = match self.kind {
            PassKind::Settle => self.device.settle(self.now, &ranges, &mut verdicts),
            _ => self.device.report(self.now, &ranges, &mut verdicts),
        };
        self.report.stats.calls += 1;
        let failed = answer.is_err();
        let mut batch = std::mem::take(&mut self.batch);
        for (block, verdict) in batch.drain(..).zip(verdicts) {
            let how = if failed {
                PutBack::Failed
            } else {
                self.report.stats.blocks += 1;
                self.report.stats.pages += block.order.pages();
                if verdict == ZeroGuarantee::Zeroed {
                    self.report.stats.zeroed_pages += block.order.pages();
                }
                PutBack::Reported(verdict)
            };
            if self.kind == PassKind::Settle {
                self.deferred.push((block, how));
            } else {
                self.put_back(block, how);
            }
        }
        self.batch = batch; // empty, keeps its capacity
        match answer {
            Ok(()) => Ok(()),
            Err(e) => {
                // Linux: on error the pages went back unreported; stop the pass.
                self.report.stats.errors += 1;
                self.report.error = Some(e);
                Err(Stop)
            }
        }
    }
}
