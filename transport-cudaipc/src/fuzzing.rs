//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! transport's private decoders, each run on arbitrary bytes as a peer's endpoint or export,
//! or a local process talking to the FD server, meets them. Each panics only on a finding — a
//! decoder that panics, or an accepted message that does not encode back to the same bytes.

use comm_core::same_host::ProcessIdentity;

use crate::endpoint::Endpoint;
use crate::payload::{Export, Payload, Reply, decode_reply, decode_request, encode_reply, encode_request};

/// A rank's endpoint (process identity, network namespace, device, communicator).
pub fn endpoint(data: &[u8]) {
    if let Ok(e) = Endpoint::decode(data) {
        assert_eq!(e.encode(), data, "an accepted endpoint encodes back differently");
    }
}

/// An allocation's export payload (cuMem or legacy IPC handle).
pub fn export(data: &[u8]) {
    if let Ok(p) = Payload::decode(data) {
        assert_eq!(p.encode(), data, "an accepted export encodes back differently");
    }
}

/// What a process connecting to the FD server sends (a request), and what the server answers.
pub fn fd_messages(data: &[u8]) {
    if let Ok(id) = decode_request(data) {
        assert_eq!(encode_request(id), data, "an accepted request encodes back differently");
    }
    if let Ok(reply) = decode_reply(data) {
        assert_eq!(encode_reply(&reply), data, "an accepted reply encodes back differently");
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
        ("cudaipc_fd_messages", encode_request(12)),
        ("cudaipc_fd_messages", encode_reply(&Reply::Fd { size: 2 << 20 })),
        ("cudaipc_fd_messages", encode_reply(&Reply::Error("no allocation 13".into()))),
    ]
}

#[cfg(test)]
mod tests {
    /// Each seed is accepted and lies in `fuzz/seeds/` as made now.
    #[test]
    fn the_fuzz_seeds_are_accepted_and_current() {
        for (target, seed) in super::seeds() {
            let accepted = match target {
                "cudaipc_endpoint" => super::Endpoint::decode(&seed).is_ok(),
                "cudaipc_export" => super::Payload::decode(&seed).is_ok(),
                "cudaipc_fd_messages" => super::decode_request(&seed).is_ok() || super::decode_reply(&seed).is_ok(),
                other => panic!("a seed for an unknown target {other}"),
            };
            assert!(accepted, "a {target} seed is rejected");
        }
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds()).unwrap();
    }
}
