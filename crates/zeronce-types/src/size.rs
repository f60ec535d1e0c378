//! Sizes as an operator types them: one grammar for every command and daemon, so `512M`
//! means 512 MiB wherever it is typed.
//!
//! The grammar ([`parse_size`]):
//!
//! ```text
//! size   = number [unit]          spaces around the number and the unit are ignored
//! number = digit { digit }        decimal ASCII digits only: no sign, point or separator
//! unit   = letter [ "B" | "iB" ]  | "B"
//! letter = "K" | "M" | "G" | "T"  2^10, 2^20, 2^30, 2^40
//! ```
//!
//! - Units are binary whatever their spelling: `K`, `KB` and `KiB` are all 1024 bytes (as
//!   in QEMU's and Linux's size options); there are no decimal units.
//! - Case does not matter: `512m`, `512MB`, `512mib` and `512MiB` are the same size.
//! - A bare number is bytes, and so is a number with `B` alone (`4096`, `4096B`).
//! - Zero is a size (`0`, `0M`: a balloon target of zero deflates it); a caller that needs
//!   a positive or aligned size checks that itself.
//! - An empty text, anything else (`1.5G`, `-1M`, `12Q`, `M`), and a size of 2^64 bytes
//!   or more are refused with a [`SizeError`].

use std::fmt;

/// Why a text is not a size ([`parse_size`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing but spaces.
    Empty,
    /// Not of the grammar; the text as given.
    NotASize(String),
    /// A size of 2^64 bytes or more; the text as given.
    TooLarge(String),
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const EXAMPLES: &str = "e.g. 4096, 512M, 1G";
        match self {
            SizeError::Empty => write!(f, "an empty value is not a size ({EXAMPLES})"),
            SizeError::NotASize(text) => write!(f, "{text:?} is not a size ({EXAMPLES})"),
            SizeError::TooLarge(text) => {
                write!(f, "{text:?} is too large (a size is below 2^64 bytes)")
            }
        }
    }
}

impl std::error::Error for SizeError {}

/// The message, for callers whose errors are strings (command-line value parsers).
impl From<SizeError> for String {
    fn from(e: SizeError) -> String {
        e.to_string()
    }
}

/// Parses a size in bytes by the grammar of the module docs: `4096`, `2M`, `512MiB`,
/// `1G`, `3gb`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let not_a_size = || SizeError::NotASize(text.to_owned());
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(not_a_size());
    }
    let shift = unit_shift(unit.trim_start()).ok_or_else(not_a_size)?;
    let n: u64 = number
        .parse()
        .map_err(|_| SizeError::TooLarge(text.to_owned()))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| SizeError::TooLarge(text.to_owned()))
}

/// The power of two a unit stands for (`None`: not a unit).
fn unit_shift(unit: &str) -> Option<u32> {
    let unit = unit.to_ascii_uppercase();
    let letter = unit
        .strip_suffix("IB")
        .filter(|l| !l.is_empty())
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    match letter {
        "" => Some(0),
        "K" => Some(10),
        "M" => Some(20),
        "G" => Some(30),
        "T" => Some(40),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn every_spelling_of_512m_is_512_mib() {
        for text in [
            "512M", "512m", "512MB", "512mb", "512MiB", "512mib", " 512M ", "512 M", "512 MiB",
        ] {
            assert_eq!(parse_size(text), Ok(512 * MIB), "{text:?}");
        }
    }

    #[test]
    fn units_are_binary_powers() {
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("2M"), Ok(2 * MIB));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("3gb"), Ok(3 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("1KB"), parse_size("1KiB"));
    }

    #[test]
    fn bare_numbers_and_b_are_bytes_and_zero_is_a_size() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("4096b"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("0M"), Ok(0));
    }

    #[test]
    fn what_is_not_a_size_is_refused_with_its_reason() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("  "), Err(SizeError::Empty));
        for bad in [
            "M", "x1G", "12Q", "1.5G", "-1M", "+1M", "1 2M", "512iB", "1MM", "1Mi", "1 KiBB",
        ] {
            assert_eq!(
                parse_size(bad),
                Err(SizeError::NotASize(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sizes_of_2_to_the_64_or_more_are_too_large() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        for big in ["18446744073709551616", "16777216T", "99999999999T"] {
            assert_eq!(parse_size(big), Err(SizeError::TooLarge(big.to_owned())));
        }
        assert_eq!(parse_size("16777215T"), Ok(16_777_215 << 40));
    }

    #[test]
    fn messages_name_the_text() {
        let e = String::from(parse_size("lots").unwrap_err());
        assert!(e.contains("\"lots\" is not a size"), "{e}");
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .to_string()
            .contains("too large"));
    }
}
