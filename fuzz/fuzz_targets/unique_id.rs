//! A unique id as bytes (handed between processes out of band) and as text (`WEAVE_UNIQUE_ID`,
//! command lines): parsing never panics, and whatever parses round-trips.
#![no_main]

use comm_core::bootstrap::UniqueId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = UniqueId::from_bytes(data) {
        let again = UniqueId::from_bytes(&id.to_bytes()).expect("a parsed id re-encodes");
        assert_eq!(again.to_bytes(), id.to_bytes());
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(id) = text.parse::<UniqueId>()
    {
        let again: UniqueId = id.to_string().parse().expect("a parsed id prints as one");
        assert_eq!(again.to_bytes(), id.to_bytes());
    }
});
