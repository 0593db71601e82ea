//! Bootstrap: how ranks find each other and exchange small messages before (and beside) the
//! data path.
//!
//! [`Bootstrap`] is the trait; [`TcpBootstrap`] the built-in implementation (ranks meet at the
//! root of a [`UniqueId`], or at several roots, and each keeps a few TCP links: its neighbours
//! in a tree, and the peers it talks to); its collectives default to the tree algorithms of
//! [`tree`], built on `send` and `recv`;
//! [`from_env`] builds one from torchrun, Open MPI or Slurm variables. Users may implement the
//! trait over their own channel (MPI, torch.distributed).

mod abortable;
mod env;
pub(crate) mod tcp;
pub mod tree;
mod unique_id;

pub use abortable::AbortableBootstrap;
pub use env::{EnvRendezvous, from_env, resolve};
pub use tcp::TcpBootstrap;
pub use unique_id::UniqueId;

use std::time::Duration;

use crate::error::Result;

/// The most ranks a job may have: a larger world size is refused before anything is sized by it
/// (a bootstrap keeps a few words per rank).
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// A bootstrap's rank and world size, checked: a user's [`Bootstrap`] that reports a rank
/// outside its world (or an empty or oversized world) is refused before either is used.
pub(crate) fn checked_shape(bootstrap: &dyn Bootstrap) -> Result<(usize, usize)> {
    let (rank, world_size) = (bootstrap.rank(), bootstrap.world_size());
    if world_size == 0 || world_size > MAX_WORLD_SIZE || rank >= world_size {
        return Err(crate::error::Error::invalid(format!(
            "the bootstrap says rank {rank} of {world_size}: a bootstrap's rank must be below its world size, \
             which is 1 to {MAX_WORLD_SIZE}"
        )));
    }
    Ok((rank, world_size))
}

/// Tags at or above this value belong to weave itself; user code should use smaller tags.
pub const RESERVED_TAG_BASE: u64 = 1 << 63;
/// Tag of the messages of the default [`Bootstrap::all_gather`].
pub const TAG_ALL_GATHER: u64 = RESERVED_TAG_BASE | 1;
/// Tag of the messages of the default [`Bootstrap::broadcast`].
pub const TAG_BROADCAST: u64 = RESERVED_TAG_BASE | 2;
/// Tag of the messages of the default [`Bootstrap::barrier`].
pub const TAG_BARRIER: u64 = RESERVED_TAG_BASE | 3;
/// Tag of notices: messages any rank may send any other at any time (revocations, agreement
/// rounds), read from every peer at once with [`Bootstrap::recv_notice`], never by `recv`.
pub const TAG_NOTICE: u64 = RESERVED_TAG_BASE | 5;

/// Small-message exchange among the ranks of a job.
///
/// Messages between a pair of ranks with the same tag arrive in the order they were sent;
/// messages with different tags do not block each other. Every blocking call is bounded by
/// [`timeout`](Bootstrap::timeout) and fails with [`Error::Timeout`](crate::Error::Timeout) naming the peer, or
/// [`Error::PeerLost`](crate::Error::PeerLost) once the peer's link is gone.
pub trait Bootstrap: Send + Sync {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Why this bootstrap's link to `peer` ended, once it has: a process that exits closes its
    /// links, so transports without a liveness signal of their own (RDMA, whose writes to a
    /// vanished queue pair may just go unanswered) ask this while they wait. `None` while the
    /// link is up, and where the bootstrap keeps no link to `peer` ([`TcpBootstrap`] opens one
    /// in the background when asked about such a peer, so later calls tell).
    fn peer_lost(&self, peer: usize) -> Option<String> {
        let _ = peer;
        None
    }

    /// This rank's index among the ranks on the same host.
    fn local_rank(&self) -> usize;

    /// Number of ranks on this host.
    fn local_world_size(&self) -> usize;

    /// Short hex string unique to this job (from the job secret); used to name OS objects.
    fn job_key(&self) -> String;

    /// Bound on every blocking call.
    fn timeout(&self) -> Duration;

    /// Sends `data` to `peer` under `tag`. Returns once the bytes are handed to the link.
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()>;

    /// Receives the next message from `peer` under `tag`.
    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>>;

    /// [`recv`](Self::recv) that gives up with [`Error::Aborted`](crate::Error::Aborted) once
    /// `abort` is set: how a communicator's own exchanges (registrations, connection set-up in
    /// the middle of a call) stop when it is aborted or revoked. The default waits as `recv`
    /// does, without looking at `abort`.
    fn recv_or_abort(&self, peer: usize, tag: u64, abort: &std::sync::atomic::AtomicBool) -> Result<Vec<u8>> {
        let _ = abort;
        self.recv(peer, tag)
    }

    /// Every rank contributes `data`; returns all contributions indexed by rank.
    ///
    /// The default gathers up a tree of the ranks and spreads the result down it ([`tree`]):
    /// no rank exchanges messages with more than [`tree::FANOUT`] + 1 others.
    fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        tree::all_gather(self, data)
    }

    /// Returns `root`'s `data` on every rank (`data` is ignored elsewhere). The default goes down
    /// the tree of [`tree`] (from a root other than rank 0, through rank 0).
    fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        tree::broadcast(self, root, data)
    }

    /// Returns once every rank has called it. The default goes up and down the tree of [`tree`].
    fn barrier(&self) -> Result<()> {
        tree::barrier(self)
    }

    /// Sends a notice (a message under [`TAG_NOTICE`]) to `peer` without waiting on it: a
    /// notice must never hold up its sender — the notice service passing a revocation on, a
    /// rank asking for ledgers — behind a peer that is stopped or slow to accept a link. The
    /// default is [`send`](Self::send); [`TcpBootstrap`] queues the notice when it has no link
    /// to `peer` yet and sends it once the link is open (dropped if opening it fails).
    fn send_notice(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.send(peer, TAG_NOTICE, data)
    }

    /// Whether this bootstrap carries notices ([`recv_notice`](Self::recv_notice) works).
    fn carries_notices(&self) -> bool {
        false
    }

    /// The next notice — a message some rank (this one included) sent here with `send(…,
    /// TAG_NOTICE, …)` — and its sender, waiting at most `timeout`; `Ok(None)` when none came.
    /// One thread of the process reads them ([`crate::notice::NoticeService`]), whatever the
    /// rank's other threads do. The default is [`Error::Unsupported`](crate::Error::Unsupported):
    /// communicators over a bootstrap without notices cannot be revoked across ranks or agree.
    fn recv_notice(&self, timeout: Duration) -> Result<Option<(usize, Vec<u8>)>> {
        let _ = timeout;
        Err(crate::Error::Unsupported("this bootstrap carries no notices (revoke, agree)".into()))
    }
}
