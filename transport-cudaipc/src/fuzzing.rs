//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's endpoint or export,
//! or a local process talking to the FD server, meets them. Each returns whether the decoder
//! accepted the bytes, and panics only on a finding — a decoder that panics, or an accepted
//! message that does not encode back to the same bytes ([`round_trip`]).

use comm_core::testing::round_trip;

use crate::endpoint::Endpoint;
use crate::payload::{Export, Payload, Reply, Request, decode_reply, decode_request, encode_reply, encode_request};

/// A rank's endpoint (process identity, network namespace, device, communicator).
pub fn endpoint(data: &[u8]) -> bool {
    round_trip(data, Endpoint::decode, Endpoint::encode, "cudaipc endpoint")
}

/// An allocation's export payload (cuMem or legacy IPC handle).
pub fn export(data: &[u8]) -> bool {
    round_trip(data, Payload::decode, Payload::encode, "cudaipc export")
}

/// What a process connecting to the FD server sends (a request), and what the server answers:
/// whether either decoder accepted.
pub fn fd_messages(data: &[u8]) -> bool {
    let request = round_trip(data, decode_request, encode_request, "cudaipc fd request");
    request | round_trip(data, decode_reply, encode_reply, "cudaipc fd reply")
}

/// The entry point of fuzz target `target` run on `data` (whether it accepted it), or `None`
/// for a target that is not this crate's.
pub fn run(target: &str, data: &[u8]) -> Option<bool> {
    Some(match target {
        "cudaipc_endpoint" => endpoint(data),
        "cudaipc_export" => export(data),
        "cudaipc_fd_messages" => fd_messages(data),
        _ => return None,
    })
}

/// Valid inputs of each target, by name: seeds for their corpora.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let process = comm_core::testing::fixed_process_identity();
    let endpoint =
        Endpoint { process, net_ns: 4026531840, device: 1, pci_bus_id: "0000:18:00.0".into(), communicator_id: 3 };
    let vmm = Payload { pid: 4242, instance: 9, export: Export::Vmm { id: 12, size: 2 << 20 } };
    let legacy = Payload {
        pid: 4242,
        instance: 9,
        export: Export::Legacy { handle: [0x5a; 64], base: 0x7f00_0000_0000, base_size: 4 << 20, offset: 4096 },
    };
    vec![
        ("cudaipc_endpoint", endpoint.encode()),
        ("cudaipc_export", vmm.encode()),
        ("cudaipc_export", legacy.encode()),
        ("cudaipc_fd_messages", encode_request(&Request::Fd { id: 12 })),
        ("cudaipc_fd_messages", encode_request(&Request::Map { key: 3, len: 4096, payload: legacy.encode() })),
        ("cudaipc_fd_messages", encode_request(&Request::Unmap { key: 3 })),
        ("cudaipc_fd_messages", encode_reply(&Reply::Mapped { address: 0x7f00_0000_1000 })),
        ("cudaipc_fd_messages", encode_reply(&Reply::Unmapped)),
        ("cudaipc_fd_messages", encode_reply(&Reply::Fd { size: 2 << 20 })),
        ("cudaipc_fd_messages", encode_reply(&Reply::Error("no allocation 13".into()))),
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
