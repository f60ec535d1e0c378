//! Settings from the environment (`ZERONCE_*`), read once, before the first allocation.
//!
//! A value that does not parse gets one line on stderr and the default; nothing here
//! panics. Reading allocates only through Rust's global allocator (mimalloc, never the
//! exported `malloc`), and writes its complaints with `write(2)`.

use std::ffi::OsString;
use std::time::Duration;

use zeronce_lib::{DiscardPolicy, ZeroerConfig};

/// What the environment asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `ZERONCE_THRESHOLD`: sizes from this many bytes up come from zeronce (default 2M).
    pub threshold: usize,
    /// `ZERONCE_DELAY_MS`: how long a freed large block waits before it goes back to the
    /// kernel (the reporting delay, and the hold of `zero-then-report` / `hold`; 2000).
    pub delay: Duration,
    /// `ZERONCE_HOST`: `zero-then-report` (default), `immediate`, `hold` or `lazy`.
    pub host: Host,
    /// `ZERONCE_ZEROER`: background zeroer threads (default: 1 under `zero-then-report`).
    pub zeroer_threads: Option<usize>,
    /// `ZERONCE_VERIFY=1`: every zero claim checked against memory (slow).
    pub verify: bool,
    /// `ZERONCE_SHOW_STATS=1`: counters on stderr at exit.
    pub show_stats: bool,
}

/// What happens to a freed large block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// Zeroed in the background, then given back to the kernel after the delay (the
    /// zero-once lifecycle; `zero-then-report`).
    ZeroThenReport,
    /// Given back to the kernel after the delay, not zeroed first, with this policy
    /// (`immediate`, `hold`, `lazy`).
    Discard(DiscardPolicy),
}

/// The default threshold: 2 MiB, one huge page (the reporting order).
pub const DEFAULT_THRESHOLD: usize = 2 << 20;
const DEFAULT_DELAY: Duration = Duration::from_secs(2);

impl Default for Config {
    fn default() -> Self {
        Config {
            threshold: DEFAULT_THRESHOLD,
            delay: DEFAULT_DELAY,
            host: Host::ZeroThenReport,
            zeroer_threads: None,
            verify: false,
            show_stats: false,
        }
    }
}

impl Config {
    /// From this process's environment; complaints on stderr.
    pub fn from_env() -> Config {
        Config::from_lookup(|name| std::env::var_os(name), &mut |line| {
            crate::stderr::write_stderr(line.as_bytes())
        })
    }

    /// From `get` (a variable's value by name), each bad value told to `complain` as one
    /// line.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<OsString>,
        complain: &mut dyn FnMut(&str),
    ) -> Config {
        let d = Config::default();
        let mut var = |name: &str, what: &str| -> Option<String> {
            let value = get(name)?;
            match value.to_str() {
                Some(v) => Some(v.trim().to_string()),
                None => {
                    bad(complain, name, &value.to_string_lossy(), what);
                    None
                }
            }
        };
        let threshold_what = "a size such as 2M, 512K or 1G (at least 4K)";
        let threshold = var("ZERONCE_THRESHOLD", threshold_what);
        let delay = var("ZERONCE_DELAY_MS", "milliseconds");
        let host_what = "zero-then-report, immediate, hold or lazy";
        let host = var("ZERONCE_HOST", host_what);
        let zeroer = var("ZERONCE_ZEROER", "a number of threads (0-64)");
        let verify = var("ZERONCE_VERIFY", "0 or 1");
        let stats = var("ZERONCE_SHOW_STATS", "0 or 1");
        let mut check = |name: &str, what: &str, value: Option<String>, ok: bool| {
            if let (Some(v), false) = (value, ok) {
                bad(complain, name, &v, what);
            }
        };
        let t = threshold
            .as_deref()
            .and_then(parse_size)
            .filter(|&b| b >= 4096);
        check("ZERONCE_THRESHOLD", threshold_what, threshold, t.is_some());
        let ms = delay.as_deref().and_then(|v| v.parse::<u64>().ok());
        check("ZERONCE_DELAY_MS", "milliseconds", delay, ms.is_some());
        let delay = ms.map_or(d.delay, Duration::from_millis);
        let policy = match host.as_deref() {
            None | Some("zero-then-report") => Some(Host::ZeroThenReport),
            Some(name) => DiscardPolicy::from_name(name, delay).map(Host::Discard),
        };
        check("ZERONCE_HOST", host_what, host, policy.is_some());
        let threads = zeroer
            .as_deref()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n <= 64);
        check(
            "ZERONCE_ZEROER",
            "a number of threads (0-64)",
            zeroer,
            threads.is_some(),
        );
        let v = verify.as_deref().and_then(parse_bool);
        check("ZERONCE_VERIFY", "0 or 1", verify, v.is_some());
        let s = stats.as_deref().and_then(parse_bool);
        check("ZERONCE_SHOW_STATS", "0 or 1", stats, s.is_some());
        Config {
            threshold: t.unwrap_or(d.threshold),
            delay,
            host: policy.unwrap_or(d.host),
            zeroer_threads: threads,
            verify: v.unwrap_or(d.verify),
            show_stats: s.unwrap_or(d.show_stats),
        }
    }

    /// The background zeroer settings, when `ZERONCE_ZEROER` chose a thread count.
    pub fn zeroer(&self) -> Option<ZeroerConfig> {
        self.zeroer_threads.map(|threads| ZeroerConfig {
            threads,
            ..ZeroerConfig::default()
        })
    }
}

/// One line on stderr for a value that does not parse.
fn bad(complain: &mut dyn FnMut(&str), name: &str, value: &str, what: &str) {
    complain(&format!(
        "zeronce: ignoring {name}={value}: expected {what}; using the default\n"
    ));
}

/// `1`, `0`, `yes`, `no`, `true`, `false`, `on`, `off`.
fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" => Some(true),
        "0" | "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// Bytes in the workspace's one size grammar (`zeronce_types::size`: `4096`, `512K`, `2M`,
/// `1G`, `KiB`/`MB` and lower case too); `None` for what does not parse or fit.
pub fn parse_size(v: &str) -> Option<usize> {
    zeronce_types::size::parse_size(v)
        .ok()
        .and_then(|b| usize::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        let mut lines = Vec::new();
        let c = Config::from_lookup(
            |name| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            },
            &mut |l| lines.push(l.to_string()),
        );
        (c, lines)
    }

    #[test]
    fn nothing_set_is_the_default() {
        assert_eq!(config(&[]), (Config::default(), vec![]));
    }

    #[test]
    fn every_variable_is_read() {
        let (c, lines) = config(&[
            ("ZERONCE_THRESHOLD", "8M"),
            ("ZERONCE_DELAY_MS", "250"),
            ("ZERONCE_HOST", "hold"),
            ("ZERONCE_ZEROER", "2"),
            ("ZERONCE_VERIFY", "1"),
            ("ZERONCE_SHOW_STATS", "yes"),
        ]);
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(c.threshold, 8 << 20);
        assert_eq!(c.delay, Duration::from_millis(250));
        assert_eq!(
            c.host,
            Host::Discard(DiscardPolicy::Hold(Duration::from_millis(250)))
        );
        assert_eq!(c.zeroer().map(|z| z.threads), Some(2));
        assert!(c.verify && c.show_stats);
    }

    #[test]
    fn a_bad_value_is_one_line_and_the_default() {
        let (c, lines) = config(&[
            ("ZERONCE_THRESHOLD", "lots"),
            ("ZERONCE_HOST", "cloud"),
            ("ZERONCE_DELAY_MS", "-1"),
        ]);
        assert_eq!(c, Config::default());
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].starts_with("zeronce: ignoring ZERONCE_THRESHOLD=lots: expected"));
        assert!(lines.iter().all(|l| l.ends_with("using the default\n")));
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("512K"), Some(512 << 10));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
    }
}
