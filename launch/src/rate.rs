//! Link rates as `tc` writes them (`10gbit`, `100mbit`, `1gbps`), for shaping the links of
//! namespace nodes ([`LaunchSpec::namespace_nodes`](crate::LaunchSpec::namespace_nodes)).
//!
//! The units are tc's (`tc(8)`, "RATES"), matched without regard to case: a bare number or
//! `bit` is bits per second; `kbit`, `mbit`, `gbit`, `tbit` are powers of 1000 bits, `kibit` …
//! `tibit` powers of 1024 bits; `bps` is *bytes* per second, `kbps` … `tbps` powers of 1000
//! bytes, `kibps` … `tibps` powers of 1024 bytes. So `1gbps` is 8 gbit, as with tc.

use std::fmt;
use std::str::FromStr;

/// The prefixes of tc's units, with their factor.
const PREFIXES: &[(&str, f64)] = &[
    ("", 1.0),
    ("k", 1e3),
    ("m", 1e6),
    ("g", 1e9),
    ("t", 1e12),
    ("ki", 1024.0),
    ("mi", 1024.0 * 1024.0),
    ("gi", 1024.0 * 1024.0 * 1024.0),
    ("ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
];

/// The value in bits per second of one of tc's units: a prefix of [`PREFIXES`] then `bit`
/// (bits) or `bps` (bytes), without regard to case.
fn unit_scale(unit: &str) -> Option<f64> {
    let unit = unit.to_ascii_lowercase();
    let (prefix, bits) =
        if let Some(p) = unit.strip_suffix("bit") { (p, 1.0) } else { (unit.strip_suffix("bps")?, 8.0) };
    PREFIXES.iter().find(|(name, _)| *name == prefix).map(|&(_, factor)| factor * bits)
}

/// Lowest rate accepted: 8 kbit/s (1000 bytes per second). Below it a token bucket of one
/// packet takes over a second to fill, and no job would finish.
pub const MIN_RATE_BYTES_PER_SEC: u64 = 1000;

/// A link rate in bytes per second, as the kernel's shapers count it. Parse one with
/// [`str::parse`] (tc's units, see the module documentation).
///
/// ```
/// use weave_launch::Rate;
/// assert_eq!("1gbit".parse::<Rate>().unwrap().bytes_per_sec(), 125_000_000);
/// assert_eq!("1gbps".parse::<Rate>().unwrap().bytes_per_sec(), 1_000_000_000);
/// assert!("10 furlongs".parse::<Rate>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(u64);

impl Rate {
    /// A rate of `bytes` per second; `None` below [`MIN_RATE_BYTES_PER_SEC`].
    pub fn from_bytes_per_sec(bytes: u64) -> Option<Rate> {
        (bytes >= MIN_RATE_BYTES_PER_SEC).then_some(Rate(bytes))
    }

    /// Bytes per second.
    pub fn bytes_per_sec(self) -> u64 {
        self.0
    }

    /// Bits per second (saturating).
    pub fn bits_per_sec(self) -> u64 {
        self.0.saturating_mul(8)
    }
}

impl fmt::Display for Rate {
    /// Bits per second in the largest decimal unit that keeps the value at least 1, as tc
    /// prints rates: `1Gbit`, `100Mbit`, `1.5Gbit`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.bits_per_sec() as f64;
        let (scale, unit) = [(1e12, "Tbit"), (1e9, "Gbit"), (1e6, "Mbit"), (1e3, "Kbit")]
            .into_iter()
            .find(|&(s, _)| bits >= s)
            .unwrap_or((1.0, "bit"));
        let v = bits / scale;
        if (v - v.round()).abs() < 1e-9 { write!(f, "{}{unit}", v.round()) } else { write!(f, "{v:.3}{unit}") }
    }
}

/// Why a rate did not parse; its message names the text and what is expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateError(String);

impl fmt::Display for RateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RateError {}

impl FromStr for Rate {
    type Err = RateError;

    /// Parses a number (decimals allowed) with an optional tc unit.
    fn from_str(s: &str) -> Result<Rate, RateError> {
        let text = s.trim();
        let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let expected = "a rate such as 10gbit, 100mbit, 1gbps (tc's units: bit, kbit, mbit, gbit, tbit, kibit..tibit \
                        in bits per second; bps, kbps..tbps, kibps..tibps in bytes per second)";
        if number.is_empty() {
            return Err(RateError(format!("rate {s:?} does not start with a number; expected {expected}")));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| RateError(format!("rate {s:?}: {number:?} is not a number; expected {expected}")))?;
        let scale = if unit.is_empty() {
            1.0
        } else {
            unit_scale(unit)
                .ok_or_else(|| RateError(format!("rate {s:?}: unknown unit {unit:?}; expected {expected}")))?
        };
        let bytes = value * scale / 8.0;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(RateError(format!("rate {s:?} is too large")));
        }
        Rate::from_bytes_per_sec(bytes.round() as u64).ok_or_else(|| {
            RateError(format!("rate {s:?} is below the lowest rate the launcher shapes to, 8kbit (1000 bytes/s)"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> u64 {
        s.parse::<Rate>().unwrap_or_else(|e| panic!("{s}: {e}")).bytes_per_sec()
    }

    #[test]
    fn tc_units_in_bits_and_bytes() {
        assert_eq!(bytes("10gbit"), 1_250_000_000);
        assert_eq!(bytes("100mbit"), 12_500_000);
        assert_eq!(bytes("100Mbit"), 12_500_000);
        assert_eq!(bytes("1gbps"), 1_000_000_000);
        assert_eq!(bytes("1GBps"), 1_000_000_000);
        assert_eq!(bytes("8000"), 1000);
        assert_eq!(bytes("8000bit"), 1000);
        assert_eq!(bytes("64kibit"), 8192);
        assert_eq!(bytes("1mibps"), 1 << 20);
        assert_eq!(bytes("1.5gbit"), 187_500_000);
        assert_eq!(bytes(" 2tbit "), 250_000_000_000);
        assert_eq!(bytes("1tibps"), 1 << 40);
    }

    #[test]
    fn bad_rates_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Rate>().unwrap_err().to_string();
        assert!(err("").contains("does not start with a number"));
        assert!(err("gbit").contains("does not start with a number"));
        assert!(err("-1gbit").contains("does not start with a number"));
        assert!(err("1.2.3gbit").contains("is not a number"));
        assert!(err("10 gbit").contains("unknown unit \" gbit\""));
        assert!(err("10gb").contains("unknown unit \"gb\""));
        assert!(err("0gbit").contains("below the lowest rate"));
        assert!(err("100bit").contains("below the lowest rate"));
        assert!(err("1e3gbit").contains("unknown unit \"e3gbit\""));
        assert!(err("99999999999999999999999tbps").contains("too large"));
    }

    #[test]
    fn display_is_tc_like() {
        assert_eq!("1gbit".parse::<Rate>().unwrap().to_string(), "1Gbit");
        assert_eq!("100mbit".parse::<Rate>().unwrap().to_string(), "100Mbit");
        assert_eq!("1.5gbit".parse::<Rate>().unwrap().to_string(), "1.500Gbit");
        assert_eq!("1gbps".parse::<Rate>().unwrap().to_string(), "8Gbit");
        assert_eq!(Rate::from_bytes_per_sec(999), None);
    }
}
