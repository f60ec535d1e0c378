//! Targets and the one way every benchmark says whether a figure met its own row's target.

use serde_json::{json, Value};

/// A figure's target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// The figure must be at least this.
    AtLeast(f64),
    /// The figure must be at most this.
    AtMost(f64),
}

impl Target {
    /// Whether `value` meets the target (NaN never does).
    pub fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }

    /// "≥ 2" / "≤ 0.1".
    pub fn describe(self) -> String {
        match self {
            Target::AtLeast(t) => format!("≥ {t}"),
            Target::AtMost(t) => format!("≤ {t}"),
        }
    }

    /// "target ≥ 2: met" / "target ≥ 2: NOT MET".
    pub fn verdict(self, value: f64) -> String {
        format!(
            "target {}: {}",
            self.describe(),
            if self.met(value) { "met" } else { "NOT MET" }
        )
    }

    /// `{"target": "≥ 2", "met": true}`.
    pub fn to_json(self, value: f64) -> Value {
        json!({ "target": self.describe(), "met": self.met(value) })
    }
}

/// The verdict column of a row that may have no target: its verdict or "no target".
pub fn verdict(target: Option<Target>, value: f64) -> String {
    target.map_or_else(|| "no target".to_string(), |t| t.verdict(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        assert_eq!(Target::AtLeast(2.0).verdict(2.0), "target ≥ 2: met");
        assert_eq!(Target::AtMost(0.1).verdict(0.2), "target ≤ 0.1: NOT MET");
        assert!(!Target::AtLeast(1.0).met(f64::NAN));
        assert_eq!(verdict(None, 1.0), "no target");
    }
}
