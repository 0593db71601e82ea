//! The rendezvous of the TCP bootstrap (steps 1 and 2 of the [protocol](super)): every rank
//! joins at the root of its group; each root gathers the hellos of its group, a root other than
//! the first sends its group's table to the first, and the first root ends up with the rank
//! table. Every step is bounded by one deadline.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::time::Duration;

use super::io::{Acceptor, IoFailure, bind_member_listener, read_handshake, write_handshake};
use super::messages::{
    GROUP_TABLE_MAGIC, MAX_HELLO_LEN, RankEntry, decode_group_table, decode_root_ack, decode_root_hello,
    encode_group_table, encode_root_ack, encode_root_hello,
};
use crate::bootstrap::UniqueId;
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::tcp_bounded::connect_within;

/// Longest pause between two attempts to reach a root.
const CONNECT_RETRY_MAX: Duration = Duration::from_millis(200);

/// Longest one attempt to reach a root may take (three SYNs): a root host that does not answer
/// at all is tried again (a cancelled deadline ends an attempt at once).
const CONNECT_ATTEMPT_MAX: Duration = Duration::from_secs(5);

/// The ranks that join at root `group` of `roots`: contiguous ranges, the first
/// `world_size % roots` of them one rank longer. The group's first rank is its root.
pub(super) fn group_range(group: usize, world_size: usize, roots: usize) -> Range<usize> {
    let (base, longer) = (world_size / roots, world_size % roots);
    let start = group * base + group.min(longer);
    start..start + base + usize::from(group < longer)
}

/// The group (root) that `rank` joins at.
pub(super) fn group_of(rank: usize, world_size: usize, roots: usize) -> usize {
    let (base, longer) = (world_size / roots, world_size % roots);
    let boundary = longer * (base + 1);
    if rank < boundary { rank / (base + 1) } else { longer + (rank - boundary) / base.max(1) }
}

/// One rank's part of the rendezvous.
pub(super) struct Rendezvous<'a> {
    /// One id per root; the first is the job's (its secret opens every link).
    pub(super) ids: &'a [UniqueId],
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) deadline: Deadline,
    pub(super) host: String,
}

impl Rendezvous<'_> {
    /// The error of a step that ran out of time (or was cancelled: [`Error::Aborted`]).
    fn timeout_error(&self, operation: String, peer: Option<usize>) -> Error {
        self.deadline.give_up(operation, peer)
    }

    fn io_failure(&self, failure: IoFailure, peer: usize, operation: &str) -> Error {
        match failure {
            IoFailure::TimedOut => self.timeout_error(operation.to_string(), Some(peer)),
            IoFailure::Closed(reason) => Error::peer_lost(peer, operation, reason),
            IoFailure::Malformed(reason) => Error::protocol(format!("{operation}: rank {peer} {reason}")),
        }
    }

    fn roots(&self) -> usize {
        self.ids.len()
    }

    /// Joins: binds this rank's listener for links and, at a root, gathers its group on its id's
    /// address (closed again when done). Returns the listener and, at rank 0, the rank table.
    pub(super) fn join(&self) -> Result<(TcpListener, Option<Vec<RankEntry>>)> {
        let group = group_of(self.rank, self.world_size, self.roots());
        let range = group_range(group, self.world_size, self.roots());
        let root_id = &self.ids[group];
        if self.rank != range.start {
            let listener = bind_member_listener(root_id.addr)?;
            let listen_addr =
                listener.local_addr().map_err(|e| Error::io("read the bootstrap listener's address", e))?;
            let hello = encode_root_hello(
                root_id,
                self.rank,
                self.world_size,
                self.roots(),
                &RankEntry { listen_addr, host: self.host.clone() },
            );
            self.report_to(range.start, root_id, &hello, self.rank)?;
            return Ok((listener, None));
        }
        // std's `TcpListener::bind` sets SO_REUSEADDR on Unix, so a port that an earlier job left
        // in TIME_WAIT can be bound again at once (a port with a live listener cannot).
        let root_listener = super::io::bind_listener(root_id.addr, "root listener")?;
        // Links come to another port, so the id's port is free again once the rendezvous is
        // over (a process may bootstrap another job at the same address while this one lives).
        let link_addr = SocketAddr::new(root_id.addr.ip(), 0);
        let listener = super::io::bind_listener(link_addr, "listener")?;
        let link_addr = listener.local_addr().map_err(|e| Error::io("read the bootstrap listener's address", e))?;
        let own = RankEntry { listen_addr: link_addr, host: self.host.clone() };
        let entries = self.gather(&root_listener, group, range.clone(), own)?;
        drop(root_listener);
        if group == 0 {
            return Ok((listener, Some(entries)));
        }
        let table = encode_group_table(&self.ids[0], self.world_size, self.roots(), group, range.start, &entries);
        self.report_to(0, &self.ids[0], &table, range.start)?;
        Ok((listener, None))
    }

    /// At the root of `group`: accepts a hello from every other rank of `range` (and at rank 0
    /// the table of every other group), acknowledging each; returns the entries gathered, the
    /// root's `own` first (rank 0: the whole rank table).
    fn gather(
        &self,
        listener: &TcpListener,
        group: usize,
        range: Range<usize>,
        own: RankEntry,
    ) -> Result<Vec<RankEntry>> {
        let (n, roots) = (self.world_size, self.roots());
        let id = &self.ids[group];
        let mut acceptor = Acceptor::new(listener, self.rank)?;
        let covered = if group == 0 { 0..n } else { range.clone() };
        let mut joined: Vec<Option<RankEntry>> = vec![None; covered.len()];
        joined[0] = Some(own);
        let mut missing = covered.len() - 1;
        while missing > 0 {
            let Some(incoming) = acceptor.next(&self.deadline)? else {
                let absent: Vec<usize> = covered.clone().filter(|&r| joined[r - covered.start].is_none()).collect();
                return Err(self.timeout_error(
                    format!("bootstrap rendezvous at {}: ranks {absent:?} never joined", id.addr),
                    absent.first().copied(),
                ));
            };
            let members = range.start + 1..range.end;
            let arrived = if incoming.hello.starts_with(&GROUP_TABLE_MAGIC) && group == 0 {
                decode_group_table(&incoming.hello, &self.ids[0], n, roots, |g| group_range(g, n, roots))
                    .map(|(g, entries)| (group_range(g, n, roots).start, entries))
            } else {
                decode_root_hello(&incoming.hello, id, n, roots, members).map(|(rank, entry)| (rank, vec![entry]))
            };
            let (first, entries) = match arrived {
                Ok(arrived) => arrived,
                Err(e) => {
                    acceptor.refuse(incoming.from, &e.to_string());
                    continue;
                }
            };
            if joined[first - covered.start].is_some() {
                acceptor.refuse(incoming.from, &format!("rank {first} has already joined"));
                continue;
            }
            // The answer is small and the socket fresh: a failure means the rank went away, and it
            // will not get far without the acknowledgement; the job waits for a retry.
            let ack_deadline = Deadline::after(super::io::HANDSHAKE_TIMEOUT.min(self.deadline.remaining()));
            if write_handshake(&incoming.stream, &encode_root_ack(id, first), &ack_deadline).is_err() {
                acceptor.refuse(incoming.from, &format!("rank {first} did not take the acknowledgement"));
                continue;
            }
            for (offset, entry) in entries.into_iter().enumerate() {
                joined[first - covered.start + offset] = Some(entry);
                missing -= 1;
            }
        }
        Ok(joined.into_iter().flatten().collect())
    }

    /// Sends `message` to the root of rank `root` at `id` and waits for its acknowledgement of
    /// `rank` (a member: itself; a root: the first rank of its group).
    fn report_to(&self, root: usize, id: &UniqueId, message: &[u8], rank: usize) -> Result<()> {
        let mut stream = self.connect_to_root(root, id.addr)?;
        write_handshake(&stream, message, &self.deadline)
            .map_err(|f| self.io_failure(f, root, "bootstrap rendezvous: sending the hello to the root"))?;
        let ack = read_handshake(&mut stream, MAX_HELLO_LEN, &self.deadline).map_err(|failure| match failure {
            IoFailure::TimedOut => self.timeout_error(
                format!("bootstrap rendezvous: waiting for the root at {} to acknowledge rank {rank}", id.addr),
                Some(root),
            ),
            IoFailure::Closed(reason) => Error::peer_lost(
                root,
                "bootstrap rendezvous",
                format!(
                    "the root at {} closed the connection instead of acknowledging rank {rank} ({reason}); it refuses \
                     a wrong job secret, protocol version, rank, world size or number of roots, and a rank that has \
                     already joined",
                    id.addr
                ),
            ),
            IoFailure::Malformed(reason) => {
                Error::protocol(format!("bootstrap acknowledgement from the root: {reason}"))
            }
        })?;
        decode_root_ack(&ack, id, rank)
    }

    /// Connects to the root `root` at `addr`, retrying with backoff until the deadline (it may
    /// start later).
    fn connect_to_root(&self, root: usize, addr: SocketAddr) -> Result<TcpStream> {
        let mut pause = Duration::from_millis(2);
        loop {
            match connect_within(addr, CONNECT_ATTEMPT_MAX, &self.deadline) {
                Ok(stream) => return Ok(stream),
                Err(e) if self.deadline.expired() => {
                    return Err(self.timeout_error(
                        format!("bootstrap rendezvous: connecting to the root at {addr} (last error: {e})"),
                        Some(root),
                    ));
                }
                Err(_) => {
                    std::thread::sleep(pause.min(self.deadline.next_wait()));
                    pause = (pause * 2).min(CONNECT_RETRY_MAX);
                }
            }
        }
    }
}

/// This rank's host identity (`WEAVE_HOST_ID` or `hostname/boot-id`, see [`crate::host`]); a
/// malformed `WEAVE_HOST_ID` is reported by whoever builds the Config, here it falls back.
pub(super) fn local_host_identity() -> String {
    crate::host::host_identity(crate::config::host_id_from_env().ok().flatten().as_deref())
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::time::Instant;

    use super::super::TcpBootstrap;
    use super::super::io::HANDSHAKE_TIMEOUT;
    use super::super::messages::{PROTOCOL_VERSION, ROOT_HELLO_MAGIC};
    use super::super::tests::{exercise, new_id};
    use super::*;
    use crate::wire::Encoder;

    /// Connects to `addr`, retrying until it listens.
    fn connect_when_listening(addr: SocketAddr) -> TcpStream {
        let deadline = Deadline::after(Duration::from_secs(5));
        loop {
            match TcpStream::connect(addr) {
                Ok(stream) => return stream,
                Err(e) if deadline.expired() => panic!("{addr} never listened: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    fn entry(addr: &str, host: &str) -> RankEntry {
        RankEntry { listen_addr: addr.parse().unwrap(), host: host.into() }
    }

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = (message.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(message);
        out
    }

    /// True once the other side has closed `stream` (end of stream or reset).
    fn closed_by_peer(mut stream: TcpStream) -> bool {
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut sink = Vec::new();
        match stream.read_to_end(&mut sink) {
            Ok(_) => true,
            Err(e) => e.kind() == ErrorKind::ConnectionReset,
        }
    }

    #[test]
    fn strangers_at_the_root_port_are_refused_and_the_job_goes_on() {
        let id = new_id();
        let world_size = 3;
        let timeout = Duration::from_secs(10);
        let started = Instant::now();
        std::thread::scope(|scope| {
            let root = scope.spawn(|| {
                let b = TcpBootstrap::new(&id, 0, world_size, timeout).unwrap();
                exercise(&b);
            });
            // Strangers arrive first.
            let other_job = UniqueId::with_secret(id.addr, [0x5a; 16]);
            let hello = encode_root_hello(&other_job, 1, world_size, 1, &entry("127.0.0.1:1", "elsewhere"));
            let mut wrong_secret = connect_when_listening(id.addr);
            wrong_secret.write_all(&framed(&hello)).unwrap();
            let mut huge_length = connect_when_listening(id.addr);
            huge_length.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut garbage = connect_when_listening(id.addr);
            garbage.write_all(&framed(b"\x01\x02\x03 definitely not weave")).unwrap();
            let mut wrong_version = connect_when_listening(id.addr);
            let mut old = Encoder::new(ROOT_HELLO_MAGIC, PROTOCOL_VERSION + 7);
            old.raw(&id.secret);
            wrong_version.write_all(&framed(&old.finish())).unwrap();
            let mut truncated = connect_when_listening(id.addr);
            truncated
                .write_all(&framed(&encode_root_hello(&id, 1, world_size, 1, &entry("127.0.0.1:1", "h"))[..20]))
                .unwrap();
            let silent = connect_when_listening(id.addr);
            // The root refuses each of them while it waits for the real ranks.
            for stranger in [wrong_secret, huge_length, garbage, wrong_version, truncated] {
                assert!(closed_by_peer(stranger));
            }

            let members: Vec<_> = (1..world_size)
                .map(|rank| {
                    let id = &id;
                    scope.spawn(move || exercise(&TcpBootstrap::new(id, rank, world_size, timeout).unwrap()))
                })
                .collect();
            root.join().unwrap();
            members.into_iter().for_each(|m| m.join().unwrap());
            assert!(started.elapsed() < HANDSHAKE_TIMEOUT, "the silent connection held up the job");
            // The silent one is closed with the listener once everyone has joined.
            assert!(closed_by_peer(silent));
        });
    }

    #[test]
    fn a_rank_with_another_world_size_is_refused_and_the_job_goes_on() {
        let id = new_id();
        let timeout = Duration::from_secs(10);
        std::thread::scope(|scope| {
            let root = scope.spawn(|| exercise(&TcpBootstrap::new(&id, 0, 2, timeout).unwrap()));
            let misconfigured = TcpBootstrap::new(&id, 1, 3, timeout);
            assert!(matches!(misconfigured, Err(Error::PeerLost { peer: 0, .. })), "{misconfigured:?}");
            let bad_rank = TcpBootstrap::new(&id, 4, 5, timeout);
            assert!(matches!(bad_rank, Err(Error::PeerLost { peer: 0, .. })), "{bad_rank:?}");
            exercise(&TcpBootstrap::new(&id, 1, 2, timeout).unwrap());
            root.join().unwrap();
        });
    }

    #[test]
    fn a_duplicate_rank_is_refused_and_the_job_goes_on() {
        let id = new_id();
        let timeout = Duration::from_secs(10);
        std::thread::scope(|scope| {
            let ranks: Vec<_> = [0, 1, 1, 2]
                .into_iter()
                .map(|rank| {
                    let id = &id;
                    scope.spawn(move || TcpBootstrap::new(id, rank, 3, timeout).map(|b| exercise(&b)))
                })
                .collect();
            let results: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
            assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
            assert_eq!(results[1].is_ok() as u8 + results[2].is_ok() as u8, 1, "{results:?}");
        });
    }

    #[test]
    fn rendezvous_times_out_naming_a_missing_rank() {
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        let root = TcpBootstrap::new(&new_id(), 0, 3, timeout);
        assert!(matches!(root, Err(Error::Timeout { peer: Some(1), .. })), "{root:?}");
        let member = TcpBootstrap::new(&new_id(), 2, 3, timeout);
        assert!(matches!(member, Err(Error::Timeout { peer: Some(0), .. })), "{member:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    }
}
