//! The demo's command line: sizes, backing, mode and the library's knobs, and the checks
//! that the sizes can show what the demo promises (the working set reported and handed
//! back known zero) before anything is mapped.

use crate::exit::UsageError;
use clap::{Args, ValueEnum};
use std::time::Duration;
use zeronce::zeronce_balloon_driver::DriverOptions;
use zeronce::zeronce_mem::{BackingKind, HugePageSize};
use zeronce::zeronce_mm::{MmConfig, PAGE_SIZE};
use zeronce::{BudgetPolicy, DiscardPolicy, Order, ReportingConfig, ReportingSetup, VmDriver};

/// Arguments of `zeronce demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Size of the managed memory, MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: usize,
    /// Working set written, freed and allocated again, MiB (a multiple of 2).
    #[arg(long, default_value_t = 256)]
    pub working_set_mib: usize,
    /// What backs the memory (VM mode needs a file the device can map: anon means memfd).
    #[arg(long, value_enum, default_value_t = DemoBacking::Anon)]
    pub backing: DemoBacking,
    /// Who the host is: this process's kernel, or a virtio-balloon device in a thread.
    #[arg(long, value_enum, default_value_t = DemoMode::Process)]
    pub mode: DemoMode,
    /// VM mode: where the device runs — a thread of this process, or a `zeronce serve`
    /// process reached over vhost-user (the driver is then a vhost-user front-end).
    #[arg(long, value_enum, default_value_t = DemoTopology::Thread)]
    pub topology: DemoTopology,
    /// Smallest block order reported to the host (9 = 2 MiB, Linux's pageblock order).
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u8).range(0..=10))]
    pub reporting_order: u8,
    /// Milliseconds between a free and the reporting pass it triggers (Linux: 2000).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub delay_ms: u64,
    /// How much one pass may report: `adaptive` reports idle memory in one pass, `linux`
    /// about 1/16 of the free memory per pass.
    #[arg(long, value_enum, default_value_t = DemoBudget::Adaptive)]
    pub budget: DemoBudget,
    /// What the host does with reported memory (process mode only).
    #[arg(long, value_enum, default_value_t = DemoHost::Immediate)]
    pub host: DemoHost,
    /// With `--host hold`: milliseconds a reported block stays resident before it is
    /// discarded.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub hold_ms: u64,
    /// Turn the host's "this memory now reads zero" hints off: every reported block comes
    /// back not known zero and the allocator zeroes it again.
    #[arg(long)]
    pub no_zero_hints: bool,
    /// Print one JSON object on stdout instead of the steps.
    #[arg(long)]
    pub json: bool,
    /// Draw resident memory over time (free and report moments marked) into this SVG file.
    #[arg(long, value_name = "FILE.svg", value_parser = zeronce_bench::plot::writable_path)]
    pub plot: Option<std::path::PathBuf>,
}

/// Who receives the reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoMode {
    /// Process mode: the Linux kernel discards the process's memory.
    Process,
    /// VM mode: a virtio-balloon driver reports over split virtqueues in guest RAM to the
    /// device in a thread of this process, which punches holes in the shared memfd.
    Vm,
}

/// Where VM mode's device runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoTopology {
    /// A thread of this process (in-process transport).
    Thread,
    /// A `zeronce serve` child process, over vhost-user.
    VhostUser,
}

/// Backing of the demo's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoBacking {
    /// Private anonymous memory with THP (discard: MADV_DONTNEED).
    Anon,
    /// A shared memfd (discard: punch hole).
    Memfd,
    /// 2 MiB hugetlb pages (needs /proc/sys/vm/nr_hugepages; discard: punch hole).
    Hugetlb,
}

/// Reporting budget ([`BudgetPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoBudget {
    /// Linux's budget: about 16 passes to report an idle system.
    Linux,
    /// All of it at once while the memory is idle, Linux's budget under churn.
    Adaptive,
    /// Everything in one pass, always.
    Unlimited,
}

/// Host policy of process mode ([`DiscardPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoHost {
    /// Discard at once (MADV_DONTNEED / punch hole): the memory reads zero.
    Immediate,
    /// Keep reported memory resident for `--hold-ms`, then discard it.
    Hold,
    /// MADV_FREE: the kernel takes it only under pressure; never known zero.
    Lazy,
}

const MIB: usize = 1 << 20;

/// What the demo runs with, checked.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Bytes of managed memory (VM mode: guest RAM, ring area included).
    pub size: usize,
    /// Working set, bytes.
    pub working_set: usize,
    /// 2 MiB blocks in the working set.
    pub blocks: usize,
    /// Backing of the memory.
    pub backing: BackingKind,
    /// Reporting settings (process mode; VM mode uses `config` and `zero_hints`).
    pub setup: ReportingSetup,
}

impl DemoArgs {
    /// Checks the arguments and turns them into a [`Plan`]; the error is one line for the
    /// user.
    pub fn plan(&self) -> Result<Plan, UsageError> {
        self.check().map_err(UsageError)
    }

    fn check(&self) -> Result<Plan, String> {
        if self.topology == DemoTopology::VhostUser && self.mode != DemoMode::Vm {
            return Err("--topology vhost-user needs --mode vm".into());
        }
        if self.size_mib == 0 {
            return Err(
                "--size-mib 0: the memory zeronce manages must be at least 1 MiB (default 1024)"
                    .into(),
            );
        }
        let size = self
            .size_mib
            .checked_mul(MIB)
            .filter(|s| *s <= isize::MAX as usize)
            .ok_or_else(|| format!("--size-mib {} is too large for this machine", self.size_mib))?;
        if self.working_set_mib == 0 || !self.working_set_mib.is_multiple_of(2) {
            return Err(format!(
                "--working-set-mib {}: the working set is written in 2 MiB blocks, so it must be \
                 a positive multiple of 2 (default 256)",
                self.working_set_mib
            ));
        }
        if self.working_set_mib > self.size_mib {
            return Err(format!(
                "--working-set-mib {} must not exceed --size-mib {}",
                self.working_set_mib, self.size_mib
            ));
        }
        let working_set = self.working_set_mib * MIB;
        if self.mode == DemoMode::Vm && self.host != DemoHost::Immediate {
            return Err(
                "--host applies to process mode; in VM mode the device discards at once".into(),
            );
        }
        let order = Order::new(self.reporting_order).map_err(|e| e.to_string())?;
        let config = ReportingConfig {
            order,
            delay: Duration::from_millis(self.delay_ms),
            budget: match self.budget {
                DemoBudget::Linux => BudgetPolicy::Linux,
                DemoBudget::Adaptive => BudgetPolicy::Adaptive,
                DemoBudget::Unlimited => BudgetPolicy::Unlimited,
            },
            ..ReportingConfig::default()
        };
        let setup = ReportingSetup {
            config,
            policy: match self.host {
                DemoHost::Immediate => DiscardPolicy::Immediate,
                DemoHost::Hold => DiscardPolicy::Hold(Duration::from_millis(self.hold_ms)),
                DemoHost::Lazy => DiscardPolicy::Lazy,
            },
            zero_hints: !self.no_zero_hints,
            ..ReportingSetup::default()
        };
        let backing = match (self.backing, self.mode) {
            // The device maps the guest RAM too: anonymous memory becomes a memfd.
            (DemoBacking::Anon, DemoMode::Vm) | (DemoBacking::Memfd, _) => BackingKind::Memfd,
            (DemoBacking::Anon, DemoMode::Process) => BackingKind::Anonymous { thp: true },
            (DemoBacking::Hugetlb, _) => BackingKind::Hugetlb(HugePageSize::Size2M),
        };
        let page = backing.backing().page_size();
        if !size.is_multiple_of(page) {
            return Err(format!(
                "--size-mib {} is not a multiple of the backing's {} KiB pages",
                self.size_mib,
                page >> 10
            ));
        }
        let managed = match self.mode {
            DemoMode::Process => size,
            DemoMode::Vm => {
                let ring = VmDriver::ring_area_bytes(DriverOptions::default().queue_size)
                    .div_ceil(page as u64) as usize
                    * page;
                size.saturating_sub(ring)
            }
        };
        let fits = managed / (2 * MIB) * 2;
        if self.working_set_mib > fits {
            return Err(format!(
                "--working-set-mib {} does not fit: {} MiB of --size-mib {} are the allocator's \
                 in {} mode (the rest holds the virtqueues), {fits} MiB in 2 MiB blocks",
                self.working_set_mib,
                managed / MIB,
                self.size_mib,
                if self.mode == DemoMode::Vm {
                    "VM"
                } else {
                    "process"
                },
            ));
        }
        let need = min_reporting_size(&config);
        if managed < need {
            return Err(format!(
                "--size-mib {} is too small to show reporting: the reporter leaves memory alone \
                 until at least {} MiB are free (the low watermark plus one batch of {} blocks \
                 of {}); use --size-mib {} or more",
                self.size_mib,
                need / MIB,
                config.capacity,
                config.order,
                (need + size - managed).div_ceil(MIB)
            ));
        }
        Ok(Plan {
            size,
            working_set,
            blocks: working_set / (2 * MIB),
            backing,
            setup,
        })
    }
}

impl DemoArgs {
    /// What backs the memory, in words.
    pub fn plan_backing_name(&self) -> &'static str {
        match (self.backing, self.mode) {
            (DemoBacking::Anon, DemoMode::Process) => "private anonymous (THP)",
            (DemoBacking::Anon | DemoBacking::Memfd, _) => "shared memfd",
            (DemoBacking::Hugetlb, _) => "2 MiB hugetlb",
        }
    }
}

/// The smallest managed size, bytes, whose free memory passes the reporting engine's
/// watermark gate (Linux's: low watermark plus one full batch of reporting-order blocks).
fn min_reporting_size(config: &ReportingConfig) -> usize {
    let batch = (config.capacity as u64) << config.order.get();
    let ok = |pages: u64| pages >= MmConfig::default_low_watermark(pages) + batch;
    let pages = (1..=1u64 << 20)
        .map(|mib| mib * (MIB as u64 / PAGE_SIZE))
        .find(|&p| ok(p))
        .unwrap_or(u64::MAX / 2);
    (pages * PAGE_SIZE) as usize
}
