//! [`TcpBootstrap`]: ranks meet at the root over TCP, then keep one TCP link per pair of ranks.
//!
//! # Protocol (version 1)
//!
//! Handshake messages are a `u32` little-endian length followed by a [`wire`](crate::wire)
//! message (magic, version, fields); every one carries the job secret.
//!
//! 1. Every rank binds a listener. Rank 0 binds the [`UniqueId`] address; rank `r > 0` binds
//!    port 0 on the interface that routes to the root (the root's own address when that is a
//!    loopback address).
//! 2. Rank `r > 0` connects to the root (retrying until the deadline, since the root may start
//!    later) and sends a *root hello* (`WVBH`): secret, rank, world size, its listen address and
//!    host identity (hostname and kernel boot id). The root checks each hello — magic, version,
//!    secret (compared without early exit), rank in range and not taken, world size equal — and
//!    closes connections that fail, or that do not send a complete hello within a few seconds;
//!    the job goes on. Once every rank has joined, the root sends each one the *rank table*
//!    (`WVBT`: secret, world size, then listen address and host identity of every rank).
//! 3. Full mesh: the root's connections stay as links to the root; rank `r > 0` connects to every
//!    rank `0 < j < r` and sends a *peer hello* (`WVBP`: secret, from, to, world size); `j`
//!    checks it like the root does, refuses strangers, and answers with its own peer hello,
//!    which `r` checks in turn. Listeners close once the mesh is complete.
//! 4. On every link, messages are frames: tag `u64`, length `u64` (at most
//!    [`TcpBootstrap::MAX_MESSAGE_LEN`]), payload. One reader thread per link files them into a
//!    mailbox keyed by (peer, tag).
//!
//! # Layout
//!
//! [`messages`] encodes and checks the handshake messages (steps 2 and 3), [`rendezvous`] runs
//! the root's and the members' side of steps 1 to 3 and holds the rank table, and [`io`] holds
//! what touches sockets: reads and writes bounded by a deadline, the acceptor that reads hellos
//! without letting a silent connection hold up the others, listener binding, the links, their
//! reader threads and the mailbox of step 4. This file holds [`TcpBootstrap`] itself.

mod io;
mod messages;
mod rendezvous;

use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use self::io::{IoFailure, Link, LinkWriter, Mailbox, read_frames, write_frame};
use self::rendezvous::{Rendezvous, local_host_identity};
use super::unique_id::UniqueId;
use super::{Bootstrap, RESERVED_TAG_BASE, TAG_ALL_GATHER, TAG_BARRIER, TAG_BROADCAST};
use crate::config::{Config, Deadline, LogLevel};
use crate::error::{Error, Result};

/// On drop, how long to wait for peers to close their side too (a clean close on both sides).
const DROP_GRACE: Duration = Duration::from_millis(100);
/// On drop, how long to wait for reader threads after their sockets were shut down.
const DROP_JOIN_LIMIT: Duration = Duration::from_secs(2);

/// The built-in [`Bootstrap`]: TCP, rendezvous at the root of a [`UniqueId`], then one link per
/// pair of ranks.
///
/// * `send` to one's own rank is supported: the message goes straight into the own mailbox and
///   `recv(own rank, tag)` returns it. Peers outside `0..world_size` are an
///   [`Error::InvalidArgument`].
/// * Messages sent just before a rank drops its `TcpBootstrap` are still delivered: the drop
///   first closes the sending side of each link (the peer reads everything, then sees the end),
///   waits briefly for peers to close theirs, then stops the reader threads. (A peer that keeps
///   sending to a rank after that rank dropped can make the kernel reset the link, which may
///   discard the dropped rank's last unacknowledged bytes.)
/// * `recv` returns messages already received from a peer even after that peer is gone; once
///   none is left it returns [`Error::PeerLost`].
pub struct TcpBootstrap {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    job_key: String,
    timeout: Duration,
    warn: bool,
    /// One link per peer; `None` at the own rank.
    links: Vec<Option<Link>>,
    mailbox: Arc<Mailbox>,
    /// Reader threads, with the peer each one reads from.
    readers: Vec<(usize, JoinHandle<()>)>,
}

impl TcpBootstrap {
    /// Largest message `send` accepts and a reader accepts from a peer (1 GiB).
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
        if world_size == 0 {
            return Err(Error::invalid("bootstrap world size must be at least 1"));
        }
        if rank >= world_size {
            return Err(Error::invalid(format!("bootstrap rank {rank} is not a rank of a {world_size}-rank job")));
        }
        if timeout.is_zero() {
            return Err(Error::invalid("bootstrap timeout must be positive"));
        }
        // A malformed WEAVE_* variable is reported by whoever builds the Config; here it only
        // decides whether warnings are printed, so fall back to the default (warn).
        let warn = Config::from_env().map(|c| c.logs(LogLevel::Warn)).unwrap_or(true);
        let rendezvous =
            Rendezvous { id, rank, world_size, deadline: Deadline::after(timeout), warn, host: local_host_identity() };
        let (streams, hosts) = if world_size == 1 {
            (vec![None], vec![rendezvous.host.clone()])
        } else if rank == 0 {
            rendezvous.as_root()?
        } else {
            rendezvous.as_member()?
        };
        TcpBootstrap::assemble(id, rank, world_size, timeout, warn, streams, &hosts)
    }

    /// Turns connected streams into links with reader threads.
    fn assemble(
        id: &UniqueId,
        rank: usize,
        world_size: usize,
        timeout: Duration,
        warn: bool,
        streams: Vec<Option<TcpStream>>,
        hosts: &[String],
    ) -> Result<Self> {
        let my_host = hosts.get(rank).cloned().unwrap_or_default();
        let same_host: Vec<usize> = (0..world_size).filter(|&r| hosts.get(r) == Some(&my_host)).collect();
        let local_rank = same_host.iter().filter(|&&r| r < rank).count();
        let local_world_size = same_host.len().max(1);

        let mailbox = Arc::new(Mailbox::new(world_size));
        let mut reader_streams = Vec::new();
        let mut links = Vec::with_capacity(world_size);
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                links.push(None);
                continue;
            };
            let configure = || -> std::io::Result<()> {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(None)?;
                stream.set_write_timeout(None)
            };
            configure().map_err(|e| Error::io(format!("set up the bootstrap link to rank {peer}"), e))?;
            // One socket (one file descriptor) per link, shared by the reader thread and `send`.
            let stream = Arc::new(stream);
            reader_streams.push((peer, Arc::clone(&stream)));
            links.push(Some(Link { writer: Mutex::new(LinkWriter { stream, broken: None }) }));
        }
        let mut bootstrap = TcpBootstrap {
            rank,
            world_size,
            local_rank,
            local_world_size,
            job_key: id.job_key(),
            timeout,
            warn,
            links,
            mailbox,
            readers: Vec::new(),
        };
        for (peer, stream) in reader_streams {
            let mailbox = Arc::clone(&bootstrap.mailbox);
            // On error, `bootstrap` is dropped here, which shuts down and joins what was started.
            let handle = std::thread::Builder::new()
                .name(format!("weave-bootstrap-{rank}-from-{peer}"))
                .spawn(move || {
                    let reason = read_frames(stream, peer, &mailbox);
                    mailbox.mark_lost(peer, reason);
                })
                .map_err(|e| Error::io("spawn a bootstrap reader thread", e))?;
            bootstrap.readers.push((peer, handle));
        }
        Ok(bootstrap)
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

    /// Waits until every peer that has a reader thread is marked lost, at most `limit`.
    fn wait_for_readers(&self, limit: Duration) {
        let deadline = Deadline::after(limit);
        let mut state = self.mailbox.lock();
        while self.readers.iter().any(|(peer, _)| state.lost.get(*peer).is_some_and(Option::is_none)) {
            let remaining = deadline.remaining();
            if remaining.is_zero() {
                return;
            }
            state = self.mailbox.changed.wait_timeout(state, remaining).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn shutdown_links(&self, how: Shutdown) {
        for link in self.links.iter().flatten() {
            // Errors only mean the socket is already shut down or gone.
            let _ = link.lock().stream.shutdown(how);
        }
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn peer_lost(&self, peer: usize) -> Option<String> {
        self.mailbox.lock().lost.get(peer).cloned().flatten()
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
            self.mailbox.deliver(peer, tag, data.to_vec());
            return Ok(());
        }
        let operation = || format!("bootstrap send {} to rank {peer}", describe_tag(tag));
        let Some(link) = self.links.get(peer).and_then(Option::as_ref) else {
            // Invariant: every rank other than the own one has a link; answer anyway.
            return Err(Error::peer_lost(peer, operation(), "no link to this rank"));
        };
        if let Some(reason) = self.mailbox.lock().lost.get(peer).cloned().flatten() {
            return Err(Error::peer_lost(peer, operation(), reason));
        }
        let mut writer = link.lock();
        if let Some(reason) = &writer.broken {
            return Err(Error::peer_lost(peer, operation(), reason.clone()));
        }
        let deadline = Deadline::after(self.timeout);
        let written = write_frame(&writer.stream, tag, data, &deadline);
        match written {
            Ok(()) => Ok(()),
            Err(IoFailure::TimedOut) => {
                // Part of a frame may be on the wire: the link cannot be used any more. Shut it
                // down so the peer notices instead of misreading the next frame.
                writer.broken = Some(format!("an earlier send of {} bytes timed out part-way", data.len()));
                let _ = writer.stream.shutdown(Shutdown::Both);
                Err(Error::timeout(operation(), Some(peer), deadline.elapsed()))
            }
            Err(IoFailure::Closed(reason) | IoFailure::Malformed(reason)) => {
                writer.broken = Some(reason.clone());
                Err(Error::peer_lost(peer, operation(), reason))
            }
        }
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.check_peer(peer, "recv")?;
        let deadline = Deadline::after(self.timeout);
        let mut state = self.mailbox.lock();
        loop {
            if let Some(message) = state.take(peer, tag) {
                return Ok(message);
            }
            if let Some(reason) = state.lost.get(peer).cloned().flatten() {
                return Err(Error::peer_lost(peer, format!("bootstrap recv {}", describe_tag(tag)), reason));
            }
            let remaining = deadline.remaining();
            if remaining.is_zero() {
                return Err(Error::timeout(
                    format!("bootstrap recv {}", describe_tag(tag)),
                    Some(peer),
                    deadline.elapsed(),
                ));
            }
            state = self.mailbox.changed.wait_timeout(state, remaining).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Drop for TcpBootstrap {
    fn drop(&mut self) {
        // First close the sending side: peers read everything already sent, then the end.
        self.shutdown_links(Shutdown::Write);
        // Peers that are closing too answer within the grace period; both sides then close
        // cleanly (no reset that could discard data still in flight).
        self.wait_for_readers(DROP_GRACE);
        // Wake the remaining readers (a shut-down socket reads as end of stream).
        self.shutdown_links(Shutdown::Read);
        self.wait_for_readers(DROP_JOIN_LIMIT);
        let lost: Vec<bool> = self.mailbox.lock().lost.iter().map(Option::is_some).collect();
        for (peer, handle) in self.readers.drain(..) {
            // A reader marks its peer lost as its very last step, so joining it returns at once.
            if handle.is_finished() || lost.get(peer).copied().unwrap_or(false) {
                let _ = handle.join();
            } else if self.warn {
                eprintln!(
                    "weave: warning: bootstrap rank {}: the reader thread for rank {peer} did not stop within {:?}; leaving it detached",
                    self.rank, DROP_JOIN_LIMIT
                );
            }
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
