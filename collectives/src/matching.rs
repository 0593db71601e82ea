//! Point-to-point matching: every message of a group carries a [`PairStamp`] — what the
//! sender's group sends to the receiver — and the receiver checks it against what its own group
//! receives from the sender before it takes the data, so that a send nobody received is found
//! at the pair's next exchange in that direction instead of being taken for a later message of
//! another size or another epoch.
//!
//! # The rule
//!
//! Each direction of a pair is matched on its own, in order, as NCCL does: the groups of a rank
//! that send to a peer match, one to one, the groups of the peer that receive from it; a
//! group's sends to the peer match, one to one and in order, the matching group's receives
//! (same sizes); and the two groups lie between the same collectives of the communicator. (NCCL
//! would also match a send to a receive of another epoch; a program that relies on that
//! deadlocks once its messages outgrow the buffers, so weave reports it.)
//!
//! # The stamp
//!
//! For each peer a group sends to, the stamp holds: how many groups of this rank sent to that
//! peer (this one included: the direction's *exchange* number), how many collectives this rank
//! had begun (the *epoch*), and how many sends the group has to the peer, with a digest of their
//! sizes in order. The receiving group states the same of its receives from the sender. An
//! unmatched send of an earlier group arrives first at the receiver's next group that receives
//! from the sender, stamped with the earlier group's sends: it differs unless the two groups
//! move the same sizes in the same epoch — and then its data is what NCCL's in-order matching
//! would deliver there too.
//!
//! A rank that finds a mismatch revokes the communicator, so that the peer — which may have
//! returned from its group long ago — stops too.

use comm_core::{Error, Result};

/// What a group moves in one direction of a pair (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PairStamp {
    /// Groups of this rank that moved data in this direction, this one included.
    pub(crate) exchange: u64,
    /// This rank's group sequence number (its ledger's): for messages only.
    pub(crate) group: u64,
    /// Collectives this rank had begun.
    pub(crate) epoch: u64,
    /// Messages in this direction in this group.
    pub(crate) messages: u64,
    /// Digest of their sizes, in order.
    pub(crate) sizes: u64,
}

/// Words of a stamp in a message header.
pub(crate) const STAMP_WORDS: usize = 5;

impl PairStamp {
    /// The stamp as header words.
    pub(crate) fn to_words(self) -> [u64; STAMP_WORDS] {
        [self.exchange, self.group, self.epoch, self.messages, self.sizes]
    }

    /// A stamp from header words.
    pub(crate) fn from_words(w: [u64; STAMP_WORDS]) -> Self {
        PairStamp { exchange: w[0], group: w[1], epoch: w[2], messages: w[3], sizes: w[4] }
    }

    /// A digest of what must agree (24 bits, for headers without room for the whole stamp).
    pub(crate) fn digest(&self) -> u32 {
        let words = [self.exchange, self.epoch, self.messages];
        (words.iter().fold(mix(self.sizes), |h, &w| mix(h ^ w)) & 0xff_ffff) as u32
    }

    /// Whether `self` (a sender's stamp) and `receiving` (the receiver's) describe one exchange.
    fn matches(&self, receiving: &PairStamp) -> bool {
        PairStamp { group: 0, ..*self } == PairStamp { group: 0, ..*receiving }
    }

    /// Checks `theirs` (the stamp on a message `m`) against `mine` (what this rank's group
    /// receives from its sender).
    pub(crate) fn check(theirs: &PairStamp, mine: &PairStamp, m: Met) -> Result<()> {
        if theirs.matches(mine) {
            return Ok(());
        }
        Err(mismatch(m, theirs.group, mine, &describe(theirs, "send(s) to", m.me)))
    }

    /// [`check`](Self::check) for a message that carries only the sender's group number and
    /// [`digest`](Self::digest).
    pub(crate) fn check_digest(digest: u32, group: u64, mine: &PairStamp, m: Met) -> Result<()> {
        if digest == mine.digest() {
            return Ok(());
        }
        let theirs = format!("its sends to rank {} differ (stamp digest {digest:#08x})", m.me);
        Err(mismatch(m, group, mine, &theirs))
    }
}

/// A message as its receiver meets it: from `peer` to `me`, `sent` bytes long, for a receive
/// of `len` bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Met {
    pub(crate) peer: usize,
    pub(crate) me: usize,
    pub(crate) sent: u64,
    pub(crate) len: usize,
}

/// What a stamp says, for messages.
fn describe(s: &PairStamp, what: &str, other: usize) -> String {
    format!("its exchange {} with rank {other}, after {} collectives, {} {what} it", s.exchange, s.epoch, s.messages)
}

/// The error of a mismatched pair (see the module documentation).
#[cold]
#[inline(never)]
fn mismatch(m: Met, group: u64, mine: &PairStamp, theirs: &str) -> Error {
    Error::protocol(format!(
        "point-to-point mismatch: rank {} sent {} B in its point-to-point group {group} ({theirs}), which rank {} met \
         receiving {} B in its group {} ({}): a send of an earlier group was never received, or a receive had no \
         matching send; the sends and receives of a pair must match one to one, in order and of equal sizes, \
         between the same collectives. The communicator is revoked; shrink it or build a new one",
        m.peer,
        m.sent,
        m.me,
        m.len,
        mine.group,
        describe(mine, "receive(s) from", m.peer)
    ))
}

/// A 64-bit mixing step (splitmix64's finalizer).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Per peer, how many groups of this rank sent to it and received from it (a communicator's
/// counts, advanced by each group).
pub(crate) type Exchanges = Vec<[u64; 2]>;

/// The stamps of one group: per peer it sends to, and per peer it receives from (sorted by
/// peer).
#[derive(Debug, Default)]
pub(crate) struct GroupStamps {
    sending: Vec<(usize, PairStamp)>,
    receiving: Vec<(usize, PairStamp)>,
}

impl GroupStamps {
    /// The stamps of a group of rank `me` moving `transfers` — (peer, whether a send, bytes),
    /// in the group's order — numbered `group`, after `epoch` collectives; `exchanges` is
    /// advanced here. Transfers with peers outside `0..exchanges.len()` are left out (the
    /// executor rejects them); so are those with `me`.
    pub(crate) fn new(
        transfers: impl IntoIterator<Item = (usize, bool, usize)>,
        me: usize,
        group: u64,
        epoch: u64,
        exchanges: &mut Exchanges,
    ) -> Self {
        let mut stamps = GroupStamps::default();
        for (peer, sending, bytes) in transfers {
            if peer == me || peer >= exchanges.len() {
                continue;
            }
            let side = if sending { &mut stamps.sending } else { &mut stamps.receiving };
            let at = match side.binary_search_by_key(&peer, |s| s.0) {
                Ok(at) => at,
                Err(at) => {
                    side.insert(at, (peer, PairStamp { group, epoch, ..PairStamp::default() }));
                    at
                }
            };
            let s = &mut side[at].1;
            s.messages += 1;
            s.sizes = mix(s.sizes ^ bytes as u64);
        }
        for (direction, side) in [&mut stamps.sending, &mut stamps.receiving].into_iter().enumerate() {
            for (peer, s) in side.iter_mut() {
                exchanges[*peer][direction] += 1;
                s.exchange = exchanges[*peer][direction];
            }
        }
        stamps
    }

    /// This group's stamp on its sends to `peer`.
    pub(crate) fn sending_to(&self, peer: usize) -> Result<PairStamp> {
        Self::find(&self.sending, peer, "send to")
    }

    /// This group's stamp of its receives from `peer`.
    pub(crate) fn receiving_from(&self, peer: usize) -> Result<PairStamp> {
        Self::find(&self.receiving, peer, "receive from")
    }

    fn find(side: &[(usize, PairStamp)], peer: usize, what: &str) -> Result<PairStamp> {
        match side.binary_search_by_key(&peer, |s| s.0) {
            Ok(at) => Ok(side[at].1),
            Err(_) => Err(Error::invalid(format!("the group has no {what} rank {peer}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(peer: usize, len: usize) -> (usize, bool, usize) {
        (peer, true, len)
    }

    fn recv(peer: usize, len: usize) -> (usize, bool, usize) {
        (peer, false, len)
    }

    fn met(peer: usize, me: usize, len: usize) -> Met {
        Met { peer, me, sent: len as u64, len }
    }

    #[test]
    fn directions_match_on_their_own_and_an_orphan_of_another_size_is_found() {
        let (mut ex0, mut ex1) = (vec![[0u64; 2]; 3], vec![[0u64; 2]; 3]);
        // Rank 0 sends to rank 1 in one group and receives from it in the next; rank 1 does it
        // the other way round: legal, each direction in order.
        let a0 = GroupStamps::new([send(1, 36), send(2, 4)], 0, 1, 0, &mut ex0);
        let b1 = GroupStamps::new([send(0, 8)], 1, 1, 0, &mut ex1);
        let b0 = GroupStamps::new([recv(1, 8)], 0, 2, 0, &mut ex0);
        let a1 = GroupStamps::new([recv(0, 36)], 1, 2, 0, &mut ex1);
        PairStamp::check(&a0.sending_to(1).unwrap(), &a1.receiving_from(0).unwrap(), met(0, 1, 36)).unwrap();
        PairStamp::check(&b1.sending_to(0).unwrap(), &b0.receiving_from(1).unwrap(), met(1, 0, 8)).unwrap();
        let (s, r) = (a0.sending_to(1).unwrap(), a1.receiving_from(0).unwrap());
        PairStamp::check_digest(s.digest(), 1, &r, met(0, 1, 36)).unwrap();
        assert_eq!(PairStamp::from_words(s.to_words()), s);
        // Rank 1 sends 36 B that rank 0 never receives; rank 0's next receive from it is 20 B.
        let orphan = GroupStamps::new([send(0, 36)], 1, 3, 0, &mut ex1).sending_to(0).unwrap();
        let next = GroupStamps::new([recv(1, 20), send(1, 8)], 0, 3, 0, &mut ex0).receiving_from(1).unwrap();
        let e = PairStamp::check(&orphan, &next, Met { peer: 1, me: 0, sent: 36, len: 20 }).unwrap_err().to_string();
        assert!(
            e.contains("rank 1 sent 36 B in its point-to-point group 3") && e.contains("receiving 20 B in its group 3"),
            "{e}"
        );
        assert!(PairStamp::check_digest(orphan.digest(), 3, &next, met(1, 0, 20)).is_err());
        // The same sizes after a collective on one side only do not match either.
        let late = PairStamp { epoch: 1, ..r };
        assert!(PairStamp::check(&s, &late, met(0, 1, 36)).is_err());
        assert!(GroupStamps::default().sending_to(4).is_err() && GroupStamps::default().receiving_from(4).is_err());
    }
}
