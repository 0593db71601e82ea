//! The rendezvous of the TCP bootstrap (steps 1 to 3 of the [protocol](super)): the root
//! gathers a hello from every rank and sends back the rank table; members join at the root, then
//! link to one another. Every step is bounded by one deadline.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::TcpBootstrap;
use super::io::{Acceptor, IoFailure, bind_member_listener, is_transient, read_handshake, write_handshake};
use super::messages::{
    MAX_HELLO_LEN, MAX_HOST_IDENTITY_LEN, decode_peer_hello, decode_rank_table, decode_root_hello, encode_peer_hello,
    encode_rank_table, encode_root_hello,
};
use crate::bootstrap::UniqueId;
use crate::config::Deadline;
use crate::error::{Error, Result};

/// Longest pause between two attempts to reach the root.
const CONNECT_RETRY_MAX: Duration = Duration::from_millis(200);

/// What the rank table says about one rank.
pub(super) struct RankEntry {
    pub(super) listen_addr: SocketAddr,
    pub(super) host: String,
}

/// One rank's part of the rendezvous.
pub(super) struct Rendezvous<'a> {
    pub(super) id: &'a UniqueId,
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) deadline: Deadline,
    pub(super) warn: bool,
    pub(super) host: String,
}

/// Connected streams indexed by peer (`None` at the own rank) and host identities by rank.
pub(super) type Mesh = (Vec<Option<TcpStream>>, Vec<String>);

impl Rendezvous<'_> {
    fn timeout_error(&self, operation: String, peer: Option<usize>) -> Error {
        Error::timeout(operation, peer, self.deadline.elapsed())
    }

    fn io_failure(&self, failure: IoFailure, peer: usize, operation: &str) -> Error {
        match failure {
            IoFailure::TimedOut => self.timeout_error(operation.to_string(), Some(peer)),
            IoFailure::Closed(reason) => Error::peer_lost(peer, operation, reason),
            IoFailure::Malformed(reason) => Error::protocol(format!("{operation}: rank {peer} {reason}")),
        }
    }

    /// Rank 0: accept a hello from every other rank, then send everyone the rank table.
    pub(super) fn as_root(&self) -> Result<Mesh> {
        // std's `TcpListener::bind` sets SO_REUSEADDR on Unix, so a port that an earlier job left
        // in TIME_WAIT can be bound again at once (a port with a live listener cannot).
        let listener = TcpListener::bind(self.id.addr)
            .map_err(|e| Error::io(format!("bind the bootstrap root listener on {}", self.id.addr), e))?;
        let mut acceptor = Acceptor::new(&listener, self.rank, self.warn)?;
        let mut joined: Vec<Option<(TcpStream, RankEntry)>> = (0..self.world_size).map(|_| None).collect();
        let mut missing = self.world_size - 1;
        while missing > 0 {
            let Some(incoming) = acceptor.next(&self.deadline)? else {
                let absent: Vec<usize> = (1..self.world_size).filter(|&r| joined[r].is_none()).collect();
                return Err(self.timeout_error(
                    format!("bootstrap rendezvous at {}: ranks {absent:?} never joined", self.id.addr),
                    absent.first().copied(),
                ));
            };
            match decode_root_hello(&incoming.hello, self.id, self.world_size) {
                Ok((rank, _)) if joined[rank].is_some() => {
                    acceptor.refuse(incoming.from, &format!("rank {rank} has already joined"));
                }
                Ok((rank, entry)) => {
                    joined[rank] = Some((incoming.stream, entry));
                    missing -= 1;
                }
                Err(e) => acceptor.refuse(incoming.from, &e.to_string()),
            }
        }
        // Closing the listener (and with it half-open handshakes from strangers).
        drop(acceptor);
        drop(listener);

        let mut streams = Vec::with_capacity(self.world_size);
        let mut entries = Vec::with_capacity(self.world_size);
        streams.push(None);
        entries.push(RankEntry { listen_addr: self.id.addr, host: self.host.clone() });
        for (stream, entry) in joined.into_iter().flatten() {
            streams.push(Some(stream));
            entries.push(entry);
        }
        let table = encode_rank_table(self.id, &entries);
        for (peer, stream) in streams.iter().enumerate() {
            if let Some(stream) = stream {
                write_handshake(stream, &table, &self.deadline)
                    .map_err(|f| self.io_failure(f, peer, "bootstrap rendezvous: sending the rank table"))?;
            }
        }
        Ok((streams, entries.into_iter().map(|e| e.host).collect()))
    }

    /// Rank > 0: join at the root, learn the table, then link to every other rank.
    pub(super) fn as_member(&self) -> Result<Mesh> {
        let listener = bind_member_listener(self.id.addr)?;
        let listen_addr = listener.local_addr().map_err(|e| Error::io("read the bootstrap listener's address", e))?;
        let mut root = self.connect_to_root()?;
        let hello = encode_root_hello(self.id, self.rank, self.world_size, listen_addr, &self.host);
        write_handshake(&root, &hello, &self.deadline)
            .map_err(|f| self.io_failure(f, 0, "bootstrap rendezvous: sending the hello to the root"))?;
        let table_limit = 64usize.saturating_add(self.world_size.saturating_mul(64 + MAX_HOST_IDENTITY_LEN));
        let table = read_handshake(&mut root, table_limit.min(TcpBootstrap::MAX_MESSAGE_LEN), &self.deadline).map_err(
            |failure| match failure {
                IoFailure::TimedOut => self.timeout_error(
                    "bootstrap rendezvous: waiting for the rank table from the root (some ranks have not joined yet)"
                        .into(),
                    Some(0),
                ),
                IoFailure::Closed(reason) => Error::peer_lost(
                    0,
                    "bootstrap rendezvous",
                    format!(
                        "the root closed the connection before sending the rank table ({reason}); it refuses a \
                         wrong job secret, protocol version, rank or world size, and a rank that has already joined"
                    ),
                ),
                IoFailure::Malformed(reason) => {
                    Error::protocol(format!("bootstrap rank table from the root: {reason}"))
                }
            },
        )?;
        let entries = decode_rank_table(&table, self.id, self.world_size)?;

        let mut streams: Vec<Option<TcpStream>> = (0..self.world_size).map(|_| None).collect();
        streams[0] = Some(root);
        // Outbound links to lower ranks: connect and send the hello; the answers are read after
        // accepting the higher ranks, so no rank waits on another that waits on it.
        let mut awaiting_answer = Vec::new();
        for (peer, entry) in entries.iter().enumerate().take(self.rank).skip(1) {
            let operation = format!("bootstrap mesh: connecting to rank {peer} at {}", entry.listen_addr);
            let remaining = self.deadline.remaining();
            if remaining.is_zero() {
                return Err(self.timeout_error(operation, Some(peer)));
            }
            let stream = TcpStream::connect_timeout(&entry.listen_addr, remaining).map_err(|e| {
                if is_transient(&e) {
                    self.timeout_error(operation.clone(), Some(peer))
                } else {
                    Error::peer_lost(peer, operation.clone(), e.to_string())
                }
            })?;
            let hello = encode_peer_hello(self.id, self.rank, peer, self.world_size);
            write_handshake(&stream, &hello, &self.deadline).map_err(|f| self.io_failure(f, peer, &operation))?;
            awaiting_answer.push((peer, stream));
        }

        // Inbound links from higher ranks (strangers are refused, the job goes on).
        let mut acceptor = Acceptor::new(&listener, self.rank, self.warn)?;
        let mut missing = self.world_size - 1 - self.rank;
        while missing > 0 {
            let Some(incoming) = acceptor.next(&self.deadline)? else {
                let absent: Vec<usize> = (self.rank + 1..self.world_size).filter(|&r| streams[r].is_none()).collect();
                return Err(self.timeout_error(
                    format!("bootstrap mesh: ranks {absent:?} never connected to rank {}", self.rank),
                    absent.first().copied(),
                ));
            };
            let peer = match decode_peer_hello(&incoming.hello, self.id, self.world_size, self.rank) {
                Ok(peer) if peer <= self.rank => {
                    acceptor.refuse(incoming.from, &format!("rank {peer} must not connect to rank {}", self.rank));
                    continue;
                }
                Ok(peer) if streams[peer].is_some() => {
                    acceptor.refuse(incoming.from, &format!("rank {peer} is already connected"));
                    continue;
                }
                Ok(peer) => peer,
                Err(e) => {
                    acceptor.refuse(incoming.from, &e.to_string());
                    continue;
                }
            };
            let answer = encode_peer_hello(self.id, self.rank, peer, self.world_size);
            write_handshake(&incoming.stream, &answer, &self.deadline)
                .map_err(|f| self.io_failure(f, peer, "bootstrap mesh: answering a hello"))?;
            streams[peer] = Some(incoming.stream);
            missing -= 1;
        }
        drop(acceptor);
        drop(listener);

        for (peer, mut stream) in awaiting_answer {
            let operation = format!("bootstrap mesh: waiting for rank {peer} to answer");
            let answer = read_handshake(&mut stream, MAX_HELLO_LEN, &self.deadline)
                .map_err(|f| self.io_failure(f, peer, &operation))?;
            let from = decode_peer_hello(&answer, self.id, self.world_size, self.rank)
                .map_err(|e| Error::protocol(format!("{operation}: {e}")))?;
            if from != peer {
                return Err(Error::protocol(format!("{operation}: it answered as rank {from}")));
            }
            streams[peer] = Some(stream);
        }
        Ok((streams, entries.into_iter().map(|e| e.host).collect()))
    }

    /// Connects to the root, retrying with backoff until the deadline (it may start later).
    fn connect_to_root(&self) -> Result<TcpStream> {
        let mut pause = Duration::from_millis(2);
        loop {
            let remaining = self.deadline.remaining();
            let attempt = if remaining.is_zero() {
                Err(io::Error::from(ErrorKind::TimedOut))
            } else {
                TcpStream::connect_timeout(&self.id.addr, remaining)
            };
            match attempt {
                Ok(stream) => return Ok(stream),
                Err(e) if self.deadline.expired() => {
                    return Err(self.timeout_error(
                        format!("bootstrap rendezvous: connecting to the root at {} (last error: {e})", self.id.addr),
                        Some(0),
                    ));
                }
                Err(_) => {
                    std::thread::sleep(pause.min(self.deadline.remaining()));
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
    use std::io::{Read, Write};
    use std::time::Instant;

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
            let hello = encode_root_hello(&other_job, 1, world_size, "127.0.0.1:1".parse().unwrap(), "elsewhere");
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
            truncated.write_all(&framed(&encode_root_hello(&id, 1, world_size, id.addr, "h")[..20])).unwrap();
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
