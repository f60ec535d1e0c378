//! A configurable [`ReportingDevice`] for tests (Cargo feature `test-utils`): it answers
//! from a script of [`Answer`]s (then a default one), or hands each call to a closure,
//! and records every call in a [`MockLog`] the test keeps a handle on, even after the
//! device moved into a [`crate::reporting::Reporter`]'s thread.

use crate::reporting::{ReportError, ReportingDevice, ZeroGuarantee};
use crate::types::PageRange;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zeronce_types::sync::lock;

/// What a [`MockDevice`] does with one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Succeeds with this verdict for every block.
    Verdict(ZeroGuarantee),
    /// Fails the whole call.
    Fail,
    /// Panics (a device bug).
    Panic,
}

/// A closure that answers a call in the device's place: the blocks, the verdicts to set.
pub type Respond<'a> =
    Box<dyn FnMut(&[PageRange], &mut [ZeroGuarantee]) -> Result<(), ReportError> + Send + 'a>;

/// Every call a [`MockDevice`] got, shared with the test.
#[derive(Clone, Debug, Default)]
pub struct MockLog(Arc<Mutex<Calls>>);

#[derive(Debug, Default)]
struct Calls {
    reports: Vec<Vec<PageRange>>,
    settles: Vec<Vec<PageRange>>,
}

impl MockLog {
    /// The blocks of every report call, in order.
    pub fn reports(&self) -> Vec<Vec<PageRange>> {
        lock(&self.0).reports.clone()
    }

    /// Report calls so far.
    pub fn report_calls(&self) -> usize {
        lock(&self.0).reports.len()
    }

    /// Every block offered in a settle call, in order.
    pub fn settled(&self) -> Vec<PageRange> {
        lock(&self.0).settles.concat()
    }
}

/// The configurable fake host. Settle calls answer [`Answer::Verdict`] `NotZeroed`
/// (the pre-set verdicts) unless [`MockDevice::on_settle`] says otherwise.
pub struct MockDevice<'a> {
    capacity: usize,
    script: VecDeque<Answer>,
    default: Answer,
    on_report: Option<Respond<'a>>,
    on_settle: Option<Respond<'a>>,
    log: MockLog,
}

impl<'a> MockDevice<'a> {
    /// A device of `capacity` blocks per call answering `verdict` to every report.
    pub fn new(capacity: usize, verdict: ZeroGuarantee) -> Self {
        MockDevice {
            capacity,
            script: VecDeque::new(),
            default: Answer::Verdict(verdict),
            on_report: None,
            on_settle: None,
            log: MockLog::default(),
        }
    }

    /// Answers the next report calls with `answers`, in order, before the default.
    pub fn then(mut self, answers: impl IntoIterator<Item = Answer>) -> Self {
        self.script.extend(answers);
        self
    }

    /// Answers every report call after the script with `answer`.
    pub fn otherwise(mut self, answer: Answer) -> Self {
        self.default = answer;
        self
    }

    /// Queues `answer` for the next report call not yet scripted.
    pub fn push(&mut self, answer: Answer) {
        self.script.push_back(answer);
    }

    /// Hands every report call to `respond` (after logging it) instead of the script.
    pub fn on_report(
        mut self,
        respond: impl FnMut(&[PageRange], &mut [ZeroGuarantee]) -> Result<(), ReportError> + Send + 'a,
    ) -> Self {
        self.on_report = Some(Box::new(respond));
        self
    }

    /// Hands every settle call to `respond` (after logging it).
    pub fn on_settle(
        mut self,
        respond: impl FnMut(&[PageRange], &mut [ZeroGuarantee]) -> Result<(), ReportError> + Send + 'a,
    ) -> Self {
        self.on_settle = Some(Box::new(respond));
        self
    }

    /// A handle on the calls this device gets.
    pub fn log(&self) -> MockLog {
        self.log.clone()
    }
}

impl ReportingDevice for MockDevice<'_> {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn report(
        &mut self,
        _now: Instant,
        blocks: &[PageRange],
        verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), ReportError> {
        // This call's index, from 0.
        let n = {
            let mut calls = lock(&self.log.0);
            calls.reports.push(blocks.to_vec());
            calls.reports.len() - 1
        };
        if let Some(respond) = &mut self.on_report {
            return respond(blocks, verdicts);
        }
        match self.script.pop_front().unwrap_or(self.default) {
            Answer::Verdict(v) => {
                verdicts.fill(v);
                Ok(())
            }
            Answer::Fail => Err(ReportError::new("mock device failure")),
            Answer::Panic => panic!("device panic {n} (intended)"),
        }
    }

    fn settle(
        &mut self,
        _now: Instant,
        blocks: &[PageRange],
        verdicts: &mut [ZeroGuarantee],
    ) -> Result<(), ReportError> {
        lock(&self.log.0).settles.push(blocks.to_vec());
        match &mut self.on_settle {
            Some(respond) => respond(blocks, verdicts),
            None => Ok(()),
        }
    }
}
