//! [`TcpBootstrap`]: ranks meet at one or more roots over TCP, the rank table comes down a tree,
//! and each rank keeps a handful of links — its tree neighbours, plus the peers it talks to.
//!
//! # Protocol (version 2)
//!
//! Handshake messages are a `u32` little-endian length followed by a [`wire`](crate::wire)
//! message (magic, version, fields); every one carries a job secret.
//!
//! 1. *Groups.* The caller gives one [`UniqueId`] per root (usually one). The ranks split into
//!    as many contiguous groups ([`rendezvous::group_range`]); the first rank of group `g` is its
//!    root and listens on the address of id `g` during the rendezvous. Every rank binds a
//!    listener for links on port 0: a root on its id's interface, the others on the interface
//!    that routes to their root (the root's own address when that is loopback).
//! 2. *Rendezvous.* Every other rank connects to its root (retrying until the deadline, since
//!    the root may start later) and sends a *root hello* (`WVBH`: id `g`'s secret, rank, world
//!    size, number of roots, its listen address and host identity: hostname and boot id). The
//!    root checks it — magic, version, secret (compared without early exit), rank in its group
//!    and not taken, world size and number of roots equal — answers an *acknowledgement*
//!    (`WVBA`) and closes the connection; it closes connections that fail, or that send no
//!    complete hello within a few seconds, and goes on. A root other than the first, once its
//!    group is complete, reports the group's table (`WVBG`) to the first root the same way. So
//!    no root holds more than a few connections at a time, and with several roots none serves
//!    more than its group.
//! 3. *Rank table down a tree.* Rank 0 then has every rank's listen address and host; it sends
//!    the *rank table* (`WVBT`) to its children in the tree of [`tree`](crate::bootstrap::tree)
//!    (fan-out 4), each of them to theirs, and so on: `log₄ n` hops, no rank sending more than
//!    four copies.
//! 4. *Links.* A rank opens a link to a peer the first time it sends to it: it connects to the
//!    peer's listen address and sends a *peer hello* (`WVBP`: the job secret — id 0's —, from,
//!    to, world size); the peer checks it like a root checks a root hello, refuses strangers,
//!    and answers with its own peer hello, which is checked in turn. Links are kept until the
//!    bootstrap is dropped. The tree links of step 3 are the only ones every rank has; the
//!    collectives ([`all_gather`](Bootstrap::all_gather), [`broadcast`](Bootstrap::broadcast),
//!    [`barrier`](Bootstrap::barrier)) run along them, so a rank has at most five links plus
//!    those to the peers it sends to (or asks [`peer_lost`](Bootstrap::peer_lost) about).
//! 5. *Frames.* On every link, messages are frames: tag `u64`, length `u64` (at most
//!    [`TcpBootstrap::MAX_MESSAGE_LEN`]), payload. One poller thread per rank reads every link
//!    and files the frames into a mailbox keyed by (peer, tag).
//!
//! # Layout
//!
//! [`messages`] encodes and checks the handshake messages, [`rendezvous`] runs steps 1 and 2,
//! [`io`] holds the blocking socket calls of the rendezvous (reads and writes bounded by a
//! deadline, the acceptor of a root), [`poller`] the poller thread (reading links, opening them
//! in both directions), [`links`] what the poller shares with the calling threads (mailbox,
//! links, lost peers). This file holds [`TcpBootstrap`] itself and step 3.

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzzing;
mod io;
mod links;
mod messages;
mod poller;
mod rendezvous;

use std::net::{Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use self::links::{Command, Link, Shared, State, WriteFailure};
use self::messages::{decode_rank_table, encode_rank_table};
use self::poller::PollerSetup;
use self::rendezvous::{Rendezvous, group_range, local_host_identity};
use super::tree;
use super::unique_id::UniqueId;
use super::{Bootstrap, RESERVED_TAG_BASE, TAG_ALL_GATHER, TAG_BARRIER, TAG_BROADCAST, TAG_NOTICE};
use crate::deadline::Deadline;
use crate::error::{Error, Result};

/// Tag of the rank table on its way down the tree (step 3); 1 to 3 are the collectives', 0x100
/// and up the registrations' (`crate::registration`).
const TAG_RANK_TABLE: u64 = RESERVED_TAG_BASE | 4;
/// On drop, how long to wait for peers to close their side too (a clean close on both sides).
const DROP_GRACE: Duration = Duration::from_millis(100);
/// Notices kept per peer while a link to it is opened; older ones are dropped beyond it.
const PENDING_NOTICES: usize = 64;
/// How often `recv_or_abort` looks at its abort flag while it waits.
const ABORT_LOOK: Duration = Duration::from_millis(5);
/// On drop, how long to wait for the poller thread once told to stop.
const DROP_JOIN_LIMIT: Duration = Duration::from_secs(2);

/// The built-in [`Bootstrap`]: TCP, rendezvous at the root(s) of one or more [`UniqueId`]s, the
/// rank table down a tree, links opened on demand (protocol version 2, described at the top of
/// `comm-core/src/bootstrap/tcp/mod.rs`).
///
/// * `send` to one's own rank is supported: the message goes straight into the own mailbox and
///   `recv(own rank, tag)` returns it. Peers outside `0..world_size` are an
///   [`Error::InvalidArgument`].
/// * The first `send` to a peer opens a link to it (bounded by the timeout); later ones reuse it.
/// * Messages sent just before a rank drops its `TcpBootstrap` are still delivered: the drop
///   first closes the sending side of each link (the peer reads everything, then sees the end),
///   waits briefly for peers to close theirs, then stops the poller. (A peer that keeps
///   sending to a rank after that rank dropped can make the kernel reset the link, which may
///   discard the dropped rank's last unacknowledged bytes.)
/// * `recv` returns messages already received from a peer even after that peer is gone; once
///   none is left it returns [`Error::PeerLost`].
/// * Resources: one listening socket, one poller thread, and one socket per link — five tree
///   links at most, plus one per peer this rank sent to or asked `peer_lost` about
///   ([`open_links`](TcpBootstrap::open_links)). Nothing is left after drop.
pub struct TcpBootstrap {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    job_key: String,
    timeout: Duration,
    /// Every rank's listen address (from the rank table).
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    /// `None` in a one-rank job (no sockets at all) and after drop.
    poller: Option<JoinHandle<()>>,
}

impl TcpBootstrap {
    /// Largest message `send` accepts and a link accepts from a peer (1 GiB).
    pub const MAX_MESSAGE_LEN: usize = 1 << 30;

    /// Joins the job identified by `id` as `rank` of `world_size`, waiting at most `timeout`
    /// for every rank to arrive; `timeout` then also bounds every `send` and `recv`.
    ///
    /// Rank 0 listens on `id.addr`; the others connect to it. Errors: bad arguments
    /// ([`Error::InvalidArgument`]), the root's port taken ([`Error::Io`]), ranks missing at the
    /// deadline ([`Error::Timeout`] naming one), the root or a peer refusing or closing the
    /// connection ([`Error::PeerLost`]), a peer sending a malformed table or answer
    /// ([`Error::Protocol`]).
    pub fn new(id: &UniqueId, rank: usize, world_size: usize, timeout: Duration) -> Result<Self> {
        Self::with_roots(std::slice::from_ref(id), rank, world_size, timeout)
    }

    /// Joins a job with several roots (what `ncclCommInitRankScalable` does): the ranks split
    /// into `ids.len()` contiguous groups — the first `world_size % ids.len()` one rank longer —
    /// and the first rank of group `g` is its root, listening on `ids[g].addr`, so it must run
    /// where that address is. Every rank must be given the same ids in the same order. The
    /// first id is the job's: its secret opens every link and gives the [`job_key`](Bootstrap::job_key).
    /// Errors as for [`new`](TcpBootstrap::new); no ids, or more ids than ranks, are an
    /// [`Error::InvalidArgument`].
    pub fn with_roots(ids: &[UniqueId], rank: usize, world_size: usize, timeout: Duration) -> Result<Self> {
        Self::join(ids, rank, world_size, timeout, None)
    }

    /// [`with_roots`](Self::with_roots) that another thread may call off: once `cancel` is set,
    /// joining gives up within [`CANCEL_LOOK`](crate::deadline::CANCEL_LOOK) (a connection
    /// attempt to a root host that does not answer: within 5 s) with [`Error::Aborted`], and
    /// everything it opened (listeners, links, its poller thread) is closed when it returns.
    /// The flag bounds joining only: the sends and receives of the bootstrap it returns are
    /// bounded by `timeout`, as with `with_roots`.
    pub fn with_roots_cancellable(
        ids: &[UniqueId],
        rank: usize,
        world_size: usize,
        timeout: Duration,
        cancel: Arc<AtomicBool>,
    ) -> Result<Self> {
        Self::join(ids, rank, world_size, timeout, Some(cancel))
    }

    /// Joins the job (see [`with_roots`](Self::with_roots)), within `timeout` or until `cancel`
    /// is set.
    fn join(
        ids: &[UniqueId],
        rank: usize,
        world_size: usize,
        timeout: Duration,
        cancel: Option<Arc<AtomicBool>>,
    ) -> Result<Self> {
        if world_size == 0 || world_size > super::MAX_WORLD_SIZE {
            return Err(Error::invalid(format!(
                "a bootstrap of {world_size} ranks: a job has 1 to {} ranks",
                super::MAX_WORLD_SIZE
            )));
        }
        if rank >= world_size {
            return Err(Error::invalid(format!("bootstrap rank {rank} is not a rank of a {world_size}-rank job")));
        }
        if timeout.is_zero() {
            return Err(Error::invalid("bootstrap timeout must be positive"));
        }
        if ids.is_empty() || ids.len() > world_size {
            return Err(Error::invalid(format!(
                "a {world_size}-rank job needs between 1 and {world_size} unique ids (one per root), got {}",
                ids.len()
            )));
        }
        let deadline = match cancel {
            Some(flag) => Deadline::cancellable(timeout, flag),
            None => Deadline::after(timeout),
        };
        let host = local_host_identity();
        let (wake_rx, wake_tx) =
            UnixStream::pair().map_err(|e| Error::io("create the bootstrap wake-up socket pair", e))?;
        wake_tx.set_nonblocking(true).map_err(|e| Error::io("make the bootstrap wake-up socket non-blocking", e))?;
        let mut bootstrap = TcpBootstrap {
            rank,
            world_size,
            local_rank: 0,
            local_world_size: 1,
            job_key: ids[0].job_key(),
            timeout,
            addrs: Vec::new(),
            shared: Arc::new(Shared::new(world_size, wake_tx)),
            poller: None,
        };
        if world_size == 1 {
            return Ok(bootstrap);
        }
        let rendezvous = Rendezvous { ids, rank, world_size, deadline, host };
        let (listener, table) = rendezvous.join()?;
        let setup = PollerSetup {
            id: ids[0].clone(),
            rank,
            world_size,
            listener,
            wake: wake_rx,
            shared: Arc::clone(&bootstrap.shared),
        };
        // From here on, an error drops `bootstrap`, which stops the poller and closes every link.
        bootstrap.poller = Some(poller::spawn(setup).map_err(|e| Error::io("start the bootstrap poller thread", e))?);
        bootstrap.spread_rank_table(ids, table, &rendezvous.host, &rendezvous.deadline)?;
        Ok(bootstrap)
    }

    /// Step 3: takes the rank table (rank 0: from the rendezvous, others: from the parent in the
    /// tree), passes it on to this rank's children and learns from it.
    fn spread_rank_table(
        &mut self,
        ids: &[UniqueId],
        at_root: Option<Vec<messages::RankEntry>>,
        host: &str,
        deadline: &Deadline,
    ) -> Result<()> {
        let (me, n) = (self.rank, self.world_size);
        let table = match (at_root, tree::parent(me)) {
            (Some(entries), _) => encode_rank_table(&ids[0], &entries),
            (None, Some(parent)) => self.recv_until(parent, TAG_RANK_TABLE, deadline, || {
                format!(
                    "bootstrap rendezvous: the rank table from rank {parent} (it comes down a tree from rank 0 once \
                     every rank has joined)"
                )
            })?,
            (None, None) => return Err(Error::protocol("bootstrap rendezvous: rank 0 ended without a rank table")),
        };
        let mut entries = decode_rank_table(&table, &ids[0], n)?;
        // A root may listen on an unspecified address (0.0.0.0): others reach it at the address
        // their id names.
        for (group, id) in ids.iter().enumerate() {
            let root = &mut entries[group_range(group, n, ids.len()).start].listen_addr;
            if root.ip().is_unspecified() {
                root.set_ip(id.addr.ip());
            }
        }
        self.addrs = entries.iter().map(|e| e.listen_addr).collect();
        let same_host: Vec<usize> = (0..n).filter(|&r| entries[r].host == host).collect();
        self.local_rank = same_host.iter().filter(|&&r| r < me).count();
        self.local_world_size = same_host.len().max(1);
        for child in tree::children(me, n) {
            self.send_until(child, TAG_RANK_TABLE, &table, deadline)?;
        }
        Ok(())
    }

    /// Where rank `rank` listens for links (from the rank table), or `None` for a rank not of
    /// this job (and in a one-rank job, which listens nowhere).
    pub fn listen_addr(&self, rank: usize) -> Option<SocketAddr> {
        self.addrs.get(rank).copied()
    }

    /// Number of links (sockets besides the listener) this rank holds now: its tree neighbours
    /// and the peers it opened links to or that opened links to it.
    pub fn open_links(&self) -> usize {
        self.shared.lock().links.len()
    }

    fn check_peer(&self, peer: usize, operation: &str) -> Result<()> {
        if peer >= self.world_size {
            return Err(Error::invalid(format!(
                "bootstrap {operation}: peer {peer} is not a rank of a {}-rank job",
                self.world_size
            )));
        }
        Ok(())
    }

    /// Asks the poller to open a link to `peer` (the lock is held by the caller).
    fn request_link(&self, state: &mut State, peer: usize, deadline: Deadline) -> bool {
        let Some(&addr) = self.addrs.get(peer) else { return false };
        state.connecting.insert(peer);
        self.shared.command(state, Command::Connect { peer, addr, deadline });
        true
    }

    fn wait<'a>(&'a self, state: MutexGuard<'a, State>, deadline: &Deadline) -> MutexGuard<'a, State> {
        let remaining = deadline.next_wait();
        self.shared.changed.wait_timeout(state, remaining).unwrap_or_else(PoisonError::into_inner).0
    }

    /// The link messages to `peer` go out on, opened now if there is none.
    fn link_to(&self, peer: usize, deadline: &Deadline, operation: &dyn Fn() -> String) -> Result<Arc<Link>> {
        let mut state = self.shared.lock();
        let mut requested = false;
        loop {
            if let Some(reason) = state.lost.get(peer).cloned().flatten() {
                return Err(Error::peer_lost(peer, operation(), reason));
            }
            if let Some(link) = state.senders.get(&peer) {
                return Ok(Arc::clone(link));
            }
            if self.poller.is_none() || state.stopped {
                return Err(Error::peer_lost(peer, operation(), "the bootstrap has no poller (it is closing)"));
            }
            if !state.connecting.contains(&peer) {
                if requested {
                    let why = state.connect_failed.get(&peer).cloned().unwrap_or_default();
                    return Err(deadline.give_up(format!("{} ({why})", operation()), Some(peer)));
                }
                if !self.request_link(&mut state, peer, deadline.clone()) {
                    return Err(Error::peer_lost(peer, operation(), "its address is not known yet (no rank table)"));
                }
                requested = true;
            }
            if deadline.expired() {
                return Err(deadline.give_up(format!("{} (opening a link)", operation()), Some(peer)));
            }
            state = self.wait(state, deadline);
        }
    }

    fn send_until(&self, peer: usize, tag: u64, data: &[u8], deadline: &Deadline) -> Result<()> {
        let operation = || format!("bootstrap send {} to rank {peer}", describe_tag(tag));
        let link = self.link_to(peer, deadline, &operation)?;
        match link.write_frame(tag, data, deadline) {
            Ok(()) => Ok(()),
            Err(WriteFailure::TimedOut) => Err(deadline.give_up(operation(), Some(peer))),
            Err(WriteFailure::Closed(reason)) => Err(Error::peer_lost(peer, operation(), reason)),
        }
    }

    fn recv_until(
        &self,
        peer: usize,
        tag: u64,
        deadline: &Deadline,
        operation: impl Fn() -> String,
    ) -> Result<Vec<u8>> {
        self.recv_until_or_abort(peer, tag, deadline, operation, None)
    }

    /// [`recv_until`](Self::recv_until) that also gives up once `abort` is set, looking at it
    /// every [`ABORT_LOOK`] (nothing wakes the wait when it is set).
    fn recv_until_or_abort(
        &self,
        peer: usize,
        tag: u64,
        deadline: &Deadline,
        operation: impl Fn() -> String,
        abort: Option<&AtomicBool>,
    ) -> Result<Vec<u8>> {
        let mut state = self.shared.lock();
        loop {
            if let Some(message) = state.take(peer, tag) {
                return Ok(message);
            }
            if let Some(reason) = state.lost.get(peer).cloned().flatten() {
                return Err(Error::peer_lost(peer, operation(), reason));
            }
            if abort.is_some_and(|a| a.load(std::sync::atomic::Ordering::Acquire)) {
                return Err(Error::Aborted(format!("{} was aborted", operation())));
            }
            if deadline.expired() {
                return Err(deadline.give_up(operation(), Some(peer)));
            }
            state = match abort {
                Some(_) => self.wait(state, &Deadline::after(ABORT_LOOK.min(deadline.remaining()))),
                None => self.wait(state, deadline),
            };
        }
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    /// Why `peer` is known to be gone: its link ended, or opening one was refused (every rank
    /// listens until it drops its bootstrap). A peer without a link yet is `None`; asking opens a
    /// link to it in the background, so a later call tells.
    fn peer_lost(&self, peer: usize) -> Option<String> {
        if peer >= self.world_size || peer == self.rank {
            return None;
        }
        let mut state = self.shared.lock();
        if let Some(reason) = state.lost[peer].clone() {
            return Some(reason);
        }
        let unlinked = !state.senders.contains_key(&peer) && !state.connecting.contains(&peer);
        if unlinked && !state.connect_failed.contains_key(&peer) && self.poller.is_some() && !state.stopped {
            self.request_link(&mut state, peer, Deadline::after(self.timeout));
        }
        None
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn local_world_size(&self) -> usize {
        self.local_world_size
    }

    fn job_key(&self) -> String {
        self.job_key.clone()
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer(peer, "send")?;
        if data.len() > Self::MAX_MESSAGE_LEN {
            return Err(Error::invalid(format!(
                "bootstrap send of {} bytes exceeds the limit of {} bytes",
                data.len(),
                Self::MAX_MESSAGE_LEN
            )));
        }
        if peer == self.rank {
            self.shared.deliver(peer, tag, data.to_vec());
            return Ok(());
        }
        self.send_until(peer, tag, data, &Deadline::after(self.timeout))
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.check_peer(peer, "recv")?;
        self.recv_until(peer, tag, &Deadline::after(self.timeout), || format!("bootstrap recv {}", describe_tag(tag)))
    }

    fn carries_notices(&self) -> bool {
        true
    }

    /// Sends at once over an open link; with none, queues the notice (at most
    /// 64 per peer, the oldest dropped) and asks the poller to open one.
    fn send_notice(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.check_peer(peer, "notice")?;
        if peer == self.rank {
            return self.send(peer, TAG_NOTICE, data);
        }
        let mut state = self.shared.lock();
        let operation = || format!("bootstrap notice to rank {peer}");
        if let Some(reason) = state.lost[peer].clone() {
            return Err(Error::peer_lost(peer, operation(), reason));
        }
        if let Some(link) = state.senders.get(&peer).cloned() {
            drop(state);
            let deadline = Deadline::after(self.timeout);
            return match link.write_frame(TAG_NOTICE, data, &deadline) {
                Ok(()) => Ok(()),
                Err(WriteFailure::TimedOut) => Err(Error::timeout(operation(), Some(peer), deadline.elapsed())),
                Err(WriteFailure::Closed(reason)) => Err(Error::peer_lost(peer, operation(), reason)),
            };
        }
        if self.poller.is_none() || state.stopped {
            return Err(Error::peer_lost(peer, operation(), "the bootstrap has no poller (it is closing)"));
        }
        let queue = state.pending_notices.entry(peer).or_default();
        if queue.len() >= PENDING_NOTICES {
            queue.remove(0);
        }
        queue.push(data.to_vec());
        if !state.connecting.contains(&peer) {
            state.connect_failed.remove(&peer);
            self.request_link(&mut state, peer, Deadline::after(self.timeout));
        }
        Ok(())
    }

    fn recv_or_abort(&self, peer: usize, tag: u64, abort: &AtomicBool) -> Result<Vec<u8>> {
        self.check_peer(peer, "recv")?;
        let operation = || format!("bootstrap recv {}", describe_tag(tag));
        self.recv_until_or_abort(peer, tag, &Deadline::after(self.timeout), operation, Some(abort))
    }

    fn recv_notice(&self, timeout: Duration) -> Result<Option<(usize, Vec<u8>)>> {
        let deadline = Deadline::after(timeout);
        let mut state = self.shared.lock();
        loop {
            if let Some(notice) = state.notices.pop_front() {
                return Ok(Some(notice));
            }
            if deadline.expired() {
                return Ok(None);
            }
            state = self.wait(state, &deadline);
        }
    }
}

impl Drop for TcpBootstrap {
    fn drop(&mut self) {
        let Some(poller) = self.poller.take() else { return };
        // First close the sending side: peers read everything already sent, then the end.
        for link in &self.shared.lock().links {
            // Errors only mean the socket is already shut down or gone.
            let _ = link.stream.shutdown(Shutdown::Write);
        }
        // Peers that are closing too answer within the grace period; both sides then close
        // cleanly (no reset that could discard data still in flight).
        let grace = Deadline::after(DROP_GRACE);
        let mut state = self.shared.lock();
        while !state.links.is_empty() && !grace.expired() {
            state = self.wait(state, &grace);
        }
        self.shared.command(&mut state, Command::Stop);
        let limit = Deadline::after(DROP_JOIN_LIMIT);
        while !state.stopped && !limit.expired() {
            state = self.wait(state, &limit);
        }
        let stopped = state.stopped;
        drop(state);
        if stopped {
            // It set `stopped` as its very last step, so joining it returns at once.
            let _ = poller.join();
        } else {
            tracing::warn!(
                target: crate::diagnostics::BOOTSTRAP,
                rank = self.rank,
                "bootstrap rank {}: the poller thread did not stop within {DROP_JOIN_LIMIT:?}; leaving it detached",
                self.rank
            );
        }
    }
}

crate::debug_fields!(TcpBootstrap { rank, world_size, local_rank, local_world_size, job_key, timeout });

/// `tag 5`, or the name of a reserved tag.
fn describe_tag(tag: u64) -> String {
    match tag {
        TAG_ALL_GATHER => format!("tag {tag:#x} (all_gather)"),
        TAG_BROADCAST => format!("tag {tag:#x} (broadcast)"),
        TAG_BARRIER => format!("tag {tag:#x} (barrier)"),
        TAG_RANK_TABLE => format!("tag {tag:#x} (rank table)"),
        t if t >= RESERVED_TAG_BASE => format!("tag {t:#x} (reserved)"),
        t => format!("tag {t}"),
    }
}

#[cfg(test)]
mod tests;
