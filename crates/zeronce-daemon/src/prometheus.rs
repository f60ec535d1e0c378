//! The Prometheus text exposition format (version 0.0.4): a `# HELP` and a `# TYPE`
//! line per metric, then its samples. Counters are named `zeronce_…_total`, with the
//! unit in the name (`_bytes_total`, `_pages_total`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// The type of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A count that only grows (named `…_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
}

/// A metrics page being written.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// An empty page.
    pub fn new() -> Self {
        Self::default()
    }

    fn head(&mut self, name: &str, kind: &str, help: &str) {
        debug_assert!(
            name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "{name}"
        );
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// A counter (a count that only grows); `name` should end in `_total`.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> &mut Self {
        self.head(name, "counter", help);
        let _ = writeln!(self.text, "{name} {value}");
        self
    }

    /// A counter whose value is not a whole number (seconds); `name` should end in
    /// `_total`.
    pub fn counter_f64(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.head(name, "counter", help);
        let _ = writeln!(self.text, "{name} {value}");
        self
    }

    /// A gauge (a value that goes up and down).
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.head(name, "gauge", help);
        let _ = writeln!(self.text, "{name} {value}");
        self
    }

    /// A metric of `kind` with one label, one sample per `(label value, value)`.
    pub fn by_label(
        &mut self,
        kind: Kind,
        name: &str,
        help: &str,
        label: &str,
        samples: &[(&str, f64)],
    ) -> &mut Self {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        self.head(name, kind, help);
        for (l, v) in samples {
            let l = l.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(self.text, "{name}{{{label}=\"{l}\"}} {v}");
        }
        self
    }

    /// The page.
    pub fn finish(self) -> String {
        self.text
    }
}

/// Reads a page back, checking what a scraper relies on: every sample comes after its
/// metric's `# TYPE` (`counter` or `gauge`), a counter's name ends in `_total`, every
/// value is a number, no sample appears twice. The samples by name (with labels, as
/// written: `zeronce_pages{state="free"}`). For tests of the daemons' pages.
pub fn parse(text: &str) -> Result<BTreeMap<String, f64>, String> {
    let mut typed = BTreeSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or(format!("{line:?}: # TYPE NAME KIND"))?;
            if !(kind == "gauge" || kind == "counter" && name.ends_with("_total")) {
                return Err(format!("{line:?}: a gauge, or a counter named ..._total"));
            }
            typed.insert(name.to_owned());
        } else if !line.starts_with("# HELP ") && !line.is_empty() {
            let (key, value) = line
                .rsplit_once(' ')
                .ok_or(format!("{line:?}: NAME VALUE"))?;
            let name = key.split('{').next().unwrap_or(key);
            if !typed.contains(name) {
                return Err(format!("{line:?}: a sample before its # TYPE"));
            }
            let value = value
                .parse()
                .map_err(|_| format!("{line:?}: not a number"))?;
            if samples.insert(key.to_owned(), value).is_some() {
                return Err(format!("{line:?}: a sample twice"));
            }
        }
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_reads_back_and_bad_ones_are_refused() {
        let mut e = Exposition::new();
        e.counter("zeronce_x_total", "X.", 3).by_label(
            Kind::Gauge,
            "zeronce_pages",
            "Pages.",
            "state",
            &[("free", 2.0)],
        );
        let page = parse(&e.finish()).unwrap();
        assert_eq!(page["zeronce_x_total"], 3.0);
        assert_eq!(page["zeronce_pages{state=\"free\"}"], 2.0);
        assert!(parse("zeronce_y 1\n").is_err());
        assert!(parse("# TYPE zeronce_y counter\nzeronce_y 1\n").is_err());
        assert!(parse("# TYPE zeronce_y gauge\nzeronce_y x\n").is_err());
        assert!(parse("# TYPE zeronce_y gauge\nzeronce_y 1\nzeronce_y 2\n").is_err());
    }

    #[test]
    fn help_type_and_samples_in_order() {
        let mut e = Exposition::new();
        e.counter("zeronce_x_total", "X seen.\nTwo lines", 3)
            .gauge("zeronce_up", "Up.", 1.0)
            .by_label(
                Kind::Gauge,
                "zeronce_pages",
                "Pages.",
                "state",
                &[("free", 2.0), ("a\"b", 0.5)],
            );
        assert_eq!(
            e.finish(),
            "# HELP zeronce_x_total X seen.\\nTwo lines\n# TYPE zeronce_x_total counter\n\
             zeronce_x_total 3\n# HELP zeronce_up Up.\n# TYPE zeronce_up gauge\nzeronce_up 1\n\
             # HELP zeronce_pages Pages.\n# TYPE zeronce_pages gauge\n\
             zeronce_pages{state=\"free\"} 2\nzeronce_pages{state=\"a\\\"b\"} 0.5\n"
        );
    }
}
