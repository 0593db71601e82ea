//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! crate's decoders of what other processes send — a survivor's shrink offer, a grow id handed
//! to joiners out of band — run on arbitrary bytes. Each returns whether the decoder accepted
//! the bytes, and panics only on a finding: a decoder that panics, or an accepted message that
//! does not encode back to the same bytes ([`round_trip`]).

use comm_core::testing::round_trip;

use crate::api::elastic::ShrinkOffer;
use crate::api::grow::GrowId;
use crate::host::Progress;

/// A survivor's offer when a shrink begins.
pub fn shrink_offer(data: &[u8]) -> bool {
    round_trip(data, ShrinkOffer::decode, ShrinkOffer::encode, "shrink offer")
}

/// A grow id, as bytes and as the text joiners are handed: whether either form was accepted.
pub fn grow_id(data: &[u8]) -> bool {
    let bytes = round_trip(data, GrowId::from_bytes, GrowId::to_bytes, "grow id");
    let text = std::str::from_utf8(data).ok().and_then(|t| t.parse::<GrowId>().ok());
    if let Some(id) = &text {
        let again: GrowId = id.to_string().parse().expect("a parsed grow id prints as one");
        assert_eq!(again.to_bytes(), id.to_bytes(), "a grow id printed and parsed again differs");
    }
    bytes || text.is_some()
}

/// The entry point of fuzz target `target` run on `data` (whether it accepted it), or `None`
/// for a target that is not this crate's.
pub fn run(target: &str, data: &[u8]) -> Option<bool> {
    Some(match target {
        "shrink_offer" => shrink_offer(data),
        "grow_id" => grow_id(data),
        _ => return None,
    })
}

/// Valid inputs of each target, by name: seeds for their corpora.
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
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds(), super::run).unwrap();
    }
}
