//! The handshake messages of the TCP bootstrap: the root hello (`WVBH`), the rank table
//! (`WVBT`) and the peer hello (`WVBP`, also the answer to one), encoded with [`wire`](crate::wire).
//! Decoding checks magic, version, the job secret (without early exit), the world size and every
//! rank and length, so that a stranger or a misconfigured rank is an error, never a panic.

use std::net::SocketAddr;

use super::rendezvous::RankEntry;
use crate::bootstrap::UniqueId;
use crate::bootstrap::unique_id::{decode_socket_addr, encode_socket_addr};
use crate::error::{Error, Result};
use crate::wire::{Decoder, Encoder};

/// Version of the bootstrap protocol; every handshake carries it and peers must agree.
pub(super) const PROTOCOL_VERSION: u16 = 1;
/// Magic of the hello a rank sends to the root.
pub(super) const ROOT_HELLO_MAGIC: [u8; 4] = *b"WVBH";
/// Magic of the rank table the root sends back.
const RANK_TABLE_MAGIC: [u8; 4] = *b"WVBT";
/// Magic of the hello two non-root ranks exchange when they build their link.
const PEER_HELLO_MAGIC: [u8; 4] = *b"WVBP";

/// Largest hello (root or peer) accepted from a connection that has not yet proven anything.
pub(super) const MAX_HELLO_LEN: usize = 16 << 10;
/// Longest host identity a rank may announce.
pub(super) const MAX_HOST_IDENTITY_LEN: usize = 2048;

/// Reads the secret field and checks it against the job's.
fn check_secret(decoder: &mut Decoder<'_>, id: &UniqueId) -> Result<()> {
    let secret = decoder.raw::<16>()?;
    if !id.secret_matches(&secret) {
        return Err(Error::protocol("wrong job secret (a process of another job, or a stray connection)"));
    }
    Ok(())
}

fn check_world_size(decoder: &mut Decoder<'_>, world_size: usize) -> Result<()> {
    let theirs = decoder.usize()?;
    if theirs != world_size {
        return Err(Error::protocol(format!("world size {theirs} differs from this job's {world_size}")));
    }
    Ok(())
}

pub(super) fn encode_root_hello(
    id: &UniqueId,
    rank: usize,
    world_size: usize,
    listen_addr: SocketAddr,
    host: &str,
) -> Vec<u8> {
    let mut encoder = Encoder::new(ROOT_HELLO_MAGIC, PROTOCOL_VERSION);
    encoder.raw(&id.secret).usize(rank).usize(world_size);
    encode_socket_addr(&mut encoder, &listen_addr);
    encoder.str(host).finish()
}

/// Checks a root hello; returns the rank and what it announced.
pub(super) fn decode_root_hello(bytes: &[u8], id: &UniqueId, world_size: usize) -> Result<(usize, RankEntry)> {
    let mut decoder = Decoder::new(bytes, ROOT_HELLO_MAGIC, PROTOCOL_VERSION, "bootstrap hello")?;
    check_secret(&mut decoder, id)?;
    let rank = decoder.usize()?;
    check_world_size(&mut decoder, world_size)?;
    if rank == 0 || rank >= world_size {
        return Err(Error::protocol(format!("rank {rank} cannot join a {world_size}-rank job at its root")));
    }
    let listen_addr = decode_socket_addr(&mut decoder)?;
    let host = decoder.str()?;
    if host.len() > MAX_HOST_IDENTITY_LEN {
        return Err(Error::protocol(format!("host identity of {} bytes is too long", host.len())));
    }
    let host = host.to_string();
    decoder.finish()?;
    Ok((rank, RankEntry { listen_addr, host }))
}

pub(super) fn encode_rank_table(id: &UniqueId, entries: &[RankEntry]) -> Vec<u8> {
    let mut encoder = Encoder::new(RANK_TABLE_MAGIC, PROTOCOL_VERSION);
    encoder.raw(&id.secret).usize(entries.len());
    for entry in entries {
        encode_socket_addr(&mut encoder, &entry.listen_addr);
        encoder.str(&entry.host);
    }
    encoder.finish()
}

pub(super) fn decode_rank_table(bytes: &[u8], id: &UniqueId, world_size: usize) -> Result<Vec<RankEntry>> {
    let mut decoder = Decoder::new(bytes, RANK_TABLE_MAGIC, PROTOCOL_VERSION, "bootstrap rank table")?;
    check_secret(&mut decoder, id)?;
    check_world_size(&mut decoder, world_size)?;
    let mut entries = Vec::with_capacity(world_size);
    for _ in 0..world_size {
        let listen_addr = decode_socket_addr(&mut decoder)?;
        let host = decoder.str()?.to_string();
        entries.push(RankEntry { listen_addr, host });
    }
    decoder.finish()?;
    Ok(entries)
}

pub(super) fn encode_peer_hello(id: &UniqueId, from: usize, to: usize, world_size: usize) -> Vec<u8> {
    Encoder::new(PEER_HELLO_MAGIC, PROTOCOL_VERSION).raw(&id.secret).usize(from).usize(to).usize(world_size).finish()
}

/// Checks a peer hello addressed to `me`; returns the sender's rank (in range, not `me`).
pub(super) fn decode_peer_hello(bytes: &[u8], id: &UniqueId, world_size: usize, me: usize) -> Result<usize> {
    let mut decoder = Decoder::new(bytes, PEER_HELLO_MAGIC, PROTOCOL_VERSION, "bootstrap peer hello")?;
    check_secret(&mut decoder, id)?;
    let from = decoder.usize()?;
    let to = decoder.usize()?;
    check_world_size(&mut decoder, world_size)?;
    decoder.finish()?;
    if to != me {
        return Err(Error::protocol(format!("the hello is addressed to rank {to}, this is rank {me}")));
    }
    if from >= world_size || from == me {
        return Err(Error::protocol(format!("sender rank {from} is not another rank of a {world_size}-rank job")));
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_messages_reject_garbage() {
        let id = UniqueId::with_secret("127.0.0.1:1".parse().unwrap(), [3; 16]);
        let hello = encode_root_hello(&id, 2, 4, "10.0.0.1:5".parse().unwrap(), "host/boot");
        let (rank, entry) = decode_root_hello(&hello, &id, 4).unwrap();
        assert_eq!((rank, entry.listen_addr, entry.host.as_str()), (2, "10.0.0.1:5".parse().unwrap(), "host/boot"));
        for cut in 0..hello.len() {
            assert!(matches!(decode_root_hello(&hello[..cut], &id, 4), Err(Error::Protocol(_))), "cut {cut}");
        }
        assert!(decode_root_hello(&hello, &id, 5).is_err(), "world size differs");
        assert!(decode_root_hello(&encode_root_hello(&id, 0, 4, id.addr, "h"), &id, 4).is_err(), "rank 0");
        assert!(decode_root_hello(&encode_root_hello(&id, 4, 4, id.addr, "h"), &id, 4).is_err(), "rank too big");
        let stranger = UniqueId::with_secret(id.addr, [4; 16]);
        assert!(decode_root_hello(&encode_root_hello(&stranger, 1, 4, id.addr, "h"), &id, 4).is_err());

        let peer = encode_peer_hello(&id, 3, 1, 4);
        assert_eq!(decode_peer_hello(&peer, &id, 4, 1).unwrap(), 3);
        assert!(decode_peer_hello(&peer, &id, 4, 2).is_err(), "addressed to another rank");
        assert!(decode_peer_hello(&peer, &stranger, 4, 1).is_err(), "wrong secret");
        assert!(decode_peer_hello(&encode_peer_hello(&id, 1, 1, 4), &id, 4, 1).is_err(), "from itself");
        assert!(decode_peer_hello(&encode_peer_hello(&id, 9, 1, 4), &id, 4, 1).is_err(), "from out of range");

        let entries = vec![
            RankEntry { listen_addr: id.addr, host: "a".into() },
            RankEntry { listen_addr: "[::1]:9".parse().unwrap(), host: "b".into() },
        ];
        let table = encode_rank_table(&id, &entries);
        let decoded = decode_rank_table(&table, &id, 2).unwrap();
        assert_eq!(decoded[1].listen_addr, entries[1].listen_addr);
        assert_eq!(decoded[1].host, "b");
        assert!(decode_rank_table(&table, &id, 3).is_err());
        assert!(decode_rank_table(&table, &stranger, 2).is_err());
        for cut in 0..table.len() {
            assert!(decode_rank_table(&table[..cut], &id, 2).is_err(), "cut {cut}");
        }
    }
}
