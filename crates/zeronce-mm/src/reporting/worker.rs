//! The engine's driver: one background thread that sleeps until a free of reportable order
//! arrives, waits the delay, and runs passes (Linux: the delayed work item).
//!
//! Only std threads, a mutex and a condvar: no syscalls of its own, so it lives here and
//! serves both process mode and VM mode (the balloon driver is just another device).

use super::config::{ReportingConfig, ReportingConfigError};
use super::device::{ReportingDevice, ReportingHooks};
use super::engine::{PassKind, PassReport, ReportingEngine, ReportingStats};
use crate::sync::{lock, wait, wait_timeout};
use crate::types::Order;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Back-off after the first device panic in a background pass; it doubles with each
/// panic in a row, up to [`BACKOFF_MAX`], and resets after a pass that ends normally.
pub(crate) const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// Longest back-off after device panics.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Caught lies logged in full before the log thins out to one line at each doubling.
const LOG_FIRST: u64 = 10;

/// Whether background reporting still runs, and what it caught ([`Reporter::health`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReporterHealth {
    /// The worker thread runs. A device panic in a pass does not end it: the panic is
    /// caught and counted, the pass's isolated blocks go back, and the worker retries
    /// after a back-off (100 ms, doubling, at most 60 s).
    pub worker_alive: bool,
    /// Background passes the device panicked in.
    pub panics: u64,
    /// What the last of them said.
    pub last_panic: Option<String>,
    /// Panics in a row (0 after a pass that ended normally): the back-off's exponent.
    pub panic_streak: u32,
    /// Device answers "zeroed" that verify mode refuted, over every pass (worker,
    /// flush, settle). Each is also in its pass's [`PassReport::put_back_errors`].
    pub lies_caught: u64,
    /// The last device error that stopped a pass.
    pub last_error: Option<String>,
}

/// The text of a panic payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "(not a string)".into())
}

/// Wake-up flags of the worker, under one mutex with its condvar.
#[derive(Debug, Default)]
struct Wake {
    /// A free moved the engine out of IDLE since the worker last looked.
    notified: bool,
    /// The reporter is being dropped.
    shutdown: bool,
}

/// State shared between the reporter handle, the free path and the worker thread. It does
/// not hold the allocator, so the allocator may hold it (through its notifier) without a
/// reference cycle.
struct ReporterState<D> {
    engine: ReportingEngine,
    device: Mutex<D>,
    wake: Mutex<Wake>,
    cv: Condvar,
    health: Mutex<ReporterHealth>,
}

impl<D> ReporterState<D> {
    fn wake(&self, f: impl FnOnce(&mut Wake)) {
        f(&mut lock(&self.wake));
        self.cv.notify_one();
    }

    /// Surfaces what a pass caught: every refuted "zeroed" counted and logged
    /// (rate-limited: the first few, then one line at each doubling of the count).
    fn record(&self, r: &PassReport) {
        let mut h = lock(&self.health);
        for e in &r.put_back_errors {
            h.lies_caught += 1;
            let n = h.lies_caught;
            if n <= LOG_FIRST || n.is_power_of_two() {
                tracing::error!(%e, lies_caught = n, "reporting: the host's answer was false");
            }
        }
        if let Some(e) = &r.error {
            h.last_error = Some(e.to_string());
        }
    }

    /// Counts a device panic in a background pass; returns the back-off to wait.
    fn panicked(&self, p: &(dyn std::any::Any + Send)) -> Duration {
        let mut h = lock(&self.health);
        h.panics += 1;
        h.panic_streak = h.panic_streak.saturating_add(1);
        let msg = panic_message(p);
        let backoff = BACKOFF_FIRST
            .saturating_mul(1u32 << (h.panic_streak - 1).min(16))
            .min(BACKOFF_MAX);
        tracing::error!(panic = %msg, panics = h.panics, ?backoff, "reporting: the device panicked in a pass; retrying after a back-off");
        h.last_panic = Some(msg);
        backoff
    }
}

/// The free-path side of a [`Reporter`]: cheap to clone, callable from any thread.
pub(crate) trait FreeNotify: Send + Sync {
    /// A block of `order` (after merging) became free.
    fn freed(&self, order: Order);
}

impl<D: Send> FreeNotify for ReporterState<D> {
    fn freed(&self, order: Order) {
        // One atomic load unless this free moves the engine out of IDLE.
        if self.engine.notify_free(order) {
            self.wake(|w| w.notified = true);
        }
    }
}

/// A handle on a [`Reporter`]'s free path (see [`Reporter::notifier`]). After the reporter
/// is dropped it only flips the (unused) request state.
#[derive(Clone)]
pub struct Notifier(Arc<dyn FreeNotify>);

impl Notifier {
    /// A block of `order` (after merging) became free: one atomic load unless the engine
    /// is IDLE (no reference counting on the free path).
    pub fn freed(&self, order: Order) {
        self.0.freed(order);
    }
}

/// Free page reporting running in the background for one allocator and one device.
/// Dropping it stops the worker cleanly (a pass in progress completes first).
pub struct Reporter<H: ReportingHooks + Send + Sync + 'static, D: ReportingDevice + 'static> {
    state: Arc<ReporterState<D>>,
    hooks: Arc<H>,
    thread: Option<JoinHandle<()>>,
}

impl<H, D> Reporter<H, D>
where
    H: ReportingHooks + Send + Sync + 'static,
    D: ReportingDevice + 'static,
{
    /// Starts the worker thread. Like Linux's `page_reporting_register`, it requests an
    /// initial pass so memory freed before registration is reported too.
    pub fn start(
        hooks: Arc<H>,
        device: D,
        config: ReportingConfig,
    ) -> Result<Self, ReportingConfigError> {
        Self::start_with(hooks, device, config, || {})
    }

    /// [`Reporter::start`], running `thread_init` first on the worker thread (e.g. to mark
    /// it as one whose allocations must bypass an allocator built on this manager).
    pub fn start_with(
        hooks: Arc<H>,
        device: D,
        config: ReportingConfig,
        thread_init: fn(),
    ) -> Result<Self, ReportingConfigError> {
        if config.order > hooks.max_order() {
            return Err(ReportingConfigError::OrderAboveMax {
                order: config.order,
                max: hooks.max_order(),
            });
        }
        let engine = ReportingEngine::new(config, device.capacity())?;
        let state = Arc::new(ReporterState {
            engine,
            device: Mutex::new(device),
            wake: Mutex::new(Wake::default()),
            cv: Condvar::new(),
            health: Mutex::new(ReporterHealth::default()),
        });
        // Initial request (Linux: __page_reporting_request at register time).
        state.freed(config.order);
        let (worker, worker_hooks) = (Arc::clone(&state), Arc::clone(&hooks));
        let thread = std::thread::Builder::new()
            .name("zeronce-report".into())
            .spawn(move || {
                thread_init();
                worker_loop(&worker, &*worker_hooks)
            })
            .expect("spawning the reporting worker thread");
        Ok(Reporter {
            state,
            hooks,
            thread: Some(thread),
        })
    }

    /// The free-path hook to give the allocator (it does not keep the allocator alive).
    pub fn notifier(&self) -> Notifier {
        Notifier(Arc::clone(&self.state) as Arc<dyn FreeNotify>)
    }

    /// Same as `notifier().freed(order)`.
    pub fn notify_free(&self, order: Order) {
        self.state.freed(order);
    }

    /// Reports now, up to `max_pages` pages, ignoring the delay and the budget; also
    /// settles expired holds first (the report covers both passes). Blocks while a pass
    /// is running.
    pub fn flush(&self, max_pages: u64) -> PassReport {
        let mut dev = lock(&self.state.device);
        let now = Instant::now();
        let engine = &self.state.engine;
        let settled = dev
            .hold_expiry()
            .is_some_and(|t| t <= now)
            .then(|| engine.pass(&*self.hooks, &mut *dev, now, PassKind::Settle));
        let mut r = engine.pass(&*self.hooks, &mut *dev, now, PassKind::Flush { max_pages });
        if let Some(s) = settled {
            r.absorb(s);
        }
        self.state.record(&r);
        r
    }

    /// Runs a settle pass now (held blocks whose hold is over get discarded).
    pub fn settle(&self) -> PassReport {
        let mut dev = lock(&self.state.device);
        let r = self
            .state
            .engine
            .pass(&*self.hooks, &mut *dev, Instant::now(), PassKind::Settle);
        self.state.record(&r);
        r
    }

    /// Whether the worker runs, the device panics it survived, and the lies it caught.
    pub fn health(&self) -> ReporterHealth {
        ReporterHealth {
            worker_alive: self.thread.as_ref().is_some_and(|t| !t.is_finished()),
            ..lock(&self.state.health).clone()
        }
    }

    /// The engine (configuration, phase).
    pub fn engine(&self) -> &ReportingEngine {
        &self.state.engine
    }

    /// Lifetime counters.
    pub fn stats(&self) -> ReportingStats {
        self.state.engine.stats()
    }

    /// Runs `f` on the device (e.g. to read its own counters); waits for a running pass.
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut lock(&self.state.device))
    }
}

impl<H, D> Drop for Reporter<H, D>
where
    H: ReportingHooks + Send + Sync + 'static,
    D: ReportingDevice + 'static,
{
    fn drop(&mut self) {
        self.state.wake(|w| w.shutdown = true);
        if let Some(t) = self.thread.take() {
            // Passes catch device panics; one outside a pass ended the worker early.
            if let Err(p) = t.join() {
                tracing::error!(panic = %panic_message(&*p), "reporting worker had ended by a panic");
            }
        }
    }
}

/// Logs what a background pass did (failures loudly: they are a host or a verify problem).
fn log_pass(r: &PassReport) {
    if let Some(e) = &r.error {
        tracing::warn!(%e, ?r.stats, "report pass stopped: the batch went back unreported");
    }
    tracing::debug!(?r.stats, "report pass");
}

/// Sleep until notified or due, run what is due, repeat; never spins.
fn worker_loop<H: ReportingHooks, D: ReportingDevice>(s: &ReporterState<D>, hooks: &H) {
    loop {
        lock(&s.wake).notified = false;
        let now = Instant::now();
        // A request seen for the first time starts its delay now.
        s.engine.arm(hooks, now);
        // The device lock may be held by a flush for a while: never with the wake lock
        // held, so the free path never waits behind a pass.
        let next = s.engine.next_wakeup(&*lock(&s.device));
        let mut wake = lock(&s.wake);
        if wake.shutdown {
            return;
        }
        if wake.notified {
            // A request arrived while we looked: look again.
            continue;
        }
        match next {
            None => {
                // IDLE and nothing held: sleep until a reportable free or shutdown.
                while !wake.notified && !wake.shutdown {
                    wake = wait(&s.cv, wake);
                }
            }
            Some(t) if t > now => {
                // Delay running: a notify or shutdown may cut it short; then re-evaluate.
                drop(wait_timeout(&s.cv, wake, t - now));
            }
            Some(_) => {
                // Due: run without the wake lock so frees never wait for a pass.
                drop(wake);
                let mut dev = lock(&s.device);
                let now = Instant::now();
                match catch_unwind(AssertUnwindSafe(|| s.engine.run_due(hooks, &mut *dev, now))) {
                    Ok(r) => {
                        lock(&s.health).panic_streak = 0;
                        if let Some(r) = r {
                            log_pass(&r);
                            s.record(&r);
                        }
                    }
                    Err(p) => {
                        // The pass gave its blocks back as it unwound; retry later.
                        drop(dev);
                        let backoff = s.panicked(&*p);
                        s.engine
                            .retry_at(hooks, now.checked_add(backoff).unwrap_or(now));
                        let until = now.checked_add(backoff).unwrap_or(now);
                        let mut wake = lock(&s.wake);
                        while !wake.shutdown && Instant::now() < until {
                            let left = until.saturating_duration_since(Instant::now());
                            wake = wait_timeout(&s.cv, wake, left);
                        }
                    }
                }
            }
        }
    }
}
