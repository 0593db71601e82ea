//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's endpoint or export
//! meets them. Each panics only on a finding — a decoder that panics, or an accepted message
//! that does not encode back to the same bytes.

use comm_core::same_host::ProcessIdentity;

use crate::endpoint::Endpoint;
use crate::segment::Payload;

/// A rank's endpoint (process identity, `/dev/shm` device, node).
pub fn endpoint(data: &[u8]) {
    if let Ok(e) = Endpoint::decode(data) {
        assert_eq!(e.encode(), data, "an accepted endpoint encodes back differently");
    }
}

/// A segment's export payload (name, length, owner's pid).
pub fn segment_export(data: &[u8]) {
    if let Ok(p) = Payload::decode(data) {
        assert_eq!(p.encode(), data, "an accepted export encodes back differently");
    }
}

/// Valid inputs of each entry point, by target name: seeds for their corpora.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let process = ProcessIdentity {
        hostname: "node-7".into(),
        boot_id: "0f2c9e4a-51d7-4b8e-9a3c-6d1e2f3a4b5c".into(),
        pid_ns: 4026531836,
        pid: 4242,
        uid: 1000,
    };
    let endpoint = Endpoint { process, shm_dev: 0x17, host: "node-7".into() };
    let export = Payload { name: "/weave-0123456789abcdef-r1-c2-7".into(), len: 1 << 20, pid: 4242 };
    vec![("shm_endpoint", endpoint.encode()), ("shm_segment_export", export.encode())]
}

#[cfg(test)]
mod tests {
    /// Each seed is accepted and lies in `fuzz/seeds/` as made now.
    #[test]
    fn the_fuzz_seeds_are_accepted_and_current() {
        for (target, seed) in super::seeds() {
            let accepted = match target {
                "shm_endpoint" => super::Endpoint::decode(&seed).is_ok(),
                "shm_segment_export" => super::Payload::decode(&seed).is_ok(),
                other => panic!("a seed for an unknown target {other}"),
            };
            assert!(accepted, "a {target} seed is rejected");
        }
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds()).unwrap();
    }
}
