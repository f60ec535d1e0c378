//! The state file: which pool file is zero, held or dirty, replaced atomically (a
//! temporary file, then `rename`) so that a crash of the daemon leaves either the old or
//! the new record, never a torn one. No `fsync`: what the file describes, the files on
//! hugetlbfs, does not survive a reboot either, and a daemon crash loses nothing that
//! reached the page cache; so a take costs no disk flush.
//!
//! Format (JSON, one object): `{"version":1,"page_bytes":P,"file_bytes":S,
//! "files":{"NAME":"zero"|"held"|"orphaned"|"dirty"},"tokens":{"NAME":"TOKEN"},
//! "token_uids":{"NAME":UID}}`. A record
//! for another page or file size, an unreadable or unparsable file are ignored with a
//! warning: every file is then dirty (not provably zero), which costs zeroing, never
//! correctness. `tokens` (absent in files written before tokens existed) are the secrets
//! of taken files' takes, so a client can still return its file after a restart; the file
//! is created mode 0600 for them. `token_uids` (absent before tokens were bound to their
//! taker's user) are the uids of the connections that took them.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::state::Persisted;

const VERSION: u64 = 1;

/// Why the state file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing the state file {path}: {source}")]
pub struct PersistError {
    /// The file.
    pub path: PathBuf,
    /// The I/O error.
    pub source: std::io::Error,
}

/// The records of a state file, by file name (empty when there is none or it is not
/// usable for this pool).
pub fn load(path: &Path, page_bytes: u64, file_bytes: u64) -> HashMap<String, Persisted> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), %e, "state file unreadable: every file is dirty");
            return HashMap::new();
        }
    };
    match parse(&text, page_bytes, file_bytes) {
        Some(records) => records,
        None => {
            tracing::warn!(path = %path.display(), "state file unusable for this pool: every file is dirty");
            HashMap::new()
        }
    }
}

/// Parses a state file's text; `None` if malformed or for other sizes.
pub fn parse(text: &str, page_bytes: u64, file_bytes: u64) -> Option<HashMap<String, Persisted>> {
    let v: Value = serde_json::from_str(text).ok()?;
    let same = v["version"].as_u64() == Some(VERSION)
        && v["page_bytes"].as_u64() == Some(page_bytes)
        && v["file_bytes"].as_u64() == Some(file_bytes);
    if !same {
        return None;
    }
    v["files"]
        .as_object()?
        .iter()
        .map(|(name, p)| Some((name.clone(), Persisted::from_name(p.as_str()?)?)))
        .collect()
}

/// The tokens of a state file and their takers' uids, by file name (empty when there is
/// none or no usable one; no uid for a token recorded without one).
pub fn load_tokens(path: &Path) -> HashMap<String, (String, Option<u32>)> {
    let Some(v) = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return HashMap::new();
    };
    let Some(tokens) = v["tokens"].as_object() else {
        return HashMap::new();
    };
    let uid = |name: &str| {
        let uid = v["token_uids"][name].as_u64()?;
        u32::try_from(uid).ok()
    };
    tokens
        .iter()
        .filter_map(|(name, t)| Some((name.clone(), (t.as_str()?.to_owned(), uid(name)))))
        .collect()
}

/// The text of a state file, without tokens.
pub fn render<'a>(
    page_bytes: u64,
    file_bytes: u64,
    files: impl IntoIterator<Item = (&'a str, Persisted)>,
) -> String {
    render_with_tokens(page_bytes, file_bytes, files, [])
}

/// The text of a state file, with the tokens of taken files (name, token, taker's uid).
pub fn render_with_tokens<'a>(
    page_bytes: u64,
    file_bytes: u64,
    files: impl IntoIterator<Item = (&'a str, Persisted)>,
    tokens: impl IntoIterator<Item = (&'a str, &'a str, Option<u32>)>,
) -> String {
    let files: Map<String, Value> = files
        .into_iter()
        .map(|(n, p)| (n.to_owned(), Value::from(p.name())))
        .collect();
    let (mut by_name, mut uids) = (Map::new(), Map::new());
    for (name, token, uid) in tokens {
        by_name.insert(name.to_owned(), Value::from(token));
        if let Some(uid) = uid {
            uids.insert(name.to_owned(), Value::from(uid));
        }
    }
    let v = json!({"version": VERSION, "page_bytes": page_bytes, "file_bytes": file_bytes,
        "files": files, "tokens": by_name, "token_uids": uids});
    format!("{v}\n")
}

/// Replaces `path` with `text` atomically (for the daemon's crashes; see the module docs).
pub fn write_atomic(path: &Path, text: &str) -> Result<(), PersistError> {
    let err = |source| PersistError {
        path: path.to_owned(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    // Mode 0600: it holds the tokens that return taken files (a left-over temporary
    // file of another mode is removed first).
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_then_parse_round_trips_and_other_sizes_are_refused() {
        let text = render(
            2 << 20,
            8 << 20,
            [
                ("a", Persisted::Zero),
                ("b", Persisted::Held),
                ("c", Persisted::Dirty),
            ],
        );
        let back = parse(&text, 2 << 20, 8 << 20).unwrap();
        assert_eq!(back["a"], Persisted::Zero);
        assert_eq!(back["b"], Persisted::Held);
        assert_eq!(back["c"], Persisted::Dirty);
        assert!(parse(&text, 1 << 30, 8 << 20).is_none());
        assert!(parse(&text, 2 << 20, 4 << 20).is_none());
        assert!(parse("{\"version\":1", 2 << 20, 8 << 20).is_none());
        let bad = text.replace("\"zero\"", "\"maybe\"");
        assert!(parse(&bad, 2 << 20, 8 << 20).is_none());
    }

    #[test]
    fn write_atomic_replaces_and_load_reads_back() {
        let dir = std::env::temp_dir().join(format!("zeronce-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        assert!(load(&path, 1, 2).is_empty());
        write_atomic(&path, &render(1, 2, [("x", Persisted::Held)])).unwrap();
        write_atomic(&path, &render(1, 2, [("x", Persisted::Zero)])).unwrap();
        assert_eq!(load(&path, 1, 2)["x"], Persisted::Zero);
        assert!(load_tokens(&path).is_empty());
        let text = render_with_tokens(1, 2, [("x", Persisted::Held)], [("x", "ab12", Some(7))]);
        write_atomic(&path, &text).unwrap();
        assert_eq!(load(&path, 1, 2)["x"], Persisted::Held);
        assert_eq!(load_tokens(&path)["x"], ("ab12".to_owned(), Some(7)));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "tokens are secrets");
        std::fs::write(&path, "garbage").unwrap();
        assert!(load(&path, 1, 2).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
