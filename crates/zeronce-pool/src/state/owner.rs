//! Who may return a taken file: its taker. A file taken over the socket belongs to the
//! connection it was taken on and to the holder of the token its take returned (a VMM
//! that restarts, or a launcher that printed the path and exited, presents the token
//! on a new connection) — from the taker's user only: the token is bound to the uid of
//! the connection that took the file (`SO_PEERCRED`), so a token that leaked (a log, a
//! command line another user can read in `/proc`) returns nothing for another local
//! user. Root and the daemon's own user ([`Returner::Trusted`]) may present any token:
//! they can read the state file that records the tokens, so refusing them would defend
//! nothing. Anyone else's return is refused ([`StateError::NotOwner`]):
//! the file may be mapped by a running guest, or about to be. Files recorded held by a
//! state file without a token (written before tokens existed) have no recorded taker
//! and may be returned by anyone, as before.
//!
//! The effect layer also looks, before a return, whether another process still has the
//! file open or mapped (`crate::usage`); such a file is not zeroed but held as orphaned
//! ([`PoolState::return_file`] with `in_use`) until unused, exactly as an orphaned lease.

use super::{taken, FileId, FileState, PoolState, StateError};

/// Who took a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The connection it was taken on (`None`: taken in-process, or recorded before a
    /// restart, when no connection survives).
    pub connection: Option<u64>,
    /// The user of the connection it was taken on (`None`: taken in-process, or recorded
    /// before uids were: the token alone returns it).
    pub uid: Option<u32>,
    /// The secret its take returned (hex), which a return from another connection must
    /// carry.
    pub token: String,
}

/// A client connection a file is taken on: its id and its peer's uid (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The connection's id (the daemon's count).
    pub id: u64,
    /// The uid of its peer.
    pub uid: u32,
}

/// The user a return comes from (its connection's `SO_PEERCRED` uid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Returner {
    /// Root or the daemon's own user: its token returns a file whoever took it.
    Trusted,
    /// Any other user: its token returns only the files this user took.
    Uid(u32),
}

/// Who asks to return a file: the connection asking and the token it presents, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The connection the return arrived on.
    pub connection: u64,
    /// The user the return comes from.
    pub user: Returner,
    /// The token presented with the return.
    pub token: Option<&'a str>,
}

impl Owner {
    /// Whether `claim` comes from this taker: its connection, or its token presented by
    /// its user (or a trusted one).
    pub fn admits(&self, claim: &Claim<'_>) -> bool {
        let same_user = match (claim.user, self.uid) {
            (Returner::Trusted, _) | (_, None) => true,
            (Returner::Uid(uid), Some(taker)) => uid == taker,
        };
        self.connection == Some(claim.connection)
            || (same_user && claim.token.is_some_and(|t| same_secret(t, &self.token)))
    }
}

/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl PoolState {
    /// Records the taker of a file just taken (held). The token is recorded in the state
    /// file, so it stays valid across a restart.
    pub fn set_owner(&mut self, file: FileId, owner: Owner) -> Result<(), StateError> {
        let f = &mut self.files[file.0];
        if f.state != FileState::Held {
            return Err(StateError::NotInState(file, "held"));
        }
        f.owner = Some(owner);
        self.generation += 1;
        Ok(())
    }

    /// A taken file's taker (`None`: free, or taken with no recorded taker).
    pub fn owner(&self, file: FileId) -> Option<&Owner> {
        self.files[file.0].owner.as_ref()
    }

    /// Tokens of taken files and their takers' uids, by name (for the state file).
    pub fn tokens(&self) -> Vec<(&str, &str, Option<u32>)> {
        self.files
            .iter()
            .filter_map(|f| {
                let o = f.owner.as_ref()?;
                Some((f.name.as_str(), o.token.as_str(), o.uid))
            })
            .collect()
    }

    /// Whether `connection` holds a file it took (held or leased).
    pub fn held_by(&self, connection: u64) -> bool {
        self.files.iter().any(|f| {
            matches!(f.state, FileState::Held | FileState::Leased)
                && f.owner
                    .as_ref()
                    .is_some_and(|o| o.connection == Some(connection))
        })
    }

    /// Whether `name` may be returned by `claim` (`None`: the embedding process, which
    /// may return anything): the file must be taken, and `claim` its taker's. Nothing
    /// changes but the count of refused returns.
    pub fn check_return(
        &mut self,
        name: &str,
        claim: Option<&Claim<'_>>,
    ) -> Result<FileId, StateError> {
        let file = self
            .find(name)
            .ok_or_else(|| StateError::Unknown(name.to_owned()))?;
        let f = &self.files[file.0];
        if !taken(&f.state) {
            return Err(StateError::NotHeld(name.to_owned()));
        }
        if let (Some(claim), Some(owner)) = (claim, &f.owner) {
            if !owner.admits(claim) {
                self.counters.returns_refused += 1;
                return Err(StateError::NotOwner(name.to_owned()));
            }
        }
        Ok(file)
    }

    /// `claim` returns `name` (checked as [`PoolState::check_return`]). Unused (`in_use`
    /// false): it becomes dirty work. Still open or mapped by another process: it is held
    /// as orphaned, never zeroed, until [`PoolState::reclaim`] finds it unused.
    pub fn return_file(
        &mut self,
        name: &str,
        claim: Option<&Claim<'_>>,
        in_use: bool,
    ) -> Result<FileId, StateError> {
        let file = self.check_return(name, claim)?;
        self.counters.returns += 1;
        if in_use {
            self.counters.returns_in_use += 1;
            if self.files[file.0].state != FileState::Orphaned {
                self.set(file, FileState::Orphaned);
            }
            // No connection holds it any more: only the token returns it.
            if let Some(o) = &mut self.files[file.0].owner {
                o.connection = None;
            }
            return Ok(file);
        }
        let state = self.unchecked(true);
        self.set(file, state);
        self.work.push_back(file);
        Ok(file)
    }

    /// The embedding process gives `name` back, unused: it becomes dirty work.
    pub fn give_back(&mut self, name: &str) -> Result<FileId, StateError> {
        self.return_file(name, None, false)
    }

    /// Restores the token (and taker's uid) recorded for a taken file at start (no
    /// connection survives a restart); ignored for a file not taken.
    pub fn restore_token(&mut self, file: FileId, token: String, uid: Option<u32>) {
        let f = &mut self.files[file.0];
        if taken(&f.state) {
            f.owner = Some(Owner {
                connection: None,
                uid,
                token,
            });
        }
    }
}
