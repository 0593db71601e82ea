//! The handshake messages of the TCP bootstrap, encoded with [`wire`](crate::wire): the root
//! hello (`WVBH`) and the root's acknowledgement (`WVBA`), the group table a root sends to the
//! first root (`WVBG`), the rank table (`WVBT`) and the peer hello that opens every link (`WVBP`,
//! also the answer to one). Decoding checks magic, version, the job secret (without early exit),
//! the world size and every rank and length, so that a stranger or a misconfigured rank is an
//! error, never a panic.

use std::net::SocketAddr;
use std::ops::Range;

use crate::bootstrap::UniqueId;
use crate::bootstrap::unique_id::{decode_socket_addr, encode_socket_addr};
use crate::error::{Error, Result};
use crate::wire::{Decoder, Encoder};

/// What the rank table says about one rank.
#[derive(Clone)]
pub(super) struct RankEntry {
    pub(super) listen_addr: SocketAddr,
    pub(super) host: String,
}

/// Version of the bootstrap protocol; every handshake carries it and peers must agree.
/// Version 2: ranks join at one of several roots, the rank table goes down a tree, links are
/// opened on demand.
pub(super) const PROTOCOL_VERSION: u16 = 2;
/// Magic of the hello a rank sends to its root.
pub(super) const ROOT_HELLO_MAGIC: [u8; 4] = *b"WVBH";
/// Magic of a root's acknowledgement of a hello or group table.
const ROOT_ACK_MAGIC: [u8; 4] = *b"WVBA";
/// Magic of the table of its ranks that a root other than the first sends to the first.
pub(super) const GROUP_TABLE_MAGIC: [u8; 4] = *b"WVBG";
/// Magic of the rank table.
const RANK_TABLE_MAGIC: [u8; 4] = *b"WVBT";
/// Magic of the hello that opens a link between two ranks (and of its answer).
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

fn check_roots(decoder: &mut Decoder<'_>, roots: usize) -> Result<()> {
    let theirs = decoder.usize()?;
    if theirs != roots {
        return Err(Error::protocol(format!("it was given {theirs} unique ids (roots), this job {roots}")));
    }
    Ok(())
}

fn encode_entry(encoder: &mut Encoder, entry: &RankEntry) {
    encode_socket_addr(encoder, &entry.listen_addr);
    encoder.str(&entry.host);
}

fn decode_entry(decoder: &mut Decoder<'_>) -> Result<RankEntry> {
    let listen_addr = decode_socket_addr(decoder)?;
    let host = decoder.str()?;
    if host.len() > MAX_HOST_IDENTITY_LEN {
        return Err(Error::protocol(format!("host identity of {} bytes is too long", host.len())));
    }
    Ok(RankEntry { listen_addr, host: host.to_string() })
}

/// The hello rank `rank` sends to the root of its group (`id` is that root's id).
pub(super) fn encode_root_hello(
    id: &UniqueId,
    rank: usize,
    world_size: usize,
    roots: usize,
    entry: &RankEntry,
) -> Vec<u8> {
    let mut encoder = Encoder::new(ROOT_HELLO_MAGIC, PROTOCOL_VERSION);
    encoder.raw(&id.secret).usize(rank).usize(world_size).usize(roots);
    encode_entry(&mut encoder, entry);
    encoder.finish()
}

/// Checks a root hello at the root of the ranks `members` (the root itself excluded); returns
/// the rank and what it announced.
pub(super) fn decode_root_hello(
    bytes: &[u8],
    id: &UniqueId,
    world_size: usize,
    roots: usize,
    members: Range<usize>,
) -> Result<(usize, RankEntry)> {
    let mut decoder = Decoder::new(bytes, ROOT_HELLO_MAGIC, PROTOCOL_VERSION, "bootstrap hello")?;
    check_secret(&mut decoder, id)?;
    let rank = decoder.usize()?;
    check_world_size(&mut decoder, world_size)?;
    check_roots(&mut decoder, roots)?;
    if !members.contains(&rank) {
        return Err(Error::protocol(format!(
            "rank {rank} cannot join this root of a {world_size}-rank job (it serves ranks {members:?})"
        )));
    }
    let entry = decode_entry(&mut decoder)?;
    decoder.finish()?;
    Ok((rank, entry))
}

/// A root's acknowledgement that `rank` (a member, or the first rank of a group) has joined.
pub(super) fn encode_root_ack(id: &UniqueId, rank: usize) -> Vec<u8> {
    Encoder::new(ROOT_ACK_MAGIC, PROTOCOL_VERSION).raw(&id.secret).usize(rank).finish()
}

pub(super) fn decode_root_ack(bytes: &[u8], id: &UniqueId, rank: usize) -> Result<()> {
    let mut decoder = Decoder::new(bytes, ROOT_ACK_MAGIC, PROTOCOL_VERSION, "bootstrap root acknowledgement")?;
    check_secret(&mut decoder, id)?;
    let theirs = decoder.usize()?;
    decoder.finish()?;
    if theirs != rank {
        return Err(Error::protocol(format!("the root acknowledged rank {theirs}, this is rank {rank}")));
    }
    Ok(())
}

/// The table of group `group` (ranks from `first`), sent to the first root (`id` is the job's).
pub(super) fn encode_group_table(
    id: &UniqueId,
    world_size: usize,
    roots: usize,
    group: usize,
    first: usize,
    entries: &[RankEntry],
) -> Vec<u8> {
    let mut encoder = Encoder::new(GROUP_TABLE_MAGIC, PROTOCOL_VERSION);
    encoder.raw(&id.secret).usize(world_size).usize(roots).usize(group).usize(first).usize(entries.len());
    entries.iter().for_each(|entry| encode_entry(&mut encoder, entry));
    encoder.finish()
}

/// Checks a group table; `range_of(group)` gives the ranks a group must hold. Returns the
/// group and its entries.
pub(super) fn decode_group_table(
    bytes: &[u8],
    id: &UniqueId,
    world_size: usize,
    roots: usize,
    range_of: impl Fn(usize) -> Range<usize>,
) -> Result<(usize, Vec<RankEntry>)> {
    let mut decoder = Decoder::new(bytes, GROUP_TABLE_MAGIC, PROTOCOL_VERSION, "bootstrap group table")?;
    check_secret(&mut decoder, id)?;
    check_world_size(&mut decoder, world_size)?;
    check_roots(&mut decoder, roots)?;
    let group = decoder.usize()?;
    let first = decoder.usize()?;
    let count = decoder.usize()?;
    if group == 0 || group >= roots || range_of(group) != (first..first.saturating_add(count)) {
        return Err(Error::protocol(format!(
            "a table of group {group} (ranks {first}.. {count} of them) does not fit a {world_size}-rank job of {roots} roots"
        )));
    }
    let entries = (0..count).map(|_| decode_entry(&mut decoder)).collect::<Result<Vec<_>>>()?;
    decoder.finish()?;
    Ok((group, entries))
}

pub(super) fn encode_rank_table(id: &UniqueId, entries: &[RankEntry]) -> Vec<u8> {
    let mut encoder = Encoder::new(RANK_TABLE_MAGIC, PROTOCOL_VERSION);
    encoder.raw(&id.secret).usize(entries.len());
    entries.iter().for_each(|entry| encode_entry(&mut encoder, entry));
    encoder.finish()
}

pub(super) fn decode_rank_table(bytes: &[u8], id: &UniqueId, world_size: usize) -> Result<Vec<RankEntry>> {
    let mut decoder = Decoder::new(bytes, RANK_TABLE_MAGIC, PROTOCOL_VERSION, "bootstrap rank table")?;
    check_secret(&mut decoder, id)?;
    check_world_size(&mut decoder, world_size)?;
    let entries = (0..world_size).map(|_| decode_entry(&mut decoder)).collect::<Result<Vec<_>>>()?;
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

    fn entry(addr: &str, host: &str) -> RankEntry {
        RankEntry { listen_addr: addr.parse().unwrap(), host: host.into() }
    }

    #[test]
    fn handshake_messages_reject_garbage() {
        let id = UniqueId::with_secret("127.0.0.1:1".parse().unwrap(), [3; 16]);
        let stranger = UniqueId::with_secret(id.addr, [4; 16]);
        let me = entry("10.0.0.1:5", "host/boot");
        let hello = encode_root_hello(&id, 2, 4, 1, &me);
        let (rank, got) = decode_root_hello(&hello, &id, 4, 1, 1..4).unwrap();
        assert_eq!((rank, got.listen_addr, got.host.as_str()), (2, me.listen_addr, "host/boot"));
        for cut in 0..hello.len() {
            assert!(matches!(decode_root_hello(&hello[..cut], &id, 4, 1, 1..4), Err(Error::Protocol(_))), "cut {cut}");
        }
        assert!(decode_root_hello(&hello, &id, 5, 1, 1..5).is_err(), "world size differs");
        assert!(decode_root_hello(&hello, &id, 4, 2, 1..4).is_err(), "number of roots differs");
        assert!(decode_root_hello(&hello, &id, 4, 1, 3..4).is_err(), "rank of another group");
        assert!(decode_root_hello(&encode_root_hello(&id, 0, 4, 1, &me), &id, 4, 1, 1..4).is_err(), "the root");
        assert!(decode_root_hello(&encode_root_hello(&id, 4, 4, 1, &me), &id, 4, 1, 1..4).is_err(), "too big");
        assert!(decode_root_hello(&encode_root_hello(&stranger, 1, 4, 1, &me), &id, 4, 1, 1..4).is_err());

        let ack = encode_root_ack(&id, 3);
        decode_root_ack(&ack, &id, 3).unwrap();
        assert!(decode_root_ack(&ack, &id, 2).is_err(), "another rank's");
        assert!(decode_root_ack(&ack, &stranger, 3).is_err(), "wrong secret");

        let peer = encode_peer_hello(&id, 3, 1, 4);
        assert_eq!(decode_peer_hello(&peer, &id, 4, 1).unwrap(), 3);
        assert!(decode_peer_hello(&peer, &id, 4, 2).is_err(), "addressed to another rank");
        assert!(decode_peer_hello(&peer, &stranger, 4, 1).is_err(), "wrong secret");
        assert!(decode_peer_hello(&encode_peer_hello(&id, 1, 1, 4), &id, 4, 1).is_err(), "from itself");
        assert!(decode_peer_hello(&encode_peer_hello(&id, 9, 1, 4), &id, 4, 1).is_err(), "from out of range");
        let mut old = peer.clone();
        old[4..6].copy_from_slice(&(PROTOCOL_VERSION - 1).to_le_bytes());
        let refused = decode_peer_hello(&old, &id, 4, 1);
        assert!(matches!(&refused, Err(Error::Protocol(m)) if m.contains("version")), "{refused:?}");

        let entries = vec![entry("127.0.0.1:1", "a"), entry("[::1]:9", "b")];
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

    #[test]
    fn group_tables_must_fit_their_group() {
        let id = UniqueId::with_secret("127.0.0.1:1".parse().unwrap(), [3; 16]);
        let range_of = |g: usize| [0..3, 3..5, 5..7][g].clone();
        let entries = vec![entry("127.0.0.1:2", "a"), entry("127.0.0.1:3", "b")];
        let table = encode_group_table(&id, 7, 3, 1, 3, &entries);
        let (group, got) = decode_group_table(&table, &id, 7, 3, range_of).unwrap();
        assert_eq!((group, got.len(), got[1].host.as_str()), (1, 2, "b"));
        assert!(decode_group_table(&encode_group_table(&id, 7, 3, 1, 2, &entries), &id, 7, 3, range_of).is_err());
        assert!(decode_group_table(&encode_group_table(&id, 7, 3, 0, 0, &entries), &id, 7, 3, range_of).is_err());
        assert!(decode_group_table(&encode_group_table(&id, 7, 3, 3, 5, &entries), &id, 7, 3, range_of).is_err());
        assert!(decode_group_table(&table, &id, 7, 2, range_of).is_err(), "number of roots differs");
        for cut in 0..table.len() {
            assert!(decode_group_table(&table[..cut], &id, 7, 3, range_of).is_err(), "cut {cut}");
        }
    }
}
