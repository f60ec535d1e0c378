//! A client of the control socket (the `zeronce pool` verbs, tests, VMM wrappers).

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use serde_json::Value;

use crate::proto::Request;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached or broke.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The daemon hung up or answered something that is not a JSON line.
    #[error("bad reply from the daemon: {0}")]
    BadReply(String),
    /// The daemon refused the request.
    #[error("{kind}: {message}")]
    Refused {
        /// The error kind (`too_large`, `exhausted`, `not_held`, ...).
        kind: String,
        /// The daemon's message.
        message: String,
    },
}

/// A file taken from the pool.
#[derive(Debug)]
pub struct TakenFile {
    /// Its path.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// `prezeroed` or `zeroed_inline`.
    pub served: String,
    /// The descriptor, when asked for.
    pub fd: Option<OwnedFd>,
    /// The secret that returns the file from another connection ([`Client::return_with_token`]);
    /// empty from a daemon that predates tokens.
    pub token: String,
}

/// A connection to a pool daemon.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    path: PathBuf,
    pending: Vec<u8>,
}

/// How [`Client::take`] takes a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TakeOptions {
    /// Receive the file's descriptor with the reply (`SCM_RIGHTS`).
    pub fd: bool,
    /// Wait for a file being zeroed when none is free.
    pub wait: bool,
    /// Tie the file to this connection: closing it without a return orphans the file,
    /// which the daemon reclaims once no process has it open or mapped.
    pub lease: bool,
}

impl Client {
    /// Connects to the daemon's socket.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(Client {
            stream,
            path: path.to_owned(),
            pending: Vec::new(),
        })
    }

    fn io(&self) -> impl Fn(std::io::Error) -> ClientError + '_ {
        |source| ClientError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Reads one reply line (collecting passed descriptors); refused replies are errors.
    pub fn read_reply(&mut self) -> Result<(Value, Vec<OwnedFd>), ClientError> {
        let mut fds = Vec::new();
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                let v: Value = serde_json::from_slice(&line)
                    .map_err(|e| ClientError::BadReply(e.to_string()))?;
                if v["ok"] == Value::Bool(false) {
                    return Err(ClientError::Refused {
                        kind: v["error"].as_str().unwrap_or("?").to_owned(),
                        message: v["message"].as_str().unwrap_or("").to_owned(),
                    });
                }
                return Ok((v, fds));
            }
            let mut buf = [0u8; 4096];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let got = recvmsg(
                &self.stream,
                &mut [IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(|e| (self.io())(e.into()))?;
            for msg in control.drain() {
                if let RecvAncillaryMessage::ScmRights(passed) = msg {
                    fds.extend(passed);
                }
            }
            if got.bytes == 0 {
                return Err(ClientError::BadReply("connection closed".into()));
            }
            self.pending.extend_from_slice(&buf[..got.bytes]);
        }
    }

    /// Sends a request and reads its reply.
    pub fn request(&mut self, request: &Request) -> Result<(Value, Vec<OwnedFd>), ClientError> {
        use std::io::Write;
        let line = request.to_line();
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| (self.io())(e))?;
        self.read_reply()
    }

    /// Takes a file of at least `bytes`, as `how` says (its descriptor, waiting, a lease
    /// on this connection).
    pub fn take(&mut self, bytes: u64, how: TakeOptions) -> Result<TakenFile, ClientError> {
        let TakeOptions { fd, wait, lease } = how;
        let (v, mut fds) = self.request(&Request::Take {
            bytes,
            fd,
            wait,
            lease,
        })?;
        let path = v["path"]
            .as_str()
            .ok_or_else(|| ClientError::BadReply(format!("take reply without path: {v}")))?;
        Ok(TakenFile {
            path: PathBuf::from(path),
            bytes: v["bytes"].as_u64().unwrap_or(0),
            served: v["served"].as_str().unwrap_or("").to_owned(),
            fd: fds.pop(),
            token: v["token"].as_str().unwrap_or("").to_owned(),
        })
    }

    /// Gives back a file taken on this connection.
    pub fn give_back(&mut self, path: &Path) -> Result<(), ClientError> {
        self.return_file(path, None).map(|_| ())
    }

    /// Gives back a file taken on any connection (a VMM that restarted, a launcher that
    /// exited) with the token its take returned.
    pub fn return_with_token(&mut self, path: &Path, token: &str) -> Result<(), ClientError> {
        self.return_file(path, Some(token)).map(|_| ())
    }

    /// Sends `return` for `path` (with `token`, if any); the daemon's reply (`in_use`:
    /// another process still has the file open or mapped, so the daemon holds it
    /// unzeroed until none has).
    pub fn return_file(&mut self, path: &Path, token: Option<&str>) -> Result<Value, ClientError> {
        let path = path.to_string_lossy().into_owned();
        let token = token.map(str::to_owned);
        self.request(&Request::Return { path, token })
            .map(|(v, _)| v)
    }

    /// The daemon's stats reply.
    pub fn stats(&mut self) -> Result<Value, ClientError> {
        self.request(&Request::Stats).map(|(v, _)| v)
    }

    /// Asks the daemon to zero up to `pages` pages now; its reply.
    pub fn prezero(&mut self, pages: u64) -> Result<Value, ClientError> {
        self.request(&Request::Prezero { pages }).map(|(v, _)| v)
    }

    /// Subscribes to events; then call [`Client::read_reply`] for each event line.
    pub fn watch(&mut self) -> Result<(), ClientError> {
        self.request(&Request::Watch).map(|_| ())
    }
}
