//! The TCP bootstrap's messages, for the fuzz targets (feature `fuzzing`): each decoder runs on
//! arbitrary bytes in the context a stranger's message meets at a listening rank, and whatever
//! it accepts must encode back to the same bytes.

use std::ops::Range;

use super::messages::*;
use super::rendezvous::group_range;
use crate::bootstrap::UniqueId;

/// The job whose secret the fuzzed messages must carry (a fixed one, so inputs replay).
fn job() -> UniqueId {
    UniqueId::with_secret(([127, 0, 0, 1], 29500).into(), [0x5a; 16])
}

/// Runs the decoder the first byte picks (root hello, root acknowledgement, group table, rank
/// table, peer hello) on the rest, for a job of the world size and root count the next two
/// bytes give; returns whether it accepted the message, and panics when an accepted one does not
/// encode back to its bytes.
pub(crate) fn message(data: &[u8]) -> bool {
    let [which, world, roots, bytes @ ..] = data else { return false };
    let id = job();
    let world_size = usize::from(*world).max(1);
    let roots = usize::from(*roots).clamp(1, world_size);
    let members: Range<usize> = group_range(0, world_size, roots);
    match which % 5 {
        0 => {
            let Ok((rank, entry)) = decode_root_hello(bytes, &id, world_size, roots, members.clone()) else {
                return false;
            };
            assert!(members.contains(&rank));
            assert_eq!(encode_root_hello(&id, rank, world_size, roots, &entry), bytes);
        }
        1 => {
            let rank = world_size - 1;
            if decode_root_ack(bytes, &id, rank).is_err() {
                return false;
            }
            assert_eq!(encode_root_ack(&id, rank), bytes);
        }
        2 => {
            let range_of = |g| group_range(g, world_size, roots);
            let Ok((group, entries)) = decode_group_table(bytes, &id, world_size, roots, range_of) else {
                return false;
            };
            let range = group_range(group, world_size, roots);
            assert_eq!(entries.len(), range.len());
            assert_eq!(encode_group_table(&id, world_size, roots, group, range.start, &entries), bytes);
        }
        3 => {
            let Ok(entries) = decode_rank_table(bytes, &id, world_size) else { return false };
            assert_eq!(entries.len(), world_size);
            assert_eq!(encode_rank_table(&id, &entries), bytes);
        }
        _ => {
            let me = 0;
            let Ok(from) = decode_peer_hello(bytes, &id, world_size, me) else { return false };
            assert!(from < world_size && from != me);
            assert_eq!(encode_peer_hello(&id, from, me, world_size), bytes);
        }
    }
    true
}

/// Valid messages of each kind for a 4-rank job of 2 roots, with [`message`]'s three leading
/// bytes: seeds for the fuzz target's corpus.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let id = job();
    let (world_size, roots) = (4, 2);
    let entry = |port: u16| super::messages::RankEntry {
        listen_addr: ([10, 0, 0, 1], port).into(),
        host: format!("node-{port}"),
    };
    let framed = |which: u8, bytes: Vec<u8>| [vec![which, world_size as u8, roots as u8], bytes].concat();
    vec![
        framed(0, encode_root_hello(&id, 1, world_size, roots, &entry(1001))),
        framed(1, encode_root_ack(&id, world_size - 1)),
        framed(2, encode_group_table(&id, world_size, roots, 1, 2, &[entry(1002), entry(1003)])),
        framed(3, encode_rank_table(&id, &(0..4).map(|r| entry(1000 + r)).collect::<Vec<_>>())),
        framed(4, encode_peer_hello(&id, 2, 0, world_size)),
    ]
}
