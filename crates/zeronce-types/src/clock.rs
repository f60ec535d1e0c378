//! Deadlines from durations a caller configures: `Instant + Duration` panics when the
//! sum is past what the platform's clock can represent, and `Duration::MAX` is a natural
//! way to say "never" in a configuration.

use std::time::{Duration, Instant};

/// Longest span a deadline is asked to represent: 1000 years, which fits an `Instant`
/// on every platform Rust supports, and is "never" for any process.
pub const FOREVER: Duration = Duration::from_secs(1000 * 365 * 86_400);

/// `now + after`, saturating at [`FOREVER`] from `now` instead of panicking. (If even
/// that does not fit, `now` itself: a deadline that ends early rather than a panic.)
pub fn deadline_after(now: Instant, after: Duration) -> Instant {
    now.checked_add(after.min(FOREVER)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturates_instead_of_panicking() {
        let now = Instant::now();
        assert_eq!(
            deadline_after(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        let never = deadline_after(now, Duration::MAX);
        assert!(never >= now + Duration::from_secs(100 * 365 * 86_400));
    }
}
