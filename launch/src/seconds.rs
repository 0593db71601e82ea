//! Timeouts as weave's command lines write them (`cargo xtask launch --timeout 1.5`,
//! `weave-bench --timeout 30`): one parser for both.

use std::time::Duration;

/// Parses a positive number of seconds (fractions allowed) into a duration; the error says
/// what was wrong with `s`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(weave_launch::parse_seconds("1.5"), Ok(Duration::from_millis(1500)));
/// assert!(weave_launch::parse_seconds("0").is_err());
/// ```
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.trim().parse().map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| format!("must be a positive number of seconds, got {secs}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positive_finite_seconds() {
        assert_eq!(parse_seconds(" 30 "), Ok(Duration::from_secs(30)));
        for bad in ["", "abc", "-1", "0", "inf", "NaN", "1e30"] {
            assert!(parse_seconds(bad).is_err(), "{bad:?}");
        }
    }
}
