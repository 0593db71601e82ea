//! The receiving side: a listener that authenticates every socket, and the reader threads
//! ([`crate::reader`], one per stripe number) that read every socket — accepted or dialled —
//! and apply the peer's frames to this rank's regions — checking every region id, range and
//! length — in the order [`crate::wire`] defines. Waiting ranks apply frames too:
//! [`crate::receive`] says how the two share a socket.
//!
//! **One set of sockets per pair.** A socket carries both directions: the lower rank of a pair
//! dials its set, and the higher rank's connection to it writes on the sockets it accepted
//! from it ([`Inbound::take_offered`]), so each side's messages carry the TCP acknowledgement
//! of the other's instead of costing a segment of its own both ways (docs/perf-log/nodes.md,
//! "Across nodes: Open MPI really across the nodes"). A higher rank whose peer has not dialled
//! within [`OFFER_GRACE`] dials a set of its own (a pair connected one way only, by the higher
//! rank): correct, only slower.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use comm_core::spin::Backoff;
use comm_core::{Error, Result};

use crate::config::Tending;
use crate::reader::Readers;
use crate::receive::{InSocket, PeerInbound};
use crate::region::Regions;
use crate::wire::{HANDSHAKE_BYTES, HANDSHAKE_OK, Handshake};
use crate::writer::SocketWriter;

/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL_MS: u16 = 50;
/// Handshakes read at once, each on a thread of its own; a connection beyond them is closed at
/// once (a rank retries nothing, but its handshake is read long before this many strangers
/// could crowd it out).
const MAX_HANDSHAKES: usize = 64;
/// How long a higher rank's connection waits for the lower rank's sockets before it dials its
/// own (see the module doc).
pub(crate) const OFFER_GRACE: Duration = Duration::from_secs(2);

/// What the listener and its socket threads share.
pub(crate) struct Inbound {
    token: [u8; 16],
    regions: Arc<Regions>,
    /// Bounds every wait of the receiving side (a flag's data, a flush answer's write).
    pub(crate) timeout: Duration,
    /// Whether waiters tend this rank's peers (see [`crate::receive`]).
    pub(crate) tending: Tending,
    stop: AtomicBool,
    /// Handshakes being read now (see [`MAX_HANDSHAKES`]).
    handshakes: AtomicUsize,
    /// The sockets whose handshakes are being read, by number: shut down when the listener
    /// stops, so that no handshake thread outlives it by more than a moment.
    handshaking: Mutex<HashMap<u64, TcpStream>>,
    /// Test hook: while set, reader threads leave their sockets alone (waiters still drain
    /// them), standing for readers the scheduler has not run yet.
    pub(crate) readers_paused: AtomicBool,
    peers: Mutex<HashMap<usize, Arc<PeerInbound>>>,
    /// Peers whose sockets broke, or all closed, with why.
    lost: Mutex<HashMap<usize, String>>,
    /// Sockets of each peer that reached a clean end of stream.
    closed: Mutex<HashMap<usize, u16>>,
    sockets: Mutex<Vec<TcpStream>>,
    readers: Readers,
    /// Sets of sockets that lower ranks dialled, by rank, for this rank's connection to them to
    /// write on: one slot per stripe, filled as they are accepted.
    offered: Mutex<HashMap<usize, Vec<OfferedSet>>>,
}

/// A set of sockets a lower rank dialled, its stripes' writing ends as they are accepted.
type OfferedSet = Vec<Option<Arc<SocketWriter>>>;

impl Inbound {
    /// Reads `socket` (authenticated: stripe `stripe` of `stripes` of a set to or from `rank`)
    /// on its stripe's reader thread and in waiters' drains; returns its writing end.
    pub(crate) fn attach(
        self: &Arc<Self>,
        socket: TcpStream,
        rank: usize,
        stripe: u16,
        stripes: u16,
    ) -> Result<Arc<SocketWriter>> {
        let what = |e| Error::io(format!("prepare a tcp socket of rank {rank}"), e);
        let writer = Arc::new(SocketWriter::new(socket.try_clone().map_err(what)?));
        let for_shutdown = socket.try_clone().map_err(what)?;
        let peer = self.peer(rank);
        let in_socket = Arc::new(InSocket::new(socket, stripe, stripes, writer.clone()));
        peer.add(in_socket.clone());
        self.readers.add(in_socket, rank, peer, self)?;
        self.sockets.lock().unwrap_or_else(|p| p.into_inner()).push(for_shutdown);
        Ok(writer)
    }

    /// Offers the writing end of stripe `stripe` of `stripes` of a set `rank` dialled.
    fn offer(&self, rank: usize, stripe: u16, stripes: u16, writer: Arc<SocketWriter>) {
        let mut offered = self.offered.lock().unwrap_or_else(|p| p.into_inner());
        let sets = offered.entry(rank).or_default();
        // The first set of this size still missing this stripe: sets are dialled one by one.
        let n = usize::from(stripes);
        let at = match sets.iter().position(|set| set.len() == n && set[usize::from(stripe)].is_none()) {
            Some(at) => at,
            None => {
                sets.push(vec![None; n]);
                sets.len() - 1
            }
        };
        sets[at][usize::from(stripe)] = Some(writer);
    }

    /// Takes the first whole set of sockets `rank` dialled to this rank, waiting up to `grace`
    /// for one; `None` if none came.
    pub(crate) fn take_offered(&self, rank: usize, grace: Duration) -> Option<Vec<Arc<SocketWriter>>> {
        let start = Instant::now();
        let mut backoff = Backoff::new();
        loop {
            {
                let mut offered = self.offered.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(sets) = offered.get_mut(&rank)
                    && let Some(at) = sets.iter().position(|set| set.iter().all(Option::is_some))
                {
                    return Some(sets.remove(at).into_iter().flatten().collect());
                }
            }
            if start.elapsed() >= grace || self.stopping() {
                return None;
            }
            backoff.snooze();
        }
    }

    /// Sockets this rank reads, accepted and dialled (for tests).
    #[cfg(test)]
    pub(crate) fn socket_count(&self) -> usize {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Reader threads started so far, one per stripe number (for tests).
    #[cfg(test)]
    pub(crate) fn reader_threads(&self) -> usize {
        self.readers.thread_count()
    }

    /// `Some(why)` once a socket from `peer` closed or sent garbage.
    pub(crate) fn lost(&self, peer: usize) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).get(&peer).cloned()
    }

    /// The state shared by `peer`'s sockets (made on first use, by a socket or a connection).
    pub(crate) fn peer(&self, peer: usize) -> Arc<PeerInbound> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).entry(peer).or_default().clone()
    }

    /// This backend's regions, where frames land.
    pub(crate) fn regions(&self) -> &Regions {
        &self.regions
    }

    /// Whether the listener is stopping (its sockets' ends are then nobody's loss).
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Marks `peer` lost for `why` (the first reason stays).
    pub(crate) fn mark_lost(&self, peer: usize, why: String) {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).entry(peer).or_insert(why);
    }

    /// One of `peer`'s `stripes` sockets ended cleanly: the peer is gone once all have, since
    /// each socket's thread applied everything before its end — a flag still travelling on
    /// another stripe is not lost.
    pub(crate) fn mark_closed(&self, peer: usize, stripes: u16) {
        let all = {
            let mut closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
            let n = closed.entry(peer).or_insert(0);
            *n = n.saturating_add(1);
            *n >= stripes
        };
        if all {
            self.mark_lost(peer, "closed its connection".to_string());
        }
    }
}

/// The listening socket of one backend and everything it spawned; stops and joins them on drop.
pub(crate) struct Listener {
    addr: SocketAddr,
    inbound: Arc<Inbound>,
    accept: Option<JoinHandle<()>>,
}

impl Listener {
    /// Listens on `ip` (any port) for sockets that present `token`.
    pub(crate) fn start(
        ip: std::net::IpAddr,
        token: [u8; 16],
        regions: Arc<Regions>,
        timeout: Duration,
        tending: Tending,
    ) -> Result<Self> {
        // Every lower rank dials all its sockets to this rank at once while communicators are
        // set up: the deepest accept queue the system allows.
        let listener = comm_core::tcp_listener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(format!("bind the tcp transport's listener on {ip}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("tcp listener address", e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("tcp listener non-blocking", e))?;
        let inbound = Arc::new(Inbound {
            token,
            regions,
            timeout,
            tending,
            stop: AtomicBool::new(false),
            handshakes: AtomicUsize::new(0),
            handshaking: Mutex::new(HashMap::new()),
            readers_paused: AtomicBool::new(false),
            peers: Mutex::new(HashMap::new()),
            lost: Mutex::new(HashMap::new()),
            closed: Mutex::new(HashMap::new()),
            sockets: Mutex::new(Vec::new()),
            readers: Readers::default(),
            offered: Mutex::new(HashMap::new()),
        });
        let shared = inbound.clone();
        let accept = std::thread::Builder::new()
            .name("weave-tcp-accept".into())
            .spawn(move || accept_loop(listener, shared))
            .map_err(|e| Error::io("spawn the tcp accept thread", e))?;
        Ok(Listener { addr, inbound, accept: Some(accept) })
    }

    /// Where peers connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state peers' connections report through.
    pub(crate) fn inbound(&self) -> &Arc<Inbound> {
        &self.inbound
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.inbound.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // Handshakes still being read fail at once, and their threads let go of the inbound
        // state (a moment at most: they attach nothing once the listener stops).
        for (_, s) in self.inbound.handshaking.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let settle = comm_core::deadline::Deadline::after(Duration::from_secs(1));
        while self.inbound.handshakes.load(Ordering::Acquire) > 0 && !settle.expired() {
            std::thread::sleep(Duration::from_millis(1));
        }
        for s in self.inbound.sockets.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.inbound.readers.stop();
    }
}

fn accept_loop(listener: TcpListener, inbound: Arc<Inbound>) {
    let mut accepted = 0u64;
    while !inbound.stop.load(Ordering::Acquire) {
        let mut fds = [nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN)];
        if !matches!(nix::poll::poll(&mut fds, ACCEPT_POLL_MS), Ok(n) if n > 0) {
            continue;
        }
        let Ok((socket, _)) = listener.accept() else { continue };
        // Each handshake is read on a thread of its own, so a stranger that sends nothing (or
        // a byte at a time) holds up no rank's socket; it costs one thread for at most one
        // timeout. A wrong token or garbage closes the socket at once.
        if inbound.handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            inbound.handshakes.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        accepted += 1;
        if let Ok(clone) = socket.try_clone() {
            inbound.handshaking.lock().unwrap_or_else(|p| p.into_inner()).insert(accepted, clone);
        }
        let (shared, number) = (inbound.clone(), accepted);
        let spawned =
            std::thread::Builder::new().name("weave-tcp-hello".into()).spawn(move || take_in(socket, number, &shared));
        if spawned.is_err() {
            inbound.handshaking.lock().unwrap_or_else(|p| p.into_inner()).remove(&accepted);
            inbound.handshakes.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads `socket`'s handshake (socket `number` of the accept loop) and, when it is a rank's,
/// reads the socket from now on and offers its writing end (a socket that cannot be prepared
/// is dropped: its peer sees it close).
fn take_in(socket: TcpStream, number: u64, inbound: &Arc<Inbound>) {
    let read = handshake(socket, inbound);
    inbound.handshaking.lock().unwrap_or_else(|p| p.into_inner()).remove(&number);
    if let Ok((socket, hello)) = read
        && !inbound.stopping()
    {
        let rank = hello.rank as usize;
        if let Ok(writer) = inbound.attach(socket, rank, hello.stripe, hello.stripes) {
            inbound.offer(rank, hello.stripe, hello.stripes, writer);
        }
    }
    inbound.handshakes.fetch_sub(1, Ordering::AcqRel);
}

/// Reads and checks a socket's handshake, all of it within the inbound timeout; answers OK.
fn handshake(socket: TcpStream, inbound: &Inbound) -> Result<(TcpStream, Handshake)> {
    let mut socket = socket;
    socket.set_nonblocking(false).map_err(|e| Error::io("tcp socket blocking", e))?;
    let deadline = comm_core::deadline::Deadline::after(inbound.timeout);
    let mut bytes = [0u8; HANDSHAKE_BYTES];
    let mut filled = 0;
    while filled < HANDSHAKE_BYTES {
        // One deadline for the whole handshake: a byte at a time does not extend it.
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(Error::protocol("tcp handshake not complete within the timeout"));
        }
        socket.set_read_timeout(Some(left)).map_err(|e| Error::io("tcp handshake timeout", e))?;
        match socket.read(&mut bytes[filled..]) {
            Ok(0) => return Err(Error::protocol("tcp socket closed during its handshake")),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read a tcp handshake", e)),
        }
    }
    let hello = Handshake::decode(&bytes)?;
    // Compare every byte, so the time taken says nothing about where a guess went wrong.
    if hello.token.iter().zip(inbound.token.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        let _ = socket.shutdown(Shutdown::Both);
        return Err(Error::protocol("tcp handshake with a wrong token (not a rank of this job)"));
    }
    socket.write_all(&[HANDSHAKE_OK]).map_err(|e| Error::io("answer a tcp handshake", e))?;
    socket.set_read_timeout(None).map_err(|e| Error::io("tcp socket timeout", e))?;
    // This rank's frames to the peer go back on this socket; a peer that stops reading them
    // fails the write.
    socket.set_write_timeout(Some(inbound.timeout)).map_err(|e| Error::io("tcp socket write timeout", e))?;
    let _ = socket.set_nodelay(true);
    Ok((socket, hello))
}
