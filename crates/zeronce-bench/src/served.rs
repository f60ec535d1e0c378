//! The balloon device in a `zeronce serve` child process, reached over vhost-user by
//! zeronce's own driver: what `demo --mode vm --topology vhost-user` and
//! `bench report-path` use.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;
use zeronce::DeviceHost;
use zeronce_vhost::{ServeProcess, VhostUserTransport};

/// A `zeronce serve` child with its socket in a private directory; stopped (SIGTERM) and
/// cleaned up when dropped.
pub struct ServedDevice {
    daemon: Option<ServeProcess>,
    dir: PathBuf,
}

impl ServedDevice {
    /// Starts `zeronce serve` (this program) offering the zero hints or not.
    pub fn start(name: &str, zero_hints: bool) -> Result<ServedDevice, Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("zeronce-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("balloon.sock");
        let args: &[&str] = if zero_hints { &["--zero-hints"] } else { &[] };
        let daemon = ServeProcess::spawn(&std::env::current_exe()?, &socket, args)?;
        Ok(ServedDevice {
            daemon: Some(daemon),
            dir,
        })
    }

    fn daemon(&self) -> &ServeProcess {
        self.daemon.as_ref().expect("running until dropped")
    }

    /// How VM mode reaches it: a vhost-user front-end connection per guest.
    pub fn host(&self) -> DeviceHost {
        let socket = self.daemon().socket().to_owned();
        DeviceHost::External(Arc::new(move |ram, size, irq| {
            Ok(Box::new(VhostUserTransport::connect(&socket, ram, size, irq)?) as _)
        }))
    }

    /// The daemon's counters, from its control socket.
    pub fn metrics(&self) -> serde_json::Value {
        self.daemon()
            .request(&json!({"op": "status"}))
            .map(|s| s["metrics"].clone())
            .unwrap_or_else(|e| json!({ "error": e.to_string() }))
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.daemon().id()
    }
}

impl Drop for ServedDevice {
    fn drop(&mut self) {
        drop(self.daemon.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
