//! Groups of point-to-point operations: the user's [`Group`], and how its operations progress
//! together — what the host mailboxes and the channel links share.
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
use comm_core::ledger::{CallKind, CallSignature};
use comm_core::spin::Backoff;
use comm_core::{Error, Result};

use crate::communicator::Communicator;
use crate::dtype::Element;
use crate::matching::GroupStamps;
use crate::select::{CallShape, Executor};
use crate::table::Collective;

/// Point-to-point calls of a communicator.
impl Communicator {
    /// Sends `data` to `peer` (which must call [`recv`](Self::recv) with the same length).
    /// Returns once the data is copied out of `data`.
    pub fn send<T: Element>(&self, data: &[T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.send(data, peer);
        g.run()
    }

    /// Receives exactly `data.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, data: &mut [T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.recv(data, peer);
        g.run()
    }

    /// Starts a group of point-to-point operations that progress together (no order of sends
    /// and receives inside a group can deadlock).
    ///
    /// Each direction of a pair matches in order, as in NCCL: the groups of this rank that
    /// send to a peer match, one to one, the peer's groups that receive from this rank, with
    /// as many messages of the same sizes, between the same collectives. A send nobody
    /// received is found when the peer next receives from this rank with other sizes or after
    /// a collective: that call fails with [`Error::Protocol`] naming the earlier group, and the
    /// communicator is revoked on every rank — its data is never taken for such a message.
    pub fn group(&self) -> Group<'_> {
        Group::new(self)
    }
}

/// Point-to-point operations that progress together; see [`Communicator::group`].
pub struct Group<'a> {
    comm: &'a Communicator,
    ops: Vec<P2pOp>,
}

impl<'a> Group<'a> {
    /// An empty group of `comm`.
    pub(crate) fn new(comm: &'a Communicator) -> Self {
        Group { comm, ops: Vec::new() }
    }

    /// Adds a send of `data` to `peer`.
    pub fn send<T: Element>(&mut self, data: &'a [T], peer: usize) -> &mut Self {
        self.ops.push(P2pOp::Send { peer, data: data.as_ptr().cast(), len: std::mem::size_of_val(data) });
        self
    }

    /// Adds a receive of exactly `data.len()` elements from `peer`.
    pub fn recv<T: Element>(&mut self, data: &'a mut [T], peer: usize) -> &mut Self {
        self.ops.push(P2pOp::Recv { peer, data: data.as_mut_ptr().cast(), len: std::mem::size_of_val(data) });
        self
    }

    /// Runs every operation to completion.
    pub fn run(self) -> Result<()> {
        let bytes: usize = self.ops.iter().map(P2pOp::len).sum();
        let first_peer = self.ops.first().map(P2pOp::peer);
        self.comm.ledgered(CallSignature::host(CallKind::Group, bytes, first_peer), || self.progress(bytes))
    }

    /// Runs every operation to completion: [`run`](Self::run) inside the ledger, which revokes
    /// the communicator on a mismatch with a peer (see [`crate::matching`]).
    fn progress(&self, bytes: usize) -> Result<()> {
        let executor = self.comm.plan(CallShape::host(Collective::SendRecv, bytes))?.executor;
        let stamps = {
            let ledger = self.comm.resilience.ledger();
            let mut exchanges = self.comm.pair_exchanges.borrow_mut();
            let (group, epoch) = (ledger.groups_begun(), ledger.collectives_begun());
            let transfers = self.ops.iter().map(|op| (op.peer(), matches!(op, P2pOp::Send { .. }), op.len()));
            GroupStamps::new(transfers, self.comm.rank(), group, epoch, &mut exchanges)
        };
        if executor == Executor::HostChannel {
            let mut e = self.comm.channel_engine()?;
            // SAFETY: as below.
            unsafe { crate::channel::run_group(&mut e, self.comm.core(), &self.ops, &stamps) }
        } else {
            let mut e = self.comm.engine()?;
            let timeout = e.timeout();
            // SAFETY: every pointer comes from a slice borrowed for 'a, which outlives this
            // call; receive slices are exclusive borrows, so they are disjoint from everything
            // else.
            let r = unsafe { e.p2p.run(&self.ops, &stamps, timeout) };
            r.map_err(|err| e.poison(err))
        }
    }
}

/// One operation of a group.
#[derive(Debug, Clone, Copy)]
pub(crate) enum P2pOp {
    /// Send `len` bytes at `data` to `peer`.
    Send { peer: usize, data: *const u8, len: usize },
    /// Receive exactly `len` bytes from `peer` into `data`.
    Recv { peer: usize, data: *mut u8, len: usize },
}

impl P2pOp {
    /// The peer of the operation.
    pub(crate) fn peer(&self) -> usize {
        match *self {
            P2pOp::Send { peer, .. } | P2pOp::Recv { peer, .. } => peer,
        }
    }

    /// Bytes the operation moves.
    pub(crate) fn len(&self) -> usize {
        match *self {
            P2pOp::Send { len, .. } | P2pOp::Recv { len, .. } => len,
        }
    }
}

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
    loop {
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
                check_peer(peer)?;
                if deadline.expired() {
                    return Err(Error::timeout("send/recv progress", Some(peer), deadline.elapsed()));
                }
            }
        }
    }
}
