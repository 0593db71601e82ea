//! How a group's point-to-point operations progress together, what the host mailboxes and the
//! channel links share: [`start`] checks the peers and carries out the sends to this rank
//! itself; [`drive`] visits every unfinished operation round after round.
//!
//! Every round visits each unfinished operation, except one whose peer and direction an
//! earlier operation of the group still occupies (operations with one peer in one direction go
//! in the order they were added), and lets the executor move what it can without blocking. So
//! no order of sends and receives inside a group can deadlock. The timeout bounds a period
//! without progress; the abort flag and the health of the peer an operation waits on are
//! checked now and then.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use comm_core::deadline::Deadline;
use comm_core::spin::Backoff;
use comm_core::{Error, Result};

use crate::call::P2pOp;

/// Checks the peers of `ops` against a world of `n` and carries out the sends to this rank
/// `me` by pairing them, in order, with its receives from itself; marks those done.
///
/// # Safety
/// As [`drive`]'s caller guarantees for every operation.
pub(crate) unsafe fn start(ops: &[P2pOp], me: usize, n: usize, finished: &mut [bool]) -> Result<()> {
    if let Some(op) = ops.iter().find(|op| op.peer() >= n) {
        return Err(Error::invalid(format!("rank {} is not a peer in a {n}-rank communicator", op.peer())));
    }
    let to_self = |send: bool| -> Vec<usize> {
        (0..ops.len()).filter(|&i| ops[i].peer() == me && matches!(ops[i], P2pOp::Send { .. }) == send).collect()
    };
    let (sends, recvs) = (to_self(true), to_self(false));
    if sends.len() != recvs.len() {
        return Err(Error::invalid(format!(
            "a group sends {} message(s) to this rank itself but receives {}; they must pair up",
            sends.len(),
            recvs.len()
        )));
    }
    for (&s, &r) in sends.iter().zip(&recvs) {
        let (P2pOp::Send { data: src, len: a, .. }, P2pOp::Recv { data: dst, len: b, .. }) = (ops[s], ops[r]) else {
            continue;
        };
        if a != b {
            return Err(Error::invalid(format!("send to self of {a} bytes paired with a receive of {b} bytes")));
        }
        // SAFETY: the caller guarantees both ranges; `ptr::copy` tolerates overlap.
        unsafe { std::ptr::copy(src, dst, a) };
        finished[s] = true;
        finished[r] = true;
    }
    Ok(())
}

/// Drives the unfinished operations until all are done: `advance(i)` moves what it can of
/// operation `i` without blocking and says (moved something, finished); `check_peer(p)` tells
/// whether peer `p` still lives.
pub(crate) fn drive(
    ops: &[P2pOp],
    n: usize,
    finished: &mut [bool],
    timeout: Duration,
    abort: &AtomicBool,
    mut advance: impl FnMut(usize) -> Result<(bool, bool)>,
    check_peer: impl Fn(usize) -> Result<()>,
) -> Result<()> {
    // What this process holds back may be what a peer needs to let these operations move.
    comm_core::deferred::send_all();
    let mut deadline = Deadline::after(timeout);
    let mut idle: u32 = 0;
    let mut backoff = Backoff::new();
    let (mut send_busy, mut recv_busy) = (vec![false; n], vec![false; n]);
    // One visit of every unfinished operation: (moved something, the peer of the first one visited).
    let mut round = |finished: &mut [bool]| -> Result<(bool, Option<usize>)> {
        let mut progressed = false;
        send_busy.iter_mut().chain(recv_busy.iter_mut()).for_each(|b| *b = false);
        let mut blocked_on = None;
        for (i, op) in ops.iter().enumerate() {
            if finished[i] {
                continue;
            }
            let busy = match *op {
                P2pOp::Send { peer, .. } => &mut send_busy[peer],
                P2pOp::Recv { peer, .. } => &mut recv_busy[peer],
            };
            if std::mem::replace(busy, true) {
                continue; // an earlier operation with this peer, same direction, goes first
            }
            blocked_on.get_or_insert(op.peer());
            let (moved, done) = advance(i)?;
            progressed |= moved;
            finished[i] = done;
        }
        Ok((progressed, blocked_on))
    };
    loop {
        let (progressed, blocked_on) = round(finished)?;
        if finished.iter().all(|&f| f) {
            return Ok(());
        }
        if progressed {
            deadline = Deadline::after(timeout);
            idle = 0;
            backoff.reset();
            continue;
        }
        idle = idle.wrapping_add(1);
        backoff.snooze();
        // Once the backoff naps, every snooze is long enough to look again after it.
        if idle.is_multiple_of(128) || backoff.is_sleeping() {
            if abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted("send/recv was aborted".into()));
            }
            if let Some(peer) = blocked_on {
                if let Err(lost) = check_peer(peer) {
                    // What the peer did before it went may be all that is left: one more round.
                    while let Ok((true, _)) = round(finished) {}
                    return if finished.iter().all(|&f| f) { Ok(()) } else { Err(lost) };
                }
                if deadline.expired() {
                    return Err(Error::timeout("send/recv progress", Some(peer), deadline.elapsed()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A receive from rank 1, driven while rank 1 is already gone; with `sent_before_going`, its
    /// message shows up just as the check finds rank 1 gone (the receive queue of a transport
    /// applied it meanwhile). Whether the wait ends in success.
    fn receive_from_a_peer_that_went(sent_before_going: bool) -> Result<()> {
        let mut byte = 0u8;
        let ops = [P2pOp::Recv { peer: 1, data: &mut byte, len: 1 }];
        let mut finished = [false];
        let arrived = Cell::new(false);
        let advance = |_: usize| Ok((arrived.get(), arrived.get()));
        let lost = |peer: usize| {
            arrived.set(sent_before_going);
            Err(Error::peer_lost(peer, "test", "gone"))
        };
        drive(&ops, 2, &mut finished, Duration::from_secs(5), &AtomicBool::new(false), advance, lost)
    }

    #[test]
    fn what_a_lost_peer_sent_before_it_went_still_completes_the_group() {
        receive_from_a_peer_that_went(true).unwrap();
        let never = receive_from_a_peer_that_went(false);
        assert!(matches!(never, Err(Error::PeerLost { peer: 1, .. })), "{never:?}");
    }
}
