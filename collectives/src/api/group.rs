//! Groups of point-to-point operations: the user's [`Group`], and the communicator's `send`,
//! `recv` and `group`. How a group's operations progress is `p2p_progress.rs`.

use comm_core::Result;
use comm_core::ledger::{CallKind, CallSignature};

use crate::api::communicator::Communicator;
use crate::call::P2pOp;
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
    /// a collective: that call fails with [`Error::Protocol`](comm_core::Error::Protocol) naming the earlier group, and the
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
