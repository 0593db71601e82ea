//! `ncclUniqueId` ↔ weave's [`UniqueId`] (bootstrap address + 128-bit secret).
//!
//! Layout of the 128 bytes: `WVNC` (4 bytes), format version 1 (1 byte), the length `L` of
//! weave's own encoding (1 byte), then `UniqueId::to_bytes()` (`L` bytes, itself magic- and
//! version-tagged, at most 50 bytes for IPv6), then zeros. Decoding checks every field: an id
//! made by another NCCL, or damaged, gives `ncclInvalidArgument` naming what is wrong.
//!
//! Where rank 0 listens: `NCCL_COMM_ID=<ip>:<port>` when set (NCCL's own variable), else a free
//! port on the address of this host that other hosts reach it at
//! ([`comm_core::local_address::reachable_ip`]: the route towards `MASTER_ADDR` where a
//! launcher set it, else the default route, else the first interface up, else 127.0.0.1). Rank
//! 0 of the communicator must run on the host that made the id, as with NCCL.

use std::net::SocketAddr;

use comm_core::bootstrap::UniqueId;

use crate::abi::{NcclUniqueId, UNIQUE_ID_BYTES};
use crate::error::Fail;

const MAGIC: [u8; 4] = *b"WVNC";
const FORMAT: u8 = 1;
const HEADER: usize = 6;

/// Writes `id` into an `ncclUniqueId`.
pub fn encode(id: &UniqueId) -> Result<NcclUniqueId, Fail> {
    let inner = id.to_bytes();
    if inner.len() > UNIQUE_ID_BYTES - HEADER {
        return Err(Fail::new(
            crate::abi::NcclResult::INTERNAL_ERROR,
            format!("weave's unique id takes {} bytes, more than an ncclUniqueId holds", inner.len()),
        ));
    }
    let mut bytes = [0u8; UNIQUE_ID_BYTES];
    bytes[..4].copy_from_slice(&MAGIC);
    bytes[4] = FORMAT;
    bytes[5] = inner.len() as u8;
    bytes[HEADER..HEADER + inner.len()].copy_from_slice(&inner);
    Ok(NcclUniqueId { internal: bytes.map(|b| b as std::ffi::c_char) })
}

/// Reads an `ncclUniqueId` written by [`encode`].
pub fn decode(id: &NcclUniqueId) -> Result<UniqueId, Fail> {
    let bytes = id.internal.map(|c| c as u8);
    if bytes[..4] != MAGIC {
        return Err(Fail::invalid(
            "the ncclUniqueId was not made by weave's libnccl (ncclGetUniqueId of this library): every rank must \
             load the same libnccl.so.2",
        ));
    }
    if bytes[4] != FORMAT {
        return Err(Fail::invalid(format!(
            "the ncclUniqueId has format {} but this library reads format {FORMAT}: mixed library versions",
            bytes[4]
        )));
    }
    let len = usize::from(bytes[5]);
    if len > UNIQUE_ID_BYTES - HEADER {
        return Err(Fail::invalid(format!("the ncclUniqueId claims {len} bytes of payload; it is damaged")));
    }
    if bytes[HEADER + len..].iter().any(|&b| b != 0) {
        return Err(Fail::invalid("the ncclUniqueId has bytes after its payload; it is damaged"));
    }
    UniqueId::from_bytes(&bytes[HEADER..HEADER + len]).map_err(|e| Fail::invalid(format!("damaged ncclUniqueId: {e}")))
}

/// A fresh id: `NCCL_COMM_ID` when set, else a free port on this host (see the module docs).
pub fn fresh() -> Result<UniqueId, Fail> {
    if let Ok(text) = std::env::var("NCCL_COMM_ID") {
        let addr: SocketAddr = text.trim().parse().map_err(|_| {
            Fail::invalid(format!("NCCL_COMM_ID={text:?} is not <ip>:<port> (weave resolves no host names)"))
        })?;
        return Ok(UniqueId::new(addr)?);
    }
    let rendezvous = std::env::var("MASTER_ADDR").ok();
    Ok(UniqueId::on_free_port(comm_core::local_address::reachable_ip(rendezvous.as_deref()))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_v4_and_v6() {
        for addr in ["127.0.0.1:29500", "[::1]:7000", "[fe80::1:2:3:4%7]:65535"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let id = UniqueId::with_secret(addr, [0xa5; 16]);
            let nccl = encode(&id).unwrap();
            assert_eq!(decode(&nccl).unwrap(), id);
        }
    }

    #[test]
    fn foreign_and_damaged_ids_are_invalid_arguments() {
        let zero = NcclUniqueId { internal: [0; UNIQUE_ID_BYTES] };
        assert_eq!(decode(&zero).unwrap_err().code, crate::abi::NcclResult::INVALID_ARGUMENT);
        let good = encode(&UniqueId::with_secret("10.0.0.1:1".parse().unwrap(), [1; 16])).unwrap();
        let mut bad = good;
        bad.internal[4] = 9;
        assert!(decode(&bad).unwrap_err().message.contains("format 9"));
        let mut bad = good;
        bad.internal[5] = 127;
        assert!(decode(&bad).is_err());
        let mut bad = good;
        bad.internal[5] -= 1;
        assert!(decode(&bad).is_err());
        let mut bad = good;
        bad.internal[HEADER] ^= -1;
        assert!(decode(&bad).is_err());
        // Bytes after the payload (found by the fuzz target's round trip): the id was damaged.
        let mut bad = good;
        bad.internal[UNIQUE_ID_BYTES - 1] = 1;
        assert!(decode(&bad).unwrap_err().message.contains("after its payload"));
    }

    /// The fuzz target's seed (`fuzz/seeds/nccl_unique_id`) is an id this library made, as made
    /// now.
    #[test]
    fn the_fuzz_seed_is_current() {
        let id = encode(&UniqueId::with_secret("10.0.0.1:29500".parse().unwrap(), [3; 16])).unwrap();
        let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        let decodes = |_: &str, b: &[u8]| {
            let id = NcclUniqueId { internal: b.first_chunk::<UNIQUE_ID_BYTES>()?.map(|x| x as std::ffi::c_char) };
            Some(decode(&id).is_ok())
        };
        comm_core::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &[("nccl_unique_id", bytes)], decodes)
            .unwrap();
    }

    #[test]
    fn fresh_ids_differ() {
        let (a, b) = (fresh().unwrap(), fresh().unwrap());
        assert_ne!(a.secret, b.secret);
    }
}
