//! Free page hinting (`VIRTIO_BALLOON_F_FREE_PAGE_HINT`): the operator starts a run (a
//! new `free_page_hint_cmd_id`, a config-change interrupt); the driver sends that id, then
//! its free blocks, then `CMD_ID_STOP`; the device discards every block while the run is
//! current and, at the driver's STOP, sets `CMD_ID_DONE` so the driver frees its blocks.
//! A run the driver does not finish in time is ended by the VMM
//! ([`BalloonDevice::time_out_hint_run`]): the device sets `CMD_ID_STOP` (the spec's "will
//! not be able to make use of the hints"), discards nothing more, and sets `CMD_ID_DONE`
//! at the driver's STOP that ends its sequence, so the driver gives its hinted blocks
//! back to its allocator.
//!
//! A block is discarded while its chain is being served, before the descriptor is used:
//! the driver keeps the block allocated at least until then, unless its shrinker took it
//! back under memory pressure (RELIABILITY.md says what that race means). Blocks that
//! arrive while no run is current are used without a discard.

use vm_memory::GuestMemoryBackend;

use super::BalloonDevice;
use crate::discard::Discarder;
use crate::error::BalloonError;
use crate::features::{Feature, QueueKind};
use crate::inflight::Work;
use crate::interrupt::InterruptSignal;
use crate::queues::hint::{self, HintChain};
use crate::queues::Desc;
use crate::spec::{CMD_ID_DONE, CMD_ID_STOP, PFN_PAGE_SIZE};

/// Where the latest hint run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintState {
    /// No run was started since the device was reset.
    Idle,
    /// A run was started; the driver has not sent STOP yet.
    Running,
    /// The driver sent STOP; the device set DONE.
    Done,
    /// The VMM ended the run before the driver's STOP: the device set STOP (and sets DONE
    /// at the driver's STOP, if it had started hinting).
    TimedOut,
}

impl HintState {
    /// `idle`, `running` or `done`.
    pub fn name(self) -> &'static str {
        match self {
            HintState::Idle => "idle",
            HintState::Running => "running",
            HintState::Done => "done",
            HintState::TimedOut => "timed_out",
        }
    }
}

/// The latest hint run's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HintStatus {
    /// Where the run stands.
    pub state: HintState,
    /// The run's command id (0 before the first run).
    pub cmd_id: u32,
    /// Whether the driver has sent the run's id (it is hinting).
    pub acknowledged: bool,
    /// 4 KiB pages hinted in this run.
    pub pages_hinted: u64,
    /// Bytes discarded in this run.
    pub bytes_discarded: u64,
}

/// The device's side of hint runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct HintRun {
    status: HintStatus,
    /// The id of the next run (≥ 2: 0 and 1 are STOP and DONE).
    next_id: u32,
}

impl Default for HintRun {
    fn default() -> Self {
        HintRun {
            status: HintStatus {
                state: HintState::Idle,
                cmd_id: 0,
                acknowledged: false,
                pages_hinted: 0,
                bytes_discarded: 0,
            },
            next_id: 2,
        }
    }
}

impl HintRun {
    /// Forgets the run (device reset); ids keep counting, so no old id comes back.
    pub(super) fn reset(&mut self) {
        *self = HintRun {
            next_id: self.next_id,
            ..HintRun::default()
        };
    }

    /// The current run's id, if one is running.
    fn current(&self) -> Option<u32> {
        (self.status.state == HintState::Running).then_some(self.status.cmd_id)
    }
}

impl<D, I: InterruptSignal> BalloonDevice<D, I> {
    /// Starts a hint run: a new command id (≥ 2) in the config space and a config-change
    /// interrupt. Returns the id, or `None` when `FREE_PAGE_HINT` is not negotiated. A run
    /// still going is superseded: its blocks still in the queue are no longer discarded.
    pub fn start_hint_run(&mut self) -> Option<u32> {
        if !self.negotiated()?.has(Feature::FreePageHint) {
            return None;
        }
        let id = self.hint.next_id;
        self.hint.next_id = id.checked_add(1).unwrap_or(CMD_ID_DONE + 1);
        self.hint.status = HintStatus {
            state: HintState::Running,
            cmd_id: id,
            acknowledged: false,
            pages_hinted: 0,
            bytes_discarded: 0,
        };
        self.signal_cmd_id(id);
        Some(id)
    }

    /// Ends run `cmd_id` if it is still running (the VMM's time limit on a run): STOP in
    /// the config space, a config-change interrupt, the state [`HintState::TimedOut`].
    /// Blocks that come after are not discarded; the driver's STOP that ends its sequence
    /// then gets DONE. Returns whether the run was ended (false: it had ended already, or
    /// a newer run is current).
    pub fn time_out_hint_run(&mut self, cmd_id: u32) -> bool {
        if self.hint.current() != Some(cmd_id) {
            return false;
        }
        self.hint.status.state = HintState::TimedOut;
        self.signal_cmd_id(CMD_ID_STOP);
        true
    }

    /// The latest hint run's state and figures.
    pub fn hint_status(&self) -> HintStatus {
        self.hint.status
    }

    fn signal_cmd_id(&mut self, id: u32) {
        self.config.set_free_page_hint_cmd_id(id);
        self.metrics.config_changes.inc();
        self.interrupt.signal_config_change();
    }

    /// Serves one free_page_vq chain; it is always used at once, with `used_len` 0.
    pub(super) fn serve_hint<M>(
        &mut self,
        mem: &M,
        descs: &[Desc],
    ) -> Result<Option<u32>, BalloonError>
    where
        M: GuestMemoryBackend,
        D: Discarder<M>,
    {
        let current = self.hint.current();
        match hint::parse(mem, &mut self.discarder, descs)? {
            HintChain::CmdId(CMD_ID_STOP) => {
                // A STOP ends the run the driver acknowledged; one ending an older
                // sequence (the driver saw a new id mid-run) changes nothing. After a
                // timeout, the STOP of the run's sequence gets DONE, once.
                let s = self.hint.status;
                if current.is_some() && s.acknowledged {
                    self.hint.status.state = HintState::Done;
                    self.signal_cmd_id(CMD_ID_DONE);
                } else if s.state == HintState::TimedOut
                    && s.acknowledged
                    && self.config.free_page_hint_cmd_id() == CMD_ID_STOP
                {
                    self.signal_cmd_id(CMD_ID_DONE);
                }
            }
            HintChain::CmdId(id) if Some(id) == current => self.hint.status.acknowledged = true,
            // The driver read the id before the timeout: its blocks are not discarded,
            // its STOP gets DONE.
            HintChain::CmdId(id)
                if self.hint.status.state == HintState::TimedOut
                    && id == self.hint.status.cmd_id =>
            {
                self.hint.status.acknowledged = true;
            }
            HintChain::CmdId(got) => return Err(BalloonError::HintCommandId { got, current }),
            HintChain::Blocks(blocks) if current.is_some() && self.hint.status.acknowledged => {
                let work = Work::Report {
                    blocks,
                    total_len: 0,
                };
                self.inflight
                    .check(QueueKind::FreePageHint, &self.ring_ranges(), &work)?;
                let Work::Report { blocks, .. } = work else {
                    unreachable!("built above")
                };
                let pages: u64 = blocks.iter().map(|b| b.len / PFN_PAGE_SIZE).sum();
                self.metrics.pages_hinted.add(pages);
                let r = self.discard(mem, &blocks, false, "hint discard failed");
                self.hint.status.pages_hinted += pages;
                self.hint.status.bytes_discarded += r.bytes;
            }
            HintChain::Blocks(_) => self.metrics.hints_stale.inc(),
        }
        Ok(Some(0))
    }
}
