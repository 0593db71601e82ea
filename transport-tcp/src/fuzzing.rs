//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's or a stranger's socket
//! delivers them. Each panics only on a finding — a decoder that panics, or an accepted message
//! that does not encode back to the same bytes.

use crate::endpoint::Endpoint;
use crate::region::{decode_export, encode_export};
use crate::wire::{FRAME_HEADER_BYTES, FrameHeader, Handshake};

/// The handshake a socket opens with.
pub fn handshake(data: &[u8]) {
    if let Ok(h) = Handshake::decode(data) {
        assert_eq!(h.encode(), data, "an accepted handshake encodes back differently");
    }
}

/// A frame header (the first 40 bytes; shorter input is never a header).
pub fn frame_header(data: &[u8]) {
    if let Some(bytes) = data.first_chunk::<FRAME_HEADER_BYTES>()
        && let Ok(h) = FrameHeader::decode(bytes)
    {
        assert_eq!(&h.encode(), bytes, "an accepted frame header encodes back differently");
    }
}

/// A rank's endpoint (listener address and token), from the endpoint exchange.
pub fn endpoint(data: &[u8]) {
    if let Ok(e) = Endpoint::decode(data) {
        assert_eq!(e.encode(), data, "an accepted endpoint encodes back differently");
    }
}

/// A region's export payload; the first 8 bytes give the length its descriptor states.
pub fn region_export(data: &[u8]) {
    let Some((len, payload)) = data.split_first_chunk::<8>() else { return };
    let len = u64::from_le_bytes(*len) as usize;
    if let Ok(region) = decode_export(0, payload, len) {
        assert_eq!(encode_export(region.id), payload, "an accepted export encodes back differently");
    }
}

/// Valid inputs of each entry point, by name: seeds for their corpora.
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
    /// Each seed is accepted (its entry point would panic on a round trip that failed, and a
    /// rejected seed is checked here) and lies in `fuzz/seeds/` as made now.
    #[test]
    fn the_fuzz_seeds_are_accepted_and_current() {
        for (target, seed) in super::seeds() {
            let accepted = match target {
                "tcp_handshake" => crate::wire::Handshake::decode(&seed).is_ok(),
                "tcp_frame_header" => seed.first_chunk().is_some_and(|b| crate::wire::FrameHeader::decode(b).is_ok()),
                "tcp_endpoint" => crate::endpoint::Endpoint::decode(&seed).is_ok(),
                "tcp_region_export" => seed.split_first_chunk::<8>().is_some_and(|(len, p)| {
                    crate::region::decode_export(0, p, u64::from_le_bytes(*len) as usize).is_ok()
                }),
                other => panic!("a seed for an unknown target {other}"),
            };
            assert!(accepted, "a {target} seed is rejected");
        }
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds()).unwrap();
    }
}
