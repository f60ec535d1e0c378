//! The control socket's free page hint verbs (`hint`, `hint_status`) and the time limit
//! on a run: the device ends a run its guest has not finished within
//! [`crate::Limits::hint_run`] ([`zeronce_balloon::BalloonDevice::time_out_hint_run`]:
//! `CMD_ID_STOP` in the config space, the status `timed_out`), so a guest that never
//! answers, or never sends its STOP, does not hold a run for ever.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zeronce_balloon::HintState;
use zeronce_types::clock::deadline_after;

use crate::backend::WeakBackend;
use crate::control::error;
use crate::hub::Hub;

/// How often the timer looks whether the run has ended by itself.
const POLL: Duration = Duration::from_millis(50);

/// Starts a hint run on the connected guest's device, and its timer.
pub(crate) fn start(hub: &Hub) -> Value {
    let Some(backend) = hub.backend() else {
        return error("no guest connected");
    };
    let limit = hub.config().limits.hint_run;
    let started = {
        let mut g = backend.lock();
        let dev = g.device();
        let s = dev.hint_status();
        if s.state == HintState::Running {
            return error(&format!(
                "a free page hint run (cmd_id {}) is still running: it ends when the guest \
                 has sent its free pages, or after {} ms; `zeronce balloon hint --status` \
                 shows it",
                s.cmd_id,
                limit.as_millis()
            ));
        }
        dev.start_hint_run()
    };
    let Some(id) = started else {
        return error(
            "the guest did not negotiate free page hinting (is `zeronce serve` run with \
             --free-page-hint?)",
        );
    };
    let weak = backend.downgrade();
    let spawned = std::thread::Builder::new()
        .name("zeronce-hint-timer".into())
        .spawn(move || time_limit(&weak, id, limit));
    if let Err(e) = spawned {
        // Without its timer the run could last for ever: end it now.
        tracing::warn!(error = %e, "cannot time the hint run: ended at once");
        backend.lock().device().time_out_hint_run(id);
        return error(&format!("cannot time the hint run ({e}); it was ended"));
    }
    json!({"ok": true, "cmd_id": id, "timeout_ms": limit.as_millis() as u64})
}

/// Waits until run `id` has ended or `limit` has passed, and then ends it if it still
/// runs. Ends early when the connection's device is gone.
fn time_limit(backend: &WeakBackend, id: u32, limit: Duration) {
    let deadline = deadline_after(Instant::now(), limit);
    while let Some(wait) = tick(backend, id, limit, deadline) {
        std::thread::sleep(wait);
    }
}

/// One look of the timer: `Some(wait)` while run `id` runs and its time is not over;
/// `None` once it has ended (by itself, or now, timed out) or its device is gone.
fn tick(backend: &WeakBackend, id: u32, limit: Duration, deadline: Instant) -> Option<Duration> {
    let b = backend.upgrade()?;
    let mut g = b.lock();
    let dev = g.device();
    let s = dev.hint_status();
    if s.cmd_id != id || s.state != HintState::Running {
        return None;
    }
    let now = Instant::now();
    if now < deadline {
        return Some(POLL.min(deadline - now));
    }
    if dev.time_out_hint_run(id) {
        tracing::warn!(
            cmd_id = id,
            limit_ms = limit.as_millis() as u64,
            acknowledged = s.acknowledged,
            pages_hinted = s.pages_hinted,
            "free page hint run timed out: STOP sent to the guest"
        );
    }
    None
}

/// The connected guest's latest hint run.
pub(crate) fn status(hub: &Hub) -> Value {
    let Some(backend) = hub.backend() else {
        return error("no guest connected");
    };
    let s = backend.lock().device().hint_status();
    json!({
        "ok": true,
        "state": s.state.name(),
        "cmd_id": s.cmd_id,
        "acknowledged": s.acknowledged,
        "pages_hinted": s.pages_hinted,
        "bytes_discarded": s.bytes_discarded,
    })
}
