//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's or a stranger's socket
//! delivers them. Each returns whether the decoder accepted the bytes, and panics only on a
//! finding — a decoder that panics, or an accepted message that does not encode back to the
//! same bytes ([`round_trip`]).

use comm_core::testing::round_trip;

use crate::endpoint::Endpoint;
use crate::region::{decode_export, encode_export};
use crate::wire::{FRAME_HEADER_BYTES, FrameHeader, Handshake};

/// The handshake a socket opens with.
pub fn handshake(data: &[u8]) -> bool {
    round_trip(data, Handshake::decode, Handshake::encode, "tcp handshake")
}

/// A frame header (the first 40 bytes; shorter input is never a header).
pub fn frame_header(data: &[u8]) -> bool {
    let Some(bytes) = data.first_chunk::<FRAME_HEADER_BYTES>() else { return false };
    round_trip(bytes, |_| FrameHeader::decode(bytes), |h| h.encode().to_vec(), "tcp frame header")
}

/// A rank's endpoint (listener address and token), from the endpoint exchange.
pub fn endpoint(data: &[u8]) -> bool {
    round_trip(data, Endpoint::decode, Endpoint::encode, "tcp endpoint")
}

/// A region's export payload; the first 8 bytes give the length its descriptor states.
pub fn region_export(data: &[u8]) -> bool {
    let Some((len, payload)) = data.split_first_chunk::<8>() else { return false };
    let len = u64::from_le_bytes(*len) as usize;
    round_trip(payload, |p| decode_export(0, p, len), |r| encode_export(r.id), "tcp export")
}

/// The entry point of fuzz target `target` run on `data` (whether it accepted it), or `None`
/// for a target that is not this crate's.
pub fn run(target: &str, data: &[u8]) -> Option<bool> {
    Some(match target {
        "tcp_handshake" => handshake(data),
        "tcp_frame_header" => frame_header(data),
        "tcp_endpoint" => endpoint(data),
        "tcp_region_export" => region_export(data),
        _ => return None,
    })
}

/// Valid inputs of each target, by name: seeds for their corpora.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let hello = Handshake { token: [7; 16], rank: 3, stripe: 1, stripes: 4 };
    let header = |kind| FrameHeader { kind, region: 2, offset: 64, value: 8, sequence: 5 }.encode().to_vec();
    let endpoint = Endpoint { addr: "10.0.0.2:40123".parse().expect("an address"), token: [9; 16] };
    let mut export = 4096u64.to_le_bytes().to_vec();
    export.extend(encode_export(12));
    vec![
        ("tcp_handshake", hello.encode()),
        ("tcp_frame_header", header(crate::wire::FrameKind::Data)),
        ("tcp_frame_header", header(crate::wire::FrameKind::Flag)),
        ("tcp_frame_header", header(crate::wire::FrameKind::Flush)),
        ("tcp_frame_header", header(crate::wire::FrameKind::Answer)),
        ("tcp_endpoint", endpoint.encode()),
        ("tcp_region_export", export),
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
