//! The collective operations of a [`Bootstrap`] — all-gather, broadcast, barrier — along a tree
//! of its ranks, built from `send` and `recv` alone, so that no rank sends or receives more than
//! [`FANOUT`] + 1 messages per call and a bootstrap that links ranks on demand needs at most
//! that many links for them.
//!
//! # The tree
//!
//! Rank 0 is the root; rank `r > 0` hangs below [`parent`]`(r) = (r - 1) / FANOUT`, so rank `r`'s
//! children are `FANOUT·r + 1 ..= FANOUT·r + FANOUT` (those below the world size). Depth is
//! `log_FANOUT(n)`: 5 hops at 1,024 ranks, 9 at 100,000.
//!
//! # Messages
//!
//! Each call sends one *up* message from every rank to its parent (gathered contributions, or
//! nothing for a barrier) and one *down* message from every rank to each child (the result).
//! A broadcast whose root is not rank 0 first sends the data from the root to rank 0, then down
//! the tree. Every message starts with a status byte:
//!
//! * `0`: success, then the payload (all-gather: `(rank u64, length u64, bytes)` entries up,
//!   every contribution as `(length u64, bytes)` in rank order down; broadcast: the data).
//! * `1`: failure somewhere in the tree: kind `u8` (0 peer lost, 1 timeout, 2 other), peer `u64`
//!   (`u64::MAX`: none), then the description as `(length u64, bytes)`.
//!
//! A rank that fails to hear from a child (or its parent) still sends every message it owes, with
//! the failure in place of data, so a lost rank fails every other rank of the call promptly,
//! naming the lost rank, instead of leaving them to time out; and no message is left behind for
//! a later call to misread.

use std::time::Duration;

use super::{Bootstrap, TAG_ALL_GATHER, TAG_BARRIER, TAG_BROADCAST};
use crate::error::{Error, Result};

/// Children per rank of the tree.
pub const FANOUT: usize = 4;

const STATUS_OK: u8 = 0;
const STATUS_FAILED: u8 = 1;
const KIND_LOST: u8 = 0;
const KIND_TIMEOUT: u8 = 1;
const KIND_OTHER: u8 = 2;

/// The parent of `rank` in the tree (`None` for rank 0).
pub fn parent(rank: usize) -> Option<usize> {
    (rank > 0).then(|| (rank - 1) / FANOUT)
}

/// The children of `rank` in a tree of `world_size` ranks.
pub fn children(rank: usize, world_size: usize) -> impl Iterator<Item = usize> {
    let first = rank.saturating_mul(FANOUT).saturating_add(1);
    (first..first.saturating_add(FANOUT)).filter(move |&c| c < world_size)
}

/// True when `rank` lies in the subtree below (and including) `top`.
fn in_subtree(mut rank: usize, top: usize) -> bool {
    loop {
        if rank == top {
            return true;
        }
        match parent(rank) {
            Some(p) if rank > top => rank = p,
            _ => return false,
        }
    }
}

/// A failure that travels through the tree in place of data.
struct Failure {
    kind: u8,
    peer: Option<usize>,
    text: String,
}

impl Failure {
    fn of(error: &Error) -> Self {
        match error {
            Error::PeerLost { peer, reason, .. } => {
                Failure { kind: KIND_LOST, peer: Some(*peer), text: reason.clone() }
            }
            Error::Timeout { operation, peer, .. } => {
                Failure { kind: KIND_TIMEOUT, peer: *peer, text: operation.clone() }
            }
            other => Failure { kind: KIND_OTHER, peer: None, text: other.to_string() },
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![STATUS_FAILED, self.kind];
        out.extend_from_slice(&self.peer.map_or(u64::MAX, |p| p as u64).to_le_bytes());
        put_bytes(&mut out, self.text.as_bytes());
        out
    }

    /// The error this rank reports for a failure that `from` passed on during `operation`.
    fn into_error(self, operation: &str, from: usize, timeout: Duration) -> Error {
        match (self.kind, self.peer) {
            (KIND_LOST, Some(peer)) => {
                Error::peer_lost(peer, format!("bootstrap {operation} (passed on by rank {from})"), self.text)
            }
            (KIND_TIMEOUT, peer) => Error::timeout(
                format!("bootstrap {operation}: rank {from} passed on that {}", self.text),
                peer,
                timeout,
            ),
            _ => Error::protocol(format!("bootstrap {operation}: rank {from} passed on a failure: {}", self.text)),
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads tree messages, checking every length.
struct Reader<'a> {
    bytes: &'a [u8],
    what: &'a str,
}

impl<'a> Reader<'a> {
    fn malformed(&self) -> Error {
        Error::protocol(format!("{}: the message is truncated or malformed", self.what))
    }

    fn u8(&mut self) -> Result<u8> {
        let (&first, rest) = self.bytes.split_first().ok_or_else(|| self.malformed())?;
        self.bytes = rest;
        Ok(first)
    }

    fn u64(&mut self) -> Result<u64> {
        let (head, rest) = self.bytes.split_at_checked(8).ok_or_else(|| self.malformed())?;
        self.bytes = rest;
        Ok(u64::from_le_bytes(head.try_into().map_err(|_| self.malformed())?))
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let len = usize::try_from(self.u64()?).map_err(|_| self.malformed())?;
        let (head, rest) = self.bytes.split_at_checked(len).ok_or_else(|| self.malformed())?;
        self.bytes = rest;
        Ok(head)
    }
}

/// Splits a tree message from `from` into its payload, or the error its failure stands for.
fn payload<'a>(message: &'a [u8], operation: &str, from: usize, timeout: Duration) -> Result<Reader<'a>> {
    let what = format!("bootstrap {operation} message from rank {from}");
    let mut reader = Reader { bytes: message, what: "" };
    let status = reader.u8().map_err(|_| Error::protocol(format!("{what} is empty")))?;
    match status {
        STATUS_OK => Ok(reader),
        STATUS_FAILED => {
            let mut decode = || -> Option<Failure> {
                let kind = reader.u8().ok()?;
                let peer = reader.u64().ok()?;
                let text = String::from_utf8_lossy(reader.bytes().ok()?).into_owned();
                Some(Failure { kind, peer: usize::try_from(peer).ok().filter(|_| peer != u64::MAX), text })
            };
            let failure = decode().ok_or_else(|| Error::protocol(format!("{what}: malformed failure report")))?;
            Err(failure.into_error(operation, from, timeout))
        }
        other => Err(Error::protocol(format!("{what} has status {other} (expected 0 or 1)"))),
    }
}

/// The up phase: receives every child's message and passes `combine`'s result (or the first
/// failure) to the parent; returns what went up.
fn gather_up<B: Bootstrap + ?Sized>(
    b: &B,
    tag: u64,
    operation: &str,
    mut up: Result<Vec<u8>>,
    mut combine: impl FnMut(usize, Reader<'_>, &mut Vec<u8>) -> Result<()>,
) -> Result<Vec<u8>> {
    let (me, n) = (b.rank(), b.world_size());
    for child in children(me, n) {
        let received = b.recv(child, tag).and_then(|message| {
            let reader = payload(&message, operation, child, b.timeout())?;
            match &mut up {
                Ok(acc) => combine(child, reader, acc),
                Err(_) => Ok(()),
            }
        });
        if let (Err(e), Ok(_)) = (received, &up) {
            up = Err(e);
        }
    }
    if let Some(p) = parent(me) {
        let message = match &up {
            Ok(acc) => acc.clone(),
            Err(e) => Failure::of(e).encode(),
        };
        if let (Err(e), Ok(_)) = (b.send(p, tag, &message), &up) {
            up = Err(e);
        }
    }
    up
}

/// The down phase: takes the result from the parent (rank 0: `at_root()`) and passes it (or the
/// failure) on to every child; returns the result's message.
fn spread_down<B: Bootstrap + ?Sized>(
    b: &B,
    tag: u64,
    operation: &str,
    at_root: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let (me, n) = (b.rank(), b.world_size());
    let mut down = match parent(me) {
        None => at_root(),
        Some(p) => b.recv(p, tag).and_then(|message| {
            payload(&message, operation, p, b.timeout())?;
            Ok(message)
        }),
    };
    let failure = down.as_ref().err().map(|e| Failure::of(e).encode());
    for child in children(me, n) {
        let sent = b.send(child, tag, failure.as_deref().unwrap_or_else(|| down.as_deref().unwrap_or_default()));
        if let (Err(e), Ok(_)) = (sent, &down) {
            down = Err(e);
        }
    }
    down
}

/// Every rank's `data`, indexed by rank; see the [module](self) for the messages.
pub fn all_gather<B: Bootstrap + ?Sized>(b: &B, data: &[u8]) -> Result<Vec<Vec<u8>>> {
    const OPERATION: &str = "all_gather";
    let (me, n) = (b.rank(), b.world_size());
    let mut mine = vec![STATUS_OK];
    mine.extend_from_slice(&(me as u64).to_le_bytes());
    put_bytes(&mut mine, data);
    // The root collects into slots instead of re-encoding.
    let mut slots: Vec<Option<Vec<u8>>> = if me == 0 { vec![None; n] } else { Vec::new() };
    if me == 0 {
        slots[0] = Some(data.to_vec());
    }
    let up = gather_up(b, TAG_ALL_GATHER, OPERATION, Ok(mine), |child, mut reader, acc| {
        reader.what = "bootstrap all_gather contribution";
        while !reader.bytes.is_empty() {
            let rank = usize::try_from(reader.u64()?).map_err(|_| reader.malformed())?;
            let contribution = reader.bytes()?;
            if rank >= n || !in_subtree(rank, child) {
                return Err(Error::protocol(format!(
                    "bootstrap all_gather: rank {child} passed up a contribution of rank {rank}, not of its subtree"
                )));
            }
            if me == 0 {
                if slots[rank].is_some() {
                    return Err(Error::protocol(format!("bootstrap all_gather: rank {rank} contributed twice")));
                }
                slots[rank] = Some(contribution.to_vec());
            } else {
                acc.extend_from_slice(&(rank as u64).to_le_bytes());
                put_bytes(acc, contribution);
            }
        }
        Ok(())
    });
    let at_root = || {
        up?;
        let mut all = vec![STATUS_OK];
        for (rank, slot) in slots.iter().enumerate() {
            let contribution = slot.as_ref().ok_or_else(|| {
                Error::protocol(format!("bootstrap all_gather: the contribution of rank {rank} never arrived"))
            })?;
            put_bytes(&mut all, contribution);
        }
        Ok(all)
    };
    let down = spread_down(b, TAG_ALL_GATHER, OPERATION, at_root)?;
    if me == 0 {
        return Ok(slots.into_iter().flatten().collect());
    }
    let mut reader = payload(&down, OPERATION, parent(me).unwrap_or(0), b.timeout())?;
    reader.what = "bootstrap all_gather result";
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(reader.bytes()?.to_vec());
    }
    if !reader.bytes.is_empty() {
        return Err(reader.malformed());
    }
    Ok(all)
}

/// `root`'s `data` on every rank; see the [module](self) for the messages.
pub fn broadcast<B: Bootstrap + ?Sized>(b: &B, root: usize, data: &[u8]) -> Result<Vec<u8>> {
    const OPERATION: &str = "broadcast";
    let (me, n) = (b.rank(), b.world_size());
    if root >= n {
        return Err(Error::invalid(format!("broadcast root {root} is not a rank of a {n}-rank job")));
    }
    let framed = || {
        let mut message = Vec::with_capacity(data.len() + 1);
        message.push(STATUS_OK);
        message.extend_from_slice(data);
        message
    };
    // A root other than rank 0 hands its data to rank 0 first.
    let relayed = if me == root && me != 0 { b.send(0, TAG_BROADCAST, &framed()) } else { Ok(()) };
    let at_root = || {
        if root == 0 {
            return Ok(framed());
        }
        let message = b.recv(root, TAG_BROADCAST)?;
        payload(&message, OPERATION, root, b.timeout())?;
        Ok(message)
    };
    let down = spread_down(b, TAG_BROADCAST, OPERATION, at_root);
    relayed?;
    let down = down?;
    if me == root {
        return Ok(data.to_vec());
    }
    Ok(down.get(1..).unwrap_or_default().to_vec())
}

/// Returns once every rank has called it; see the [module](self) for the messages.
pub fn barrier<B: Bootstrap + ?Sized>(b: &B) -> Result<()> {
    const OPERATION: &str = "barrier";
    let empty = |child: usize, reader: Reader<'_>, _: &mut Vec<u8>| {
        if reader.bytes.is_empty() {
            Ok(())
        } else {
            Err(Error::protocol(format!("barrier message from rank {child} is not empty")))
        }
    };
    let up = gather_up(b, TAG_BARRIER, OPERATION, Ok(vec![STATUS_OK]), empty);
    spread_down(b, TAG_BARRIER, OPERATION, || up).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_covers_every_rank_once() {
        for n in [1, 2, 5, 17, 1024, 1025] {
            let mut seen = vec![0u32; n];
            seen[0] += 1;
            for r in 0..n {
                for c in children(r, n) {
                    assert_eq!(parent(c), Some(r));
                    seen[c] += 1;
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "n = {n}");
        }
        assert!(in_subtree(21, 5) && in_subtree(5, 5) && !in_subtree(5, 21) && !in_subtree(9, 1));
    }

    #[test]
    fn failures_and_garbage_decode_to_errors() {
        let timeout = Duration::from_secs(1);
        let lost = Failure::of(&Error::peer_lost(7, "x", "closed")).encode();
        match payload(&lost, "barrier", 3, timeout) {
            Err(Error::PeerLost { peer: 7, operation, reason, .. }) => {
                assert!(operation.contains("rank 3"), "{operation}");
                assert_eq!(reason, "closed");
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("a failure decoded as success"),
        }
        let timed_out = Failure::of(&Error::timeout("recv", Some(9), timeout)).encode();
        assert!(matches!(payload(&timed_out, "barrier", 3, timeout), Err(Error::Timeout { peer: Some(9), .. })));
        for cut in 0..lost.len() {
            assert!(matches!(payload(&lost[..cut], "barrier", 3, timeout), Err(Error::Protocol(_))), "cut {cut}");
        }
        assert!(matches!(payload(&[7], "barrier", 3, timeout), Err(Error::Protocol(_))));
    }
}
