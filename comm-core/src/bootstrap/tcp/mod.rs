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

mod io;
mod links;
mod messages;
mod poller;
mod rendezvous;

use std::net::{Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use self::links::{Command, Link, Shared, State, WriteFailure};
use self::messages::{decode_rank_table, encode_rank_table};
use self::poller::PollerSetup;
use self::rendezvous::{Rendezvous, group_range, local_host_identity};
use super::tree;
use super::unique_id::UniqueId;
use super::{Bootstrap, RESERVED_TAG_BASE, TAG_ALL_GATHER, TAG_BARRIER, TAG_BROADCAST};
use crate::config::{Config, Deadline, LogLevel};
use crate::error::{Error, Result};

/// Tag of the rank table on its way down the tree (step 3).
const TAG_RANK_TABLE: u64 = RESERVED_TAG_BASE | 0x100;
/// On drop, how long to wait for peers to close their side too (a clean close on both sides).
const DROP_GRACE: Duration = Duration::from_millis(100);
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
    warn: bool,
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
        if world_size == 0 {
            return Err(Error::invalid("bootstrap world size must be at least 1"));
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
        // A malformed WEAVE_* variable is reported by whoever builds the Config; here it only
        // decides whether warnings are printed, so fall back to the default (warn).
        let warn = Config::from_env().map(|c| c.logs(LogLevel::Warn)).unwrap_or(true);
        let deadline = Deadline::after(timeout);
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
            warn,
            addrs: Vec::new(),
            shared: Arc::new(Shared::new(world_size, wake_tx)),
            poller: None,
        };
        if world_size == 1 {
            return Ok(bootstrap);
        }
        let rendezvous = Rendezvous { ids, rank, world_size, deadline, warn, host };
        let (listener, table) = rendezvous.join()?;
        let setup = PollerSetup {
            id: ids[0].clone(),
            rank,
            world_size,
            warn,
            listener,
            wake: wake_rx,
            shared: Arc::clone(&bootstrap.shared),
        };
        // From here on, an error drops `bootstrap`, which stops the poller and closes every link.
        bootstrap.poller = Some(poller::spawn(setup).map_err(|e| Error::io("start the bootstrap poller thread", e))?);
        bootstrap.spread_rank_table(ids, table, &rendezvous.host, &deadline)?;
        Ok(bootstrap)
    }

    /// Step 3: takes the rank table (rank 0: from the rendezvous, others: from the parent in the
    /// tree), passes it on to this rank's children and learns from it.
    fn spread_rank_table(
        &mut self,
        ids: &[UniqueId],
        at_root: Option<Vec<rendezvous::RankEntry>>,
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
        let remaining = deadline.remaining();
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
                    return Err(Error::timeout(format!("{} ({why})", operation()), Some(peer), deadline.elapsed()));
                }
                if !self.request_link(&mut state, peer, *deadline) {
                    return Err(Error::peer_lost(peer, operation(), "its address is not known yet (no rank table)"));
                }
                requested = true;
            }
            if deadline.expired() {
                return Err(Error::timeout(
                    format!("{} (opening a link)", operation()),
                    Some(peer),
                    deadline.elapsed(),
                ));
            }
            state = self.wait(state, deadline);
        }
    }

    fn send_until(&self, peer: usize, tag: u64, data: &[u8], deadline: &Deadline) -> Result<()> {
        let operation = || format!("bootstrap send {} to rank {peer}", describe_tag(tag));
        let link = self.link_to(peer, deadline, &operation)?;
        match link.write_frame(tag, data, deadline) {
            Ok(()) => Ok(()),
            Err(WriteFailure::TimedOut) => Err(Error::timeout(operation(), Some(peer), deadline.elapsed())),
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
        let mut state = self.shared.lock();
        loop {
            if let Some(message) = state.take(peer, tag) {
                return Ok(message);
            }
            if let Some(reason) = state.lost.get(peer).cloned().flatten() {
                return Err(Error::peer_lost(peer, operation(), reason));
            }
            if deadline.expired() {
                return Err(Error::timeout(operation(), Some(peer), deadline.elapsed()));
            }
            state = self.wait(state, deadline);
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
        } else if self.warn {
            eprintln!(
                "weave: warning: bootstrap rank {}: the poller thread did not stop within {DROP_JOIN_LIMIT:?}; leaving \
                 it detached",
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
mod tests {
    use std::collections::HashMap;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Barrier;
    use std::time::Instant;

    use super::*;

    pub(super) const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    pub(super) fn new_id() -> UniqueId {
        UniqueId::on_free_port(LOCALHOST).unwrap()
    }

    /// Runs `body` on `world_size` ranks (threads) of one job and returns their results by rank.
    pub(super) fn run_job<T: Send>(
        world_size: usize,
        timeout: Duration,
        body: impl Fn(TcpBootstrap) -> T + Sync,
    ) -> Vec<T> {
        let id = new_id();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..world_size)
                .map(|rank| {
                    let (id, body) = (&id, &body);
                    scope.spawn(move || body(TcpBootstrap::new(id, rank, world_size, timeout).unwrap()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Everything a job of any size must do right.
    pub(super) fn exercise(b: &TcpBootstrap) {
        let (me, n) = (b.rank(), b.world_size());
        assert_eq!(b.local_rank(), me, "all ranks run on this host");
        assert_eq!(b.local_world_size(), n);
        assert_eq!(b.job_key().len(), 16);
        for round in 0..3 {
            let all = b.all_gather(format!("rank {me} round {round}").as_bytes()).unwrap();
            let expected: Vec<Vec<u8>> = (0..n).map(|r| format!("rank {r} round {round}").into_bytes()).collect();
            assert_eq!(all, expected);
            for root in [0, n / 2, n - 1] {
                let got = b.broadcast(root, format!("from {root} round {round}").as_bytes()).unwrap();
                assert_eq!(got, format!("from {root} round {round}").into_bytes());
            }
            b.barrier().unwrap();
        }
        // Tagged messages read in another order than sent; one tag keeps its order.
        if n > 1 {
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            for tag in [10u64, 11, 12] {
                b.send(next, tag, format!("{me}->{next} tag {tag}").as_bytes()).unwrap();
            }
            for i in 0..20u32 {
                b.send(next, 20, &i.to_le_bytes()).unwrap();
            }
            for tag in [12u64, 10, 11] {
                assert_eq!(b.recv(prev, tag).unwrap(), format!("{prev}->{me} tag {tag}").into_bytes());
            }
            for i in 0..20u32 {
                assert_eq!(b.recv(prev, 20).unwrap(), i.to_le_bytes());
            }
        }
        // Sending to oneself goes through the own mailbox.
        b.send(me, 99, b"note to self").unwrap();
        assert_eq!(b.recv(me, 99).unwrap(), b"note to self");
        b.barrier().unwrap();
    }

    #[test]
    fn jobs_of_1_2_3_4_and_8_ranks() {
        for world_size in [1, 2, 3, 4, 8] {
            let job_keys = run_job(world_size, Duration::from_secs(10), |b| {
                exercise(&b);
                b.job_key()
            });
            assert!(job_keys.iter().all(|k| *k == job_keys[0]), "{job_keys:?}");
        }
    }

    #[test]
    fn large_messages() {
        const LEN: usize = 8 << 20;
        // Built once: generating 8 MiB patterns per rank is slow in debug builds.
        let patterns: HashMap<usize, Vec<u8>> = [1, 7, 10, 11, 12]
            .into_iter()
            .map(|seed| (seed, (0..LEN).map(|i| (i.wrapping_mul(31) ^ seed) as u8).collect()))
            .collect();
        let pattern = |seed: usize| patterns[&seed].as_slice();
        run_job(3, Duration::from_secs(20), |b| {
            let me = b.rank();
            let got = b.broadcast(1, if me == 1 { pattern(1) } else { &[] }).unwrap();
            assert!(got == pattern(1));
            let all = b.all_gather(pattern(me + 10)).unwrap();
            for (rank, data) in all.iter().enumerate() {
                assert!(*data == pattern(rank + 10), "rank {rank}'s contribution differs");
            }
            // A small message on another tag is not held up behind a large one.
            if me == 0 {
                b.send(2, 1, pattern(7)).unwrap();
                b.send(2, 2, b"small").unwrap();
            } else if me == 2 {
                assert_eq!(b.recv(0, 2).unwrap(), b"small");
                assert!(b.recv(0, 1).unwrap() == pattern(7));
            }
            b.barrier().unwrap();
        });
    }

    #[test]
    fn a_dropped_peer_is_lost_promptly() {
        let timeout = Duration::from_secs(10);
        run_job(2, timeout, |b| {
            if b.rank() == 1 {
                b.send(0, 7, b"last words").unwrap();
                let started = Instant::now();
                drop(b);
                assert!(started.elapsed() < Duration::from_secs(1), "drop took {:?}", started.elapsed());
            } else {
                // Messages sent before the drop are still delivered, then the loss shows.
                assert_eq!(b.recv(1, 7).unwrap(), b"last words");
                let started = Instant::now();
                let lost = b.recv(1, 7);
                assert!(matches!(lost, Err(Error::PeerLost { peer: 1, .. })), "{lost:?}");
                assert!(started.elapsed() < Duration::from_secs(2), "noticed after {:?}", started.elapsed());
                let send = b.send(1, 7, b"anyone?");
                assert!(matches!(send, Err(Error::PeerLost { peer: 1, .. })), "{send:?}");
                assert!(matches!(b.barrier(), Err(Error::PeerLost { peer: 1, .. })));
            }
        });
    }

    #[test]
    fn a_silent_peer_times_out_naming_it() {
        let timeout = Duration::from_millis(500);
        let done = Barrier::new(2);
        let outcomes = run_job(2, timeout, |b| {
            let outcome = (b.rank() == 0).then(|| {
                let started = Instant::now();
                (b.recv(1, 5), started.elapsed())
            });
            // Rank 1 stays alive (and silent) until rank 0 has given up.
            done.wait();
            outcome
        });
        let Some((result, waited)) = &outcomes[0] else { unreachable!("rank 0 returns an outcome") };
        match result {
            Err(Error::Timeout { peer: Some(1), operation, .. }) => assert!(operation.contains("tag 5"), "{operation}"),
            other => panic!("expected a timeout naming rank 1, got {other:?}"),
        }
        assert!(*waited >= timeout && *waited < timeout * 3, "waited {waited:?}");
    }

    /// Open file descriptors and threads of this process.
    fn process_resources() -> (usize, usize) {
        let count = |dir: &str| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        (count("/proc/self/fd"), count("/proc/self/task"))
    }

    /// Builds a job of `world_size` thread ranks, each doing an all-gather and a barrier right
    /// after joining; returns the seconds until every rank was done, and the largest number of
    /// sockets (links and the listener) any rank held.
    fn create_at_scale(world_size: usize, roots: usize, timeout: Duration) -> (f64, usize) {
        let ids: Vec<UniqueId> = (0..roots).map(|_| new_id()).collect();
        let started = Instant::now();
        let done = Barrier::new(world_size);
        let sockets = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..world_size)
                .map(|rank| {
                    let (ids, done) = (&ids, &done);
                    std::thread::Builder::new()
                        .stack_size(256 << 10)
                        .spawn_scoped(scope, move || {
                            let b = TcpBootstrap::with_roots(ids, rank, world_size, timeout).unwrap();
                            let all = b.all_gather(&(rank as u32).to_le_bytes()).unwrap();
                            assert!(all.iter().enumerate().all(|(r, v)| v[..] == (r as u32).to_le_bytes()));
                            b.barrier().unwrap();
                            let sockets = b.open_links() + 1;
                            // Everyone holds its bootstrap until all are counted.
                            done.wait();
                            sockets
                        })
                        .unwrap()
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).max().unwrap_or(0)
        });
        (started.elapsed().as_secs_f64(), sockets)
    }

    #[test]
    fn two_hundred_fifty_six_ranks_with_a_few_links_each() {
        let (seconds, sockets) = create_at_scale(256, 1, Duration::from_secs(60));
        // Tree links (a parent and four children) and the listener.
        assert!(sockets <= 6, "a rank held {sockets} sockets");
        assert!(seconds < 30.0, "took {seconds:.1} s");
    }

    #[test]
    #[ignore = "1,024 ranks as threads (about 3,000 sockets in this process): run by hand, alone"]
    fn a_thousand_and_twenty_four_ranks_join_within_ten_seconds_and_leave_nothing() {
        let before = process_resources();
        for roots in [1, 4] {
            let (seconds, sockets) = create_at_scale(1024, roots, Duration::from_secs(60));
            println!(
                "1024 ranks, {roots} root(s): joined, all_gather and barrier in {seconds:.2} s; at most {sockets} sockets per rank"
            );
            assert!(seconds <= 10.0 && sockets <= 32, "{seconds:.2} s, {sockets} sockets");
        }
        let after = process_resources();
        assert_eq!(before, after, "(file descriptors, threads) before and after");
    }

    #[test]
    fn a_second_job_meets_at_the_same_address_while_the_first_lives() {
        let id = new_id();
        let timeout = Duration::from_secs(10);
        let join = |world_size: usize| {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..world_size)
                    .map(|rank| {
                        let id = &id;
                        scope.spawn(move || TcpBootstrap::new(id, rank, world_size, timeout).unwrap())
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
            })
        };
        let first = join(3);
        let second = join(3);
        std::thread::scope(|scope| {
            for b in first.iter().chain(&second) {
                scope.spawn(move || exercise(b));
            }
        });
    }

    #[test]
    fn several_roots_make_one_job() {
        for (world_size, roots) in [(2, 2), (7, 3), (10, 4)] {
            let ids: Vec<UniqueId> = (0..roots).map(|_| new_id()).collect();
            let keys = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..world_size)
                    .map(|rank| {
                        let ids = &ids;
                        scope.spawn(move || {
                            let b = TcpBootstrap::with_roots(ids, rank, world_size, Duration::from_secs(10)).unwrap();
                            exercise(&b);
                            b.job_key()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
            });
            assert!(keys.iter().all(|k| *k == ids[0].job_key()), "{keys:?}");
        }
        let id = new_id();
        let too_many = TcpBootstrap::with_roots(&[id.clone(), id.clone(), id], 0, 2, Duration::from_secs(1));
        assert!(matches!(too_many, Err(Error::InvalidArgument(_))), "{too_many:?}");
        assert!(matches!(TcpBootstrap::with_roots(&[], 0, 2, Duration::from_secs(1)), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn links_open_on_demand_and_watch_their_peer() {
        let timeout = Duration::from_secs(10);
        run_job(9, timeout, |b| {
            let (me, n) = (b.rank(), b.world_size());
            let tree_links = usize::from(tree::parent(me).is_some()) + tree::children(me, n).count();
            // Ranks 3 and 8 are no tree neighbours (8 hangs below 1).
            match me {
                3 => {
                    b.send(8, 1, b"far away").unwrap();
                    assert_eq!(b.recv(8, 2).unwrap(), b"and back");
                    assert_eq!(b.open_links(), tree_links + 1);
                }
                8 => {
                    assert_eq!(b.recv(3, 1).unwrap(), b"far away");
                    b.send(3, 2, b"and back").unwrap();
                    assert_eq!(b.open_links(), tree_links + 1, "the answer reused the link");
                }
                5 => {
                    // Asking about a peer without a link opens one, so its loss will show.
                    assert_eq!(b.peer_lost(7), None);
                    let deadline = Deadline::after(timeout);
                    while b.open_links() == tree_links && !deadline.expired() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    assert_eq!(b.open_links(), tree_links + 1);
                }
                _ => assert!(b.open_links() <= tree_links + usize::from(me == 7)),
            }
            b.barrier().unwrap();
            if me == 7 {
                drop(b);
            } else if me == 5 {
                let deadline = Deadline::after(timeout);
                while b.peer_lost(7).is_none() && !deadline.expired() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(b.peer_lost(7).is_some(), "rank 7's drop was not noticed");
            }
        });
    }

    #[test]
    fn strangers_at_a_member_listener_are_refused_and_the_job_goes_on() {
        use std::io::{Read, Write};
        let timeout = Duration::from_secs(10);
        let id = new_id();
        let sync = Barrier::new(3);
        std::thread::scope(|scope| {
            let ranks: Vec<_> = (0..3)
                .map(|rank| {
                    let (id, sync) = (&id, &sync);
                    scope.spawn(move || {
                        let b = TcpBootstrap::new(id, rank, 3, timeout).unwrap();
                        let addr = b.addrs[2];
                        sync.wait();
                        if rank == 0 {
                            // A wrong secret, an old version, garbage: each is closed unanswered.
                            let stranger = UniqueId::with_secret(id.addr, [0x77; 16]);
                            let mut old = messages::encode_peer_hello(id, 0, 2, 3);
                            old[4..6].copy_from_slice(&1u16.to_le_bytes());
                            for hello in [messages::encode_peer_hello(&stranger, 0, 2, 3), old, b"garbage".to_vec()] {
                                let mut s = std::net::TcpStream::connect(addr).unwrap();
                                s.write_all(&(hello.len() as u32).to_le_bytes()).unwrap();
                                s.write_all(&hello).unwrap();
                                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                                let mut answer = Vec::new();
                                let read = s.read_to_end(&mut answer);
                                assert!(read.is_ok() && answer.is_empty(), "{read:?}: {answer:?}");
                            }
                        }
                        sync.wait();
                        exercise(&b);
                    })
                })
                .collect();
            ranks.into_iter().for_each(|r| r.join().unwrap());
        });
    }

    #[test]
    fn bad_arguments_are_invalid() {
        let id = new_id();
        let timeout = Duration::from_secs(1);
        assert!(matches!(TcpBootstrap::new(&id, 0, 0, timeout), Err(Error::InvalidArgument(_))));
        assert!(matches!(TcpBootstrap::new(&id, 2, 2, timeout), Err(Error::InvalidArgument(_))));
        assert!(matches!(TcpBootstrap::new(&id, 0, 1, Duration::ZERO), Err(Error::InvalidArgument(_))));
        let single = TcpBootstrap::new(&id, 0, 1, timeout).unwrap();
        assert!(matches!(single.send(1, 0, b"x"), Err(Error::InvalidArgument(_))));
        assert!(matches!(single.recv(1, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(single.broadcast(1, b"x"), Err(Error::InvalidArgument(_))));
        assert_eq!(single.all_gather(b"x").unwrap(), vec![b"x".to_vec()]);
        single.barrier().unwrap();
        assert!(format!("{single:?}").contains("TcpBootstrap"));
    }
}
