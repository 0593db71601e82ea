//! Point-to-point matching: every message of a group carries a [`PairStamp`] — what the
//! sender's group does with the receiver — and the receiver checks it against its own group
//! before it takes the data, so a send nobody received, or a receive nobody sent to, is found
//! at the next exchange between the two ranks instead of being taken for the next message.
//!
//! # The rule
//!
//! Within a group, the sends of one rank to a peer match, one to one and in order, the receives
//! of the peer's group from it, and the two groups lie between the same collectives of the
//! communicator. (NCCL matches sends and receives in order across groups too; a program that
//! relies on that can deadlock once its messages outgrow the buffers, so weave reports it.)
//!
//! # The stamp
//!
//! For each peer a group has operations with, the stamp holds: how many groups of this rank
//! had operations with that peer (this one included: the pair's *exchange* number), how many
//! collectives this rank had begun (the *epoch*), and how many sends and receives the group
//! has with the peer, with a digest of their sizes in order. The peer's group must say the
//! same with sends and receives swapped. An unmatched send of an earlier group arrives first
//! at the receiver's next group with that peer, stamped with the earlier group's operations:
//! it differs unless the two groups do exactly the same with the pair, in which case the data
//! it carries is what a matching send of the later group would carry (the same size, sent in
//! the same order), as NCCL would match it.
//!
//! A rank that finds a mismatch revokes the communicator, so that the peer — which may have
//! returned from its group long ago — stops too.

use comm_core::{Error, Result};

use crate::group::P2pOp;

/// What a group does with one peer, as its messages to that peer say (see the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PairStamp {
    /// Groups of this rank with operations with the peer, this one included.
    pub(crate) exchange: u64,
    /// This rank's group sequence number (its ledger's): for messages only.
    pub(crate) group: u64,
    /// Collectives this rank had begun.
    pub(crate) epoch: u64,
    /// Sends to the peer in this group.
    pub(crate) sends: u32,
    /// Receives from the peer in this group.
    pub(crate) recvs: u32,
    /// Digest of the send sizes, in order.
    pub(crate) send_sizes: u64,
    /// Digest of the receive sizes, in order.
    pub(crate) recv_sizes: u64,
}

/// Words of a stamp in a message header.
pub(crate) const STAMP_WORDS: usize = 6;

impl PairStamp {
    /// The stamp as header words.
    pub(crate) fn to_words(self) -> [u64; STAMP_WORDS] {
        let counts = u64::from(self.sends) | u64::from(self.recvs) << 32;
        [self.exchange, self.group, self.epoch, counts, self.send_sizes, self.recv_sizes]
    }

    /// A stamp from header words.
    pub(crate) fn from_words(w: [u64; STAMP_WORDS]) -> Self {
        PairStamp {
            exchange: w[0],
            group: w[1],
            epoch: w[2],
            sends: w[3] as u32,
            recvs: (w[3] >> 32) as u32,
            send_sizes: w[4],
            recv_sizes: w[5],
        }
    }

    /// A digest of what must agree, as the sender states it (24 bits, for headers without
    /// room for the whole stamp).
    pub(crate) fn digest(&self) -> u32 {
        let words = [self.exchange, self.epoch, u64::from(self.sends), self.send_sizes, u64::from(self.recvs)];
        (words.iter().fold(mix(self.recv_sizes), |h, &w| mix(h ^ w)) & 0xff_ffff) as u32
    }

    /// The [`digest`](Self::digest) that messages of the peer's matching group carry.
    pub(crate) fn expected_digest(&self) -> u32 {
        self.as_peer_states_it().digest()
    }

    /// The stamp the peer's matching group would send: this one with sends and receives
    /// swapped.
    fn as_peer_states_it(&self) -> PairStamp {
        PairStamp {
            sends: self.recvs,
            recvs: self.sends,
            send_sizes: self.recv_sizes,
            recv_sizes: self.send_sizes,
            ..*self
        }
    }

    /// Checks `theirs` (the stamp on a message from `peer`, `sent` bytes long) against `mine`
    /// (this rank `me`'s group with `peer`, receiving `len` bytes).
    pub(crate) fn check(
        theirs: &PairStamp,
        mine: &PairStamp,
        peer: usize,
        me: usize,
        sent: u64,
        len: usize,
    ) -> Result<()> {
        let expected = mine.as_peer_states_it();
        let agrees = theirs.exchange == expected.exchange
            && theirs.epoch == expected.epoch
            && (theirs.sends, theirs.send_sizes, theirs.recvs, theirs.recv_sizes)
                == (expected.sends, expected.send_sizes, expected.recvs, expected.recv_sizes);
        if agrees {
            return Ok(());
        }
        Err(mismatch(peer, me, sent, len, theirs.group, mine, &describe(theirs, me)))
    }

    /// [`check`](Self::check) for a message that carries only the sender's group number and
    /// [`digest`](Self::digest).
    pub(crate) fn check_digest(
        digest: u32,
        group: u64,
        mine: &PairStamp,
        peer: usize,
        me: usize,
        sent: u64,
        len: usize,
    ) -> Result<()> {
        if digest == mine.as_peer_states_it().digest() {
            return Ok(());
        }
        let theirs = format!("its operations with rank {me} differ (stamp digest {digest:#08x})");
        Err(mismatch(peer, me, sent, len, group, mine, &theirs))
    }
}

/// What a stamp says, for messages.
fn describe(s: &PairStamp, other: usize) -> String {
    format!(
        "its exchange {} with rank {other}, after {} collectives, with {} send(s) to and {} receive(s) from it",
        s.exchange, s.epoch, s.sends, s.recvs
    )
}

/// The error of a mismatched pair (see the module documentation).
#[cold]
#[inline(never)]
fn mismatch(peer: usize, me: usize, sent: u64, len: usize, group: u64, mine: &PairStamp, theirs: &str) -> Error {
    Error::protocol(format!(
        "point-to-point mismatch: rank {peer} sent {sent} B in its point-to-point group {group} ({theirs}), which rank \
         {me} met receiving {len} B in its group {} ({}): a send of an earlier group was never received, or a \
         receive had no matching send; sends and receives of a pair must match one to one within their groups, \
         between the same collectives. The communicator is revoked; shrink it or build a new one",
        mine.group,
        describe(mine, peer)
    ))
}

/// A 64-bit mixing step (splitmix64's finalizer).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The stamps of one group, per peer it has operations with (sorted by peer).
#[derive(Debug, Default)]
pub(crate) struct GroupStamps {
    stamps: Vec<(usize, PairStamp)>,
}

impl GroupStamps {
    /// The stamps of a group of `ops` of rank `me`, numbered `group`, after `epoch`
    /// collectives; `exchanges` (one per peer) counts the groups each pair had and is advanced
    /// here. Operations with peers outside `0..exchanges.len()` are left out (the executor
    /// rejects them); so is `me`.
    pub(crate) fn new(ops: &[P2pOp], me: usize, group: u64, epoch: u64, exchanges: &mut [u64]) -> Self {
        let mut stamps: Vec<(usize, PairStamp)> = Vec::new();
        for op in ops {
            let peer = op.peer();
            if peer == me || peer >= exchanges.len() {
                continue;
            }
            let at = match stamps.binary_search_by_key(&peer, |s| s.0) {
                Ok(at) => at,
                Err(at) => {
                    stamps.insert(at, (peer, PairStamp { group, epoch, ..PairStamp::default() }));
                    at
                }
            };
            let s = &mut stamps[at].1;
            match op {
                P2pOp::Send { len, .. } => {
                    s.sends += 1;
                    s.send_sizes = mix(s.send_sizes ^ *len as u64);
                }
                P2pOp::Recv { len, .. } => {
                    s.recvs += 1;
                    s.recv_sizes = mix(s.recv_sizes ^ *len as u64);
                }
            }
        }
        for (peer, s) in &mut stamps {
            exchanges[*peer] += 1;
            s.exchange = exchanges[*peer];
        }
        GroupStamps { stamps }
    }

    /// This group's stamp with `peer`.
    pub(crate) fn with(&self, peer: usize) -> Result<PairStamp> {
        match self.stamps.binary_search_by_key(&peer, |s| s.0) {
            Ok(at) => Ok(self.stamps[at].1),
            Err(_) => Err(Error::invalid(format!("the group has no operation with rank {peer}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(peer: usize, len: usize) -> P2pOp {
        P2pOp::Send { peer, data: std::ptr::null(), len }
    }

    fn recv(peer: usize, len: usize) -> P2pOp {
        P2pOp::Recv { peer, data: std::ptr::null_mut(), len }
    }

    #[test]
    fn matching_groups_agree_and_an_orphaned_send_is_found_at_the_next_exchange() {
        let (mut ex0, mut ex1) = (vec![0u64; 3], vec![0u64; 3]);
        // Group 1: rank 0 sends 36 B to rank 1 and receives 8 B from it; rank 1 the converse.
        let g0 = GroupStamps::new(&[send(1, 36), recv(1, 8), send(2, 4)], 0, 1, 0, &mut ex0);
        let g1 = GroupStamps::new(&[recv(0, 36), send(0, 8)], 1, 1, 0, &mut ex1);
        let (a, b) = (g0.with(1).unwrap(), g1.with(0).unwrap());
        PairStamp::check(&a, &b, 0, 1, 36, 36).unwrap();
        PairStamp::check(&b, &a, 1, 0, 8, 8).unwrap();
        PairStamp::check_digest(a.digest(), 1, &b, 0, 1, 36, 36).unwrap();
        assert!(PairStamp::from_words(a.to_words()) == a);
        // Group 2: rank 1 sends 36 B to rank 0, which has nothing with rank 1 (its group only
        // sends to rank 2).
        let orphan = GroupStamps::new(&[send(0, 36)], 1, 2, 0, &mut ex1).with(0).unwrap();
        GroupStamps::new(&[send(2, 4)], 0, 2, 0, &mut ex0);
        // Group 3: rank 0 receives 36 B from and sends 8 B to rank 1: the orphan arrives first.
        let next = GroupStamps::new(&[recv(1, 36), send(1, 8)], 0, 3, 0, &mut ex0).with(1).unwrap();
        let e = PairStamp::check(&orphan, &next, 1, 0, 36, 36).unwrap_err().to_string();
        assert!(e.contains("rank 1 sent 36 B in its point-to-point group 2") && e.contains("its group 3"), "{e}");
        assert!(PairStamp::check_digest(orphan.digest(), 2, &next, 1, 0, 36, 36).is_err());
        // The same groups after different numbers of collectives do not match either.
        let late = PairStamp { epoch: 1, ..b };
        assert!(PairStamp::check(&a, &late, 0, 1, 36, 36).is_err());
        assert!(GroupStamps::default().with(4).is_err());
    }
}
