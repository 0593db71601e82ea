//! The value parsers the two workers' command lines share (`bench-worker`, `gpu-bench`).

use clap::builder::RangedU64ValueParser;

/// A count of at least `min`.
pub fn at_least(min: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(min..)
}

/// A size in bytes (`8`, `64K`, `1G`).
pub fn size(s: &str) -> Result<usize, String> {
    weave_launch::parse_size(s).and_then(|bytes| usize::try_from(bytes).ok()).ok_or_else(|| format!("bad size {s:?}"))
}
