//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! crate's decoders of what other processes send — a survivor's shrink offer, a grow id handed
//! to joiners out of band — run on arbitrary bytes. Each panics only on a finding: a decoder
//! that panics, or an accepted message that does not encode back to the same bytes.

use crate::elastic::ShrinkOffer;
use crate::grow::GrowId;
use crate::host::Progress;

/// A survivor's offer when a shrink begins.
pub fn shrink_offer(data: &[u8]) {
    if let Ok(offer) = ShrinkOffer::decode(data) {
        assert_eq!(offer.encode(), data, "an accepted offer encodes back differently");
    }
}

/// A grow id, as bytes and as the text joiners are handed.
pub fn grow_id(data: &[u8]) {
    if let Ok(id) = GrowId::from_bytes(data) {
        assert_eq!(id.to_bytes(), data, "an accepted grow id encodes back differently");
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(id) = text.parse::<GrowId>()
    {
        let again: GrowId = id.to_string().parse().expect("a parsed grow id prints as one");
        assert_eq!(again.to_bytes(), id.to_bytes());
    }
}

/// Valid inputs of each entry point, by target name: seeds for their corpora.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let offer = |handover| ShrinkOffer { digest: 0x0123_4567_89ab_cdef, handover }.encode();
    let unique = comm_core::bootstrap::UniqueId::with_secret("10.0.0.1:29500".parse().expect("an address"), [3; 16]);
    let grow = GrowId::new(unique, 6, 8).to_bytes();
    vec![
        ("shrink_offer", offer(Some(Progress { phase: 41, step: 7 }))),
        ("shrink_offer", offer(None)),
        ("grow_id", grow.clone()),
        ("grow_id", comm_core::wire::hex(&grow).into_bytes()),
    ]
}

#[cfg(test)]
mod tests {
    /// Each seed is accepted and lies in `fuzz/seeds/` as made now.
    #[test]
    fn the_fuzz_seeds_are_accepted_and_current() {
        for (target, seed) in super::seeds() {
            let accepted = match target {
                "shrink_offer" => super::ShrinkOffer::decode(&seed).is_ok(),
                "grow_id" => {
                    super::GrowId::from_bytes(&seed).is_ok()
                        || std::str::from_utf8(&seed).is_ok_and(|t| t.parse::<super::GrowId>().is_ok())
                }
                other => panic!("a seed for an unknown target {other}"),
            };
            assert!(accepted, "a {target} seed is rejected");
        }
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds()).unwrap();
    }
}
