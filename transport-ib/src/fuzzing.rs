//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's endpoint, export or
//! flag record meets them. Each returns whether the decoder accepted the bytes, and panics only
//! on a finding — a decoder that panics, or an accepted message that does not encode back to
//! the same bytes ([`round_trip`]).

use comm_core::testing::round_trip;

use crate::endpoint::Endpoint;
use crate::flags::{RECORD_BYTES, Record};
use crate::region::{RemoteRegion, encode_export};

/// A rank's endpoint (port address and one queue pair per rank); the first two bytes give the
/// communicator's size.
pub fn endpoint(data: &[u8]) -> bool {
    let Some((world, bytes)) = data.split_first_chunk::<2>() else { return false };
    let world = usize::from(u16::from_le_bytes(*world));
    round_trip(bytes, |b| Endpoint::decode(b, world), Endpoint::encode, "ib endpoint")
}

/// A region's export; the first 8 bytes give the length its descriptor states.
pub fn region_export(data: &[u8]) -> bool {
    let Some((len, payload)) = data.split_first_chunk::<8>() else { return false };
    let len = u64::from_le_bytes(*len) as usize;
    round_trip(payload, |p| RemoteRegion::decode(0, p, len), |r| encode_export(r.key(), len), "ib export")
}

/// A flag record sent with a store (the first 24 bytes).
pub fn flag_record(data: &[u8]) -> bool {
    let Some(bytes) = data.first_chunk::<RECORD_BYTES>() else { return false };
    round_trip(bytes, |_| Record::decode(bytes), |r| r.encode().to_vec(), "ib flag record")
}

/// The entry point of fuzz target `target` run on `data` (whether it accepted it), or `None`
/// for a target that is not this crate's.
pub fn run(target: &str, data: &[u8]) -> Option<bool> {
    Some(match target {
        "ib_endpoint" => endpoint(data),
        "ib_region_export" => region_export(data),
        "ib_flag_record" => flag_record(data),
        _ => return None,
    })
}

/// Valid inputs of each target, by name: seeds for their corpora.
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
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds(), super::run).unwrap();
    }
}
