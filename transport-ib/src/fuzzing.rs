//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's endpoint, export or
//! flag record meets them. Each panics only on a finding — a decoder that panics, or an accepted
//! message that does not encode back to the same bytes.

use crate::endpoint::Endpoint;
use crate::flags::{RECORD_BYTES, Record};
use crate::region::{RemoteRegion, encode_export};

/// A rank's endpoint (port address and one queue pair per rank); the first two bytes give the
/// communicator's size.
pub fn endpoint(data: &[u8]) {
    let Some((world, bytes)) = data.split_first_chunk::<2>() else { return };
    if let Ok(e) = Endpoint::decode(bytes, usize::from(u16::from_le_bytes(*world))) {
        assert_eq!(e.encode(), bytes, "an accepted endpoint encodes back differently");
    }
}

/// A region's export; the first 8 bytes give the length its descriptor states.
pub fn region_export(data: &[u8]) {
    let Some((len, payload)) = data.split_first_chunk::<8>() else { return };
    let len = u64::from_le_bytes(*len) as usize;
    if let Ok(region) = RemoteRegion::decode(0, payload, len) {
        assert_eq!(encode_export(region.key(), len), payload, "an accepted export encodes back differently");
    }
}

/// A flag record sent with a store (the first 24 bytes).
pub fn flag_record(data: &[u8]) {
    if let Some(bytes) = data.first_chunk::<RECORD_BYTES>()
        && let Ok(r) = Record::decode(bytes)
    {
        assert_eq!(&r.encode(), bytes, "an accepted flag record encodes back differently");
    }
}

/// Valid inputs of each entry point, by target name: seeds for their corpora.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let port = crate::verbs::PortAddress { lid: 0, gid: [0xfe; 16], roce: true, mtu: 3 };
    let endpoint = Endpoint { port, queue_pairs: vec![(0, 0), (0x11, 0x222), (0x33, 0x444)] };
    let mut with_size = 3u16.to_le_bytes().to_vec();
    with_size.extend(endpoint.encode());
    let mut export = 4096u64.to_le_bytes().to_vec();
    export.extend(encode_export(crate::region::RemoteKey { addr: 0x7f00_0000_1000, rkey: 0x1234, id: 5 }, 4096));
    let record = |slot| Record { region: 5, slot, offset: 64, value: 9 }.encode().to_vec();
    vec![
        ("ib_endpoint", with_size),
        ("ib_region_export", export),
        ("ib_flag_record", record(Some(3))),
        ("ib_flag_record", record(None)),
    ]
}

#[cfg(test)]
mod tests {
    /// Each seed is accepted and lies in `fuzz/seeds/` as made now.
    #[test]
    fn the_fuzz_seeds_are_accepted_and_current() {
        for (target, seed) in super::seeds() {
            let accepted = match target {
                "ib_endpoint" => seed.split_first_chunk::<2>().is_some_and(|(n, b)| {
                    crate::endpoint::Endpoint::decode(b, usize::from(u16::from_le_bytes(*n))).is_ok()
                }),
                "ib_region_export" => seed.split_first_chunk::<8>().is_some_and(|(len, p)| {
                    crate::region::RemoteRegion::decode(0, p, u64::from_le_bytes(*len) as usize).is_ok()
                }),
                "ib_flag_record" => seed.first_chunk().is_some_and(|b| crate::flags::Record::decode(b).is_ok()),
                other => panic!("a seed for an unknown target {other}"),
            };
            assert!(accepted, "a {target} seed is rejected");
        }
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds()).unwrap();
    }
}
