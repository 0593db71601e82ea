//! Byte sizes as weave's command lines write them (`cargo xtask bench -b 64K` passes its sizes
//! on to the bench worker, so both read them with this one parser).

/// Parses a size: digits with an optional `K`, `M` or `G` suffix (powers of 1024, any case,
/// optionally followed by `B` or `iB`). `None` for anything else or a size over `u64::MAX`.
///
/// ```
/// assert_eq!(weave_launch::parse_size("64K"), Some(64 << 10));
/// assert_eq!(weave_launch::parse_size("1GiB"), Some(1 << 30));
/// assert_eq!(weave_launch::parse_size("1.5M"), None);
/// ```
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("ib").or_else(|| t.strip_suffix('b')).unwrap_or(&t);
    let (digits, shift) = match t.as_bytes().last()? {
        b'k' => (&t[..t.len() - 1], 10),
        b'm' => (&t[..t.len() - 1], 20),
        b'g' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("64m"), Some(64 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("4KiB"), Some(4096));
        assert_eq!(parse_size("2KB"), Some(2048));
        assert_eq!(parse_size("16MB"), Some(16 << 20));
        assert_eq!(parse_size(" 32 "), Some(32));
        for bad in [
            "",
            "K",
            "M",
            "1.5M",
            "-8",
            "8X",
            "8 K",
            "0x10",
            "99999999999999999999",
            "99999999999999999999G",
            "20000000000G",
        ] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }
}
