//! The command-line verbs `serve` and `balloon`, shared by the `zeronce` program and this
//! crate's own `zeronce-vhost` binary (one definition, two front doors).

use std::io::Write;
use std::path::PathBuf;

use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::{Args, Subcommand};
use serde_json::json;
use zeronce_balloon::{BalloonOptions, DiscardPolicy, FeatureOffer};
use zeronce_daemon::endpoint::{parse_metrics_addr, MetricsAddr};
use zeronce_daemon::AccessArgs;
use zeronce_types::size::parse_size;

use crate::control;
use crate::hub::{Limits, ServeConfig};
use crate::server;

/// `serve`: run the balloon device as a vhost-user back-end.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The vhost-user socket to listen on (the front-end connects to it). A stale socket
    /// of a killed daemon is replaced; a live one, or a path that is not a socket, is
    /// refused.
    #[arg(long)]
    pub socket: PathBuf,
    /// The control socket (default: SOCKET.ctl).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Initial balloon target, e.g. 0, 512M, 1G (a multiple of 4 KiB).
    #[arg(long, default_value = "0", value_parser = parse_page_size)]
    pub target: u64,
    /// Offer DEFLATE_ON_OOM: the guest may take balloon pages back under memory pressure,
    /// and its MemTotal then does not shrink with the balloon.
    #[arg(long)]
    pub deflate_on_oom: bool,
    /// Offer the host-zeroed page hints, feature bits 6 and 7 of the 2026 "skip
    /// redundant zeroing" proposal (not in the virtio specification; guests that do not
    /// know them ignore them).
    #[arg(long)]
    pub zero_hints: bool,
    /// Offer free page hinting (VIRTIO_BALLOON_F_FREE_PAGE_HINT, bit 3): `zeronce balloon
    /// hint` then asks the guest for its free pages and discards them. Off by default: a
    /// stock Linux guest under memory pressure may reuse a hinted block before the device
    /// has discarded it, and loses what it wrote there (RELIABILITY.md).
    #[arg(long)]
    pub free_page_hint: bool,
    /// How long a free page hint run may last, in seconds: a guest that has not sent all
    /// its free pages by then is told to stop (CMD_ID_STOP) and the run's status says
    /// `timed_out`.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub hint_timeout: u64,
    /// Do not offer free page reporting (bit 5): the guest returns free memory only by
    /// inflating or, with --free-page-hint, in hint runs.
    #[arg(long)]
    pub no_page_reporting: bool,
    /// What the host does with the memory the guest reports or inflates (the names
    /// process mode's `ZERONCE_HOST` uses): `immediate` discards it at once; `hold`
    /// keeps it resident for `--hold-ms` and holds the guest's buffer until it is
    /// discarded; `lazy` asks for `MADV_FREE`, which shared guest RAM cannot take: it is
    /// discarded at once, without a zero promise (README, "Host policies").
    #[arg(long, default_value = "immediate", value_parser = PossibleValuesParser::new(DiscardPolicy::NAMES))]
    pub host: String,
    /// With `--host hold`: milliseconds a reported or inflated range stays resident, and
    /// its buffer with the device, before it is discarded and the buffer used.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub hold_ms: u64,
    /// Who may connect to both sockets.
    #[command(flatten)]
    pub access: AccessArgs,
    /// Serve the counters as a Prometheus page (HTTP GET) on this unix socket path or
    /// loopback address (127.0.0.1:PORT); off by default.
    #[arg(long, value_parser = parse_metrics_addr)]
    pub metrics: Option<MetricsAddr>,
}

/// `balloon`: talk to a running `serve` through its control socket.
#[derive(Args, Debug, Clone)]
pub struct BalloonArgs {
    /// The control socket of the daemon.
    #[arg(long)]
    pub socket: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub action: BalloonAction,
}

/// A control action.
#[derive(Subcommand, Debug, Clone)]
pub enum BalloonAction {
    /// Set the balloon target, e.g. `set 512M` (a multiple of 4 KiB; 0 deflates fully).
    Set {
        /// The size.
        #[arg(value_parser = parse_page_size)]
        size: u64,
    },
    /// Print the daemon's state, counters and the guest's last statistics (JSON).
    Status,
    /// Ask the guest for fresh statistics, then print them with the status (JSON).
    Stats,
    /// Start a free page hint run: the guest hints its free pages and the device discards
    /// them (needs `serve --free-page-hint`); the run ends when the guest is done, or
    /// after `serve --hint-timeout`. With `--status`: the latest run's state (idle,
    /// running, done, timed_out), pages hinted and bytes discarded (JSON).
    Hint {
        /// Print the latest run's status instead of starting one.
        #[arg(long)]
        status: bool,
    },
}

/// The value parser of balloon sizes: [`parse_size`] (the one size grammar of zeronce), then checked to be a whole number
/// of 4 KiB pages that `num_pages` can hold, so a bad size is refused naming its option.
pub fn parse_page_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s)?;
    pages(bytes)
        .map_err(|e| format!("{e} (a balloon size is whole 4 KiB pages, e.g. 4K, 512M, 1G)"))?;
    Ok(bytes)
}

/// A size in bytes as a 4 KiB page count.
pub fn pages(bytes: u64) -> Result<u32, String> {
    if !bytes.is_multiple_of(4096) {
        return Err(format!("{bytes} bytes is not a multiple of 4 KiB"));
    }
    u32::try_from(bytes / 4096).map_err(|_| format!("{bytes} bytes: at most 2^32 - 1 pages"))
}

impl ServeArgs {
    /// The control socket: `--control`, or SOCKET.ctl.
    pub fn control_path(&self) -> PathBuf {
        self.control.clone().unwrap_or_else(|| {
            let mut p = self.socket.clone().into_os_string();
            p.push(".ctl");
            PathBuf::from(p)
        })
    }

    /// The host policy of `--host` and `--hold-ms`.
    pub fn policy(&self) -> Result<DiscardPolicy, String> {
        DiscardPolicy::from_name(&self.host, Duration::from_millis(self.hold_ms)).ok_or_else(|| {
            format!(
                "--host {}: one of {}",
                self.host,
                DiscardPolicy::NAMES.join(", ")
            )
        })
    }

    /// What the daemon serves with these options.
    pub fn config(&self) -> Result<ServeConfig, String> {
        // PAGE_POISON is offered: a guest that poisons or initialises freed pages
        // (`init_on_free=1`) negotiates reporting only with it (Linux `virtballoon_validate`).
        // A guest that does neither drops it, and Linux `virtio_uml` then sends SET_FEATURES
        // again, without the vhost-user protocol bit; it then also sends no SET_VRING_ENABLE
        // (rings start enabled, as the vhost-user specification says for that case).
        let mut offer = FeatureOffer {
            deflate_on_oom: self.deflate_on_oom,
            free_page_hint: self.free_page_hint,
            page_reporting: !self.no_page_reporting,
            ..FeatureOffer::default()
        };
        if self.zero_hints {
            offer = offer.with_zero_hints();
        }
        Ok(ServeConfig {
            socket: self.socket.clone(),
            control: self.control_path(),
            balloon: BalloonOptions {
                offer,
                policy: self.policy()?,
                ..BalloonOptions::default()
            },
            num_pages: pages(self.target)?,
            access: self.access.access(),
            limits: Limits {
                hint_run: std::time::Duration::from_secs(self.hint_timeout),
                ..Limits::default()
            },
            metrics: self.metrics.clone(),
        })
    }
}

/// Runs `serve` until SIGINT / SIGTERM.
pub fn serve(args: &ServeArgs) -> Result<(), String> {
    let config = args.config()?;
    let control = config.control.clone();
    server::serve(config, |_| {
        // A reader that has gone (`serve | head -1`) must not stop the daemon.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "zeronce serve: listening on {} (control {})",
            args.socket.display(),
            control.display()
        );
        let _ = out.flush();
    })
    .map_err(|e| e.to_string())
}

/// The control request of a `balloon` action.
pub fn action_request(action: &BalloonAction) -> Result<serde_json::Value, String> {
    Ok(match action {
        BalloonAction::Set { size } => json!({"op": "set", "pages": pages(*size)?}),
        BalloonAction::Status => json!({"op": "status"}),
        BalloonAction::Stats => json!({"op": "stats"}),
        BalloonAction::Hint { status: false } => json!({"op": "hint"}),
        BalloonAction::Hint { status: true } => json!({"op": "hint_status"}),
    })
}

/// Runs one `balloon` action and prints the answer.
pub fn balloon(args: &BalloonArgs) -> Result<(), String> {
    let req = action_request(&args.action)?;
    let answer = control::request(&args.socket, &req).map_err(|e| e.to_string())?;
    let text = serde_json::to_string_pretty(&answer).unwrap_or_default();
    match writeln!(std::io::stdout().lock(), "{text}") {
        // The reader has gone (`balloon status | head -1`): nothing left to do.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units_and_must_be_whole_pages() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err() && parse_size("").is_err());
        assert_eq!(pages(512 << 20), Ok(131072));
        assert!(pages(4097).is_err());
        assert!(pages(1 << 44).is_err());
        assert_eq!(parse_page_size("8K"), Ok(8192));
        assert!(parse_page_size("1000")
            .unwrap_err()
            .contains("not a multiple of 4 KiB"));
    }
}

#[cfg(test)]
mod host_tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn config(extra: &[&str]) -> Result<ServeConfig, String> {
        let argv = [&["serve", "--socket", "/tmp/z.sock"][..], extra].concat();
        Serve::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .args
            .config()
    }

    #[test]
    fn host_policies_are_named_as_process_mode_names_them() {
        let policy = |extra: &[&str]| config(extra).map(|c| c.balloon.policy);
        assert_eq!(policy(&[]), Ok(DiscardPolicy::Immediate), "the default");
        assert_eq!(
            policy(&["--host", "hold", "--hold-ms", "250"]),
            Ok(DiscardPolicy::Hold(Duration::from_millis(250)))
        );
        assert_eq!(
            policy(&["--host", "hold"]),
            Ok(DiscardPolicy::Hold(Duration::from_millis(1000))),
            "--hold-ms defaults to 1 s, as the demo's"
        );
        assert_eq!(policy(&["--host", "lazy"]), Ok(DiscardPolicy::Lazy));
        let bad = policy(&["--host", "later"]).unwrap_err();
        assert!(bad.contains("immediate") && bad.contains("lazy"), "{bad}");
        assert!(policy(&["--host", "hold", "--hold-ms", "600001"]).is_err());
        let c = config(&[]).unwrap();
        assert_eq!(c.control, PathBuf::from("/tmp/z.sock.ctl"));
    }
}
