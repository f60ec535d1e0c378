//! Settings from the environment (`ZERONCE_*`), read once, before the first allocation.
//!
//! A value that does not parse gets one line on stderr and the default; nothing here
//! panics. Reading allocates only through Rust's global allocator (mimalloc, never the
//! exported `malloc`), and writes its complaints with `write(2)`.

use std::ffi::OsString;
use std::time::Duration;

use zeronce_lib::{DiscardPolicy, ProcessBackend, ZeroerConfig};

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
    /// `ZERONCE_ZEROER` (threads, 0-64), `ZERONCE_ZEROER_NICE` (-20 to 19, `inherit`) and
    /// `ZERONCE_ZEROER_RATE` (bytes per second, `unlimited`): the background zeroer;
    /// `None` (none set) leaves the backend's default (one thread at nice 10 under
    /// `zero-then-report`, unlimited).
    pub zeroer: Option<ZeroerConfig>,
    /// `ZERONCE_VERIFY=1`: every zero claim checked against memory (slow).
    pub verify: bool,
    /// `ZERONCE_SCAN=0`: a freed large block's pages all count as written, without a look
    /// at the page tables for the ones its holder never wrote (default on).
    pub scan: bool,
    /// `ZERONCE_THP`: `0`, the large arena in 4 KiB pages instead of transparent huge
    /// pages; `1`, in huge pages; `None` (unset): huge pages unless the machine's kernel
    /// reports its free memory to a host (`zeronce::reports_free_memory_to_host`).
    pub thp: Option<bool>,
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
            zeroer: None,
            verify: false,
            scan: true,
            thp: None,
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
        let mut env = Env {
            get: &get,
            complain,
        };
        let threshold = env.read(
            "ZERONCE_THRESHOLD",
            "a size such as 2M, 512K or 1G (4K to 1G: zeronce serves nothing larger)",
            |v| parse_size(v).filter(|b| (4096..=ProcessBackend::LARGEST_BYTES).contains(b)),
        );
        let delay = env
            .read("ZERONCE_DELAY_MS", "milliseconds", |v| v.parse().ok())
            .map_or(d.delay, Duration::from_millis);
        let host = env.read(
            "ZERONCE_HOST",
            "zero-then-report, immediate, hold or lazy",
            |v| match v {
                "zero-then-report" => Some(Host::ZeroThenReport),
                name => DiscardPolicy::from_name(name, delay).map(Host::Discard),
            },
        );
        let threads = env.read("ZERONCE_ZEROER", "a number of threads (0-64)", |v| {
            v.parse().ok().filter(|&n: &usize| n <= 64)
        });
        let nice = env.read(
            "ZERONCE_ZEROER_NICE",
            "a nice value (-20 to 19) or `inherit`",
            |v| match v {
                "inherit" => Some(None),
                _ => Some(Some(v.parse().ok().filter(|n| (-20..=19).contains(n))?)),
            },
        );
        let rate = env.read(
            "ZERONCE_ZEROER_RATE",
            "bytes per second such as 1G or 512M, or `unlimited`",
            |v| match v {
                "unlimited" => Some(None),
                _ => Some(Some(parse_size(v).filter(|&b| b > 0)? as u64)),
            },
        );
        let zeroer = (threads.is_some() || nice.is_some() || rate.is_some()).then(|| {
            let z = ZeroerConfig::default();
            ZeroerConfig {
                threads: threads.unwrap_or(z.threads),
                nice: nice.unwrap_or(z.nice),
                bytes_per_sec: rate.unwrap_or(z.bytes_per_sec),
            }
        });
        Config {
            threshold: threshold.unwrap_or(d.threshold),
            delay,
            host: host.unwrap_or(d.host),
            zeroer,
            verify: env.flag("ZERONCE_VERIFY").unwrap_or(d.verify),
            scan: env.flag("ZERONCE_SCAN").unwrap_or(d.scan),
            thp: env.flag("ZERONCE_THP").or(d.thp),
            show_stats: env.flag("ZERONCE_SHOW_STATS").unwrap_or(d.show_stats),
        }
    }
}

/// The environment being read, and where complaints go.
struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<OsString>,
    complain: &'a mut dyn FnMut(&str),
}

impl Env<'_> {
    /// `name`'s value through `parse`; `None` when unset or empty (`ZERONCE_THP=`, as a
    /// shell's `VAR= program` clears a setting), or (after one complaint saying `what` was
    /// expected) when it does not parse.
    fn read<T>(&mut self, name: &str, what: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
        let value = (self.get)(name).filter(|v| !v.is_empty())?;
        let parsed = value.to_str().and_then(|v| parse(v.trim()));
        if parsed.is_none() {
            bad(self.complain, name, &value.to_string_lossy(), what);
        }
        parsed
    }

    /// A yes/no variable.
    fn flag(&mut self, name: &str) -> Option<bool> {
        self.read(
            name,
            "0 or 1 (no/yes, off/on and false/true too)",
            parse_bool,
        )
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
            ("ZERONCE_SCAN", "0"),
            ("ZERONCE_THP", "0"),
            ("ZERONCE_SHOW_STATS", "yes"),
        ]);
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(c.threshold, 8 << 20);
        assert_eq!(c.delay, Duration::from_millis(250));
        assert_eq!(
            c.host,
            Host::Discard(DiscardPolicy::Hold(Duration::from_millis(250)))
        );
        assert_eq!(c.zeroer.map(|z| z.threads), Some(2));
        assert!(c.verify && c.show_stats && !c.scan);
        assert_eq!(c.thp, Some(false));
    }

    #[test]
    fn an_empty_value_is_unset_without_a_complaint() {
        let (c, lines) = config(&[("ZERONCE_THP", ""), ("ZERONCE_THRESHOLD", "")]);
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(c.thp, None);
        assert_eq!(c.threshold, DEFAULT_THRESHOLD);
        let (_, lines) = config(&[("ZERONCE_THP", " ")]);
        assert_eq!(
            lines.len(),
            1,
            "blanks are a value, and not a valid one: {lines:?}"
        );
    }

    #[test]
    fn the_zeroer_is_set_by_any_of_its_variables() {
        let (c, lines) = config(&[("ZERONCE_ZEROER_NICE", "19")]);
        assert!(lines.is_empty(), "{lines:?}");
        let z = c.zeroer.expect("a zeroer variable was set");
        assert_eq!((z.threads, z.nice, z.bytes_per_sec), (1, Some(19), None));
        let (c, lines) = config(&[
            ("ZERONCE_ZEROER", "3"),
            ("ZERONCE_ZEROER_NICE", "inherit"),
            ("ZERONCE_ZEROER_RATE", "512M"),
        ]);
        assert!(lines.is_empty(), "{lines:?}");
        let z = c.zeroer.expect("zeroer variables were set");
        assert_eq!(
            (z.threads, z.nice, z.bytes_per_sec),
            (3, None, Some(512 << 20))
        );
        let (c, lines) = config(&[("ZERONCE_ZEROER_RATE", "unlimited")]);
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(c.zeroer.map(|z| z.bytes_per_sec), Some(None));
    }

    #[test]
    fn a_threshold_outside_4k_to_the_largest_block_is_refused() {
        for v in ["2K", "2G", "1025M"] {
            let (c, lines) = config(&[("ZERONCE_THRESHOLD", v)]);
            assert_eq!(c.threshold, DEFAULT_THRESHOLD, "{v}");
            assert_eq!(lines.len(), 1, "{v}: {lines:?}");
            assert!(
                lines[0].contains(&format!("ZERONCE_THRESHOLD={v}")),
                "{lines:?}"
            );
        }
        let (c, lines) = config(&[("ZERONCE_THRESHOLD", "1G")]);
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(c.threshold, ProcessBackend::LARGEST_BYTES);
    }

    #[test]
    fn bad_zeroer_values_are_refused_one_line_each() {
        let (c, lines) = config(&[
            ("ZERONCE_ZEROER", "65"),
            ("ZERONCE_ZEROER_NICE", "20"),
            ("ZERONCE_ZEROER_RATE", "0"),
            ("ZERONCE_VERIFY", "maybe"),
        ]);
        assert_eq!(c, Config::default());
        assert_eq!(lines.len(), 4, "{lines:?}");
        for (line, name) in lines.iter().zip([
            "ZERONCE_ZEROER=65",
            "ZERONCE_ZEROER_NICE=20",
            "ZERONCE_ZEROER_RATE=0",
            "ZERONCE_VERIFY=maybe",
        ]) {
            assert!(
                line.starts_with(&format!("zeronce: ignoring {name}: expected")),
                "{line}"
            );
        }
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
