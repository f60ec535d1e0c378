//! The Prometheus text exposition format (version 0.0.4): a `# HELP` and a `# TYPE`
//! line per metric, then its samples. Counters are named `zeronce_…_total`, with the
//! unit in the name (`_bytes_total`, `_pages_total`).

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

#[cfg(test)]
mod tests {
    use super::*;

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
