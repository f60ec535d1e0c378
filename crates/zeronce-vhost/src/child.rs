//! A `serve` daemon as a child process (for demos, benchmarks and tests that need the
//! device in a process of its own): started, waited for until it listens, stopped with
//! SIGTERM when dropped.

use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use serde_json::Value;

use crate::control::{self, ControlError};

/// A running `PROGRAM serve --socket SOCKET ...`.
#[derive(Debug)]
pub struct ServeProcess {
    child: Option<Child>,
    socket: PathBuf,
    control: PathBuf,
}

impl ServeProcess {
    /// Runs `program serve --socket socket [args]` (`program`: `zeronce` or
    /// `zeronce-vhost`) and waits until it says it listens.
    pub fn spawn(program: &Path, socket: &Path, args: &[&str]) -> io::Result<ServeProcess> {
        let mut child = Command::new(program)
            .arg("serve")
            .arg("--socket")
            .arg(socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?;
        BufReader::new(stdout).read_line(&mut line)?;
        let mut control = socket.as_os_str().to_owned();
        control.push(".ctl");
        let p = ServeProcess {
            child: Some(child),
            socket: socket.to_owned(),
            control: control.into(),
        };
        if !line.contains("listening") {
            return Err(io::Error::other(format!(
                "{} serve did not start: {line:?}",
                program.display()
            )));
        }
        Ok(p)
    }

    /// The vhost-user socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The control socket.
    pub fn control(&self) -> &Path {
        &self.control
    }

    /// One control request ([`control::request`]).
    pub fn request(&self, req: &Value) -> Result<Value, ControlError> {
        control::request(&self.control, req)
    }

    /// The daemon's process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Kills the daemon (SIGKILL: no clean-up; its socket files stay behind).
    pub fn kill(mut self) -> io::Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// Stops the daemon with SIGTERM and returns its exit status.
    pub fn terminate(mut self) -> io::Result<ExitStatus> {
        let mut c = self
            .child
            .take()
            .ok_or_else(|| io::Error::other("already stopped"))?;
        let pid = rustix::process::Pid::from_raw(c.id() as i32)
            .ok_or_else(|| io::Error::other("bad pid"))?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        c.wait()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let _ = c.wait();
        }
    }
}
