//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's endpoint or export
//! meets them. Each returns whether the decoder accepted the bytes, and panics only on a
//! finding — a decoder that panics, or an accepted message that does not encode back to the
//! same bytes ([`round_trip`]).

use comm_core::testing::round_trip;

use crate::endpoint::Endpoint;
use crate::segment::Payload;

/// A rank's endpoint (process identity, `/dev/shm` device, node).
pub fn endpoint(data: &[u8]) -> bool {
    round_trip(data, Endpoint::decode, Endpoint::encode, "shm endpoint")
}

/// A segment's export payload (name, length, owner's pid).
pub fn segment_export(data: &[u8]) -> bool {
    round_trip(data, Payload::decode, Payload::encode, "shm segment export")
}

/// The entry point of fuzz target `target` run on `data` (whether it accepted it), or `None`
/// for a target that is not this crate's.
pub fn run(target: &str, data: &[u8]) -> Option<bool> {
    Some(match target {
        "shm_endpoint" => endpoint(data),
        "shm_segment_export" => segment_export(data),
        _ => return None,
    })
}

/// Valid inputs of each target, by name: seeds for their corpora.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let process = comm_core::testing::fixed_process_identity();
    let endpoint = Endpoint { process, shm_dev: 0x17, host: "node-7".into() };
    let export = Payload { name: "/weave-0123456789abcdef-r1-c2-7".into(), len: 1 << 20, pid: 4242 };
    vec![("shm_endpoint", endpoint.encode()), ("shm_segment_export", export.encode())]
}

#[cfg(test)]
mod tests {
    /// Each seed is accepted and lies in `fuzz/seeds/` as made now.
    #[test]
    fn the_fuzz_seeds_are_accepted_and_current() {
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds(), super::run).unwrap();
    }
}
