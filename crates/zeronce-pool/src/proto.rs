//! The control protocol: JSON lines over a Unix stream socket (documented for users in
//! `docs/POOL_PROTOCOL.md`). One request per line, one reply line per request; `watch`
//! then streams event lines until the client hangs up.

use serde_json::{json, Value};

/// A request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Take a file of at least `bytes`.
    Take {
        /// Bytes needed.
        bytes: u64,
        /// Pass the file descriptor with the reply (`SCM_RIGHTS`).
        fd: bool,
        /// Wait for a file being zeroed when none is free (else fail at once).
        wait: bool,
        /// Tie the file to this connection: if it closes without a return, the file is
        /// orphaned and reclaimed once no process has it open or mapped.
        lease: bool,
    },
    /// Give a file back.
    Return {
        /// Its path (or name).
        path: String,
        /// The token its take returned: needed on any connection but the one that took
        /// the file.
        token: Option<String>,
    },
    /// Counts and counters.
    Stats,
    /// Zero up to `pages` zeroable pages now.
    Prezero {
        /// Page budget.
        pages: u64,
    },
    /// Stream "zeroable pages appeared" events.
    Watch,
}

/// A request line that could not be understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad request: {0}")]
pub struct BadRequest(pub String);

impl Request {
    /// Parses one line.
    pub fn parse(line: &str) -> Result<Request, BadRequest> {
        let v: Value =
            serde_json::from_str(line).map_err(|e| BadRequest(format!("not JSON: {e}")))?;
        let op = v["op"]
            .as_str()
            .ok_or_else(|| BadRequest("no \"op\" string".into()))?;
        let num = |field: &str| {
            v[field]
                .as_u64()
                .ok_or_else(|| BadRequest(format!("{op}: no unsigned integer \"{field}\"")))
        };
        let flag = |field: &str| v[field].as_bool().unwrap_or(false);
        Ok(match op {
            "take" => Request::Take {
                bytes: num("bytes")?,
                fd: flag("fd"),
                wait: flag("wait"),
                lease: flag("lease"),
            },
            "return" => Request::Return {
                path: v["path"]
                    .as_str()
                    .ok_or_else(|| BadRequest("return: no \"path\" string".into()))?
                    .to_owned(),
                token: match &v["token"] {
                    Value::Null => None,
                    Value::String(t) => Some(t.clone()),
                    _ => return Err(BadRequest("return: \"token\" is not a string".into())),
                },
            },
            "stats" => Request::Stats,
            "prezero" => Request::Prezero {
                pages: num("pages")?,
            },
            "watch" => Request::Watch,
            other => return Err(BadRequest(format!("unknown op {other:?}"))),
        })
    }

    /// As one line (with its newline).
    pub fn to_line(&self) -> String {
        let v = match self {
            Request::Take {
                bytes,
                fd,
                wait,
                lease,
            } => {
                json!({"op": "take", "bytes": bytes, "fd": fd, "wait": wait, "lease": lease})
            }
            Request::Return { path, token: None } => json!({"op": "return", "path": path}),
            Request::Return {
                path,
                token: Some(t),
            } => json!({"op": "return", "path": path, "token": t}),
            Request::Stats => json!({"op": "stats"}),
            Request::Prezero { pages } => json!({"op": "prezero", "pages": pages}),
            Request::Watch => json!({"op": "watch"}),
        };
        format!("{v}\n")
    }
}

/// An error reply: `{"ok":false,"error":KIND,"message":TEXT}`.
pub fn error_reply(kind: &str, message: &str) -> Value {
    json!({"ok": false, "error": kind, "message": message})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_round_trips() {
        let all = [
            Request::Take {
                bytes: 1 << 30,
                fd: true,
                wait: false,
                lease: true,
            },
            Request::Return {
                path: "/mnt/x".into(),
                token: None,
            },
            Request::Return {
                path: "x".into(),
                token: Some("00ff".into()),
            },
            Request::Stats,
            Request::Prezero { pages: 7 },
            Request::Watch,
        ];
        for r in all {
            assert_eq!(Request::parse(r.to_line().trim_end()), Ok(r));
        }
    }

    #[test]
    fn bad_lines_are_typed_errors() {
        for line in [
            "",
            "nope",
            "{}",
            r#"{"op":"take"}"#,
            r#"{"op":"take","bytes":-1}"#,
            r#"{"op":"return"}"#,
            r#"{"op":"return","path":"x","token":7}"#,
            r#"{"op":"fly"}"#,
            r#"{"op":"prezero","pages":"x"}"#,
        ] {
            assert!(Request::parse(line).is_err(), "{line}");
        }
    }
}
