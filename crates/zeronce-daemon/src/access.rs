//! Who may reach a daemon's sockets: the file's mode and group ([`SocketOptions`]) and
//! the peers allowed in ([`PeerPolicy`]), and the command-line options that set them,
//! the same for both daemons ([`AccessArgs`]).

use clap::Args;

use crate::peer::PeerPolicy;
use crate::socket::SocketOptions;

/// The access rules of a daemon's sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The socket files' mode and group.
    pub socket: SocketOptions,
    /// Who may talk to the daemon once connected (`SO_PEERCRED`).
    pub peers: PeerPolicy,
}

impl Default for Access {
    /// Mode 0600, the daemon's user and root only.
    fn default() -> Self {
        Access {
            socket: SocketOptions::default(),
            peers: PeerPolicy::current_user(),
        }
    }
}

/// `--socket-mode`, `--socket-group`, `--allow-uid`, `--allow-gid`.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessArgs {
    /// Permission bits of the socket files, in octal (default 0600: only the daemon's
    /// user; the umask does not apply).
    #[arg(long, value_parser = parse_mode)]
    pub socket_mode: Option<u32>,
    /// Group (numeric gid) of the socket files; with --socket-mode 0660 its members may
    /// connect, and they are allowed in as peers.
    #[arg(long)]
    pub socket_group: Option<u32>,
    /// Also allow peers running as this uid (repeatable; root and the daemon's own user
    /// are always allowed).
    #[arg(long = "allow-uid")]
    pub allow_uid: Vec<u32>,
    /// Also allow peers whose primary group is this gid (repeatable).
    #[arg(long = "allow-gid")]
    pub allow_gid: Vec<u32>,
}

impl AccessArgs {
    /// The access rules the options ask for.
    pub fn access(&self) -> Access {
        let mut gids = self.allow_gid.clone();
        gids.extend(self.socket_group);
        Access {
            socket: SocketOptions {
                mode: self.socket_mode.unwrap_or(SocketOptions::default().mode),
                group: self.socket_group,
            },
            peers: PeerPolicy::current_user().allowing(&self.allow_uid, &gids),
        }
    }
}

/// An octal permission mode (`600`, `0660`, `0o600`), at most 0777.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    let mode = u32::from_str_radix(digits, 8)
        .map_err(|_| format!("{s:?} is not an octal mode such as 0600"))?;
    if mode > 0o777 {
        return Err(format!("{s:?}: a socket mode is at most 0777"));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_and_the_group_is_allowed_in() {
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0o640"), Ok(0o640));
        assert!(parse_mode("0800").is_err() && parse_mode("1777").is_err());
        let a = AccessArgs {
            socket_mode: Some(0o660),
            socket_group: Some(4321),
            ..AccessArgs::default()
        }
        .access();
        assert_eq!(
            a.socket,
            SocketOptions {
                mode: 0o660,
                group: Some(4321)
            }
        );
        let member = crate::peer::Peer {
            pid: 1,
            uid: 99_999,
            gid: 4321,
        };
        assert!(a.peers.allows(&member));
        assert_eq!(AccessArgs::default().access(), Access::default());
    }
}
