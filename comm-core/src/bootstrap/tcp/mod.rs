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

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::unique_id::{UniqueId, decode_socket_addr, encode_socket_addr};
use super::{Bootstrap, RESERVED_TAG_BASE, TAG_ALL_GATHER, TAG_BARRIER, TAG_BROADCAST};
use crate::config::{Config, Deadline, LogLevel};
use crate::error::{Error, Result};
use crate::wire::{Decoder, Encoder};

/// Version of the bootstrap protocol; every handshake carries it and peers must agree.
const PROTOCOL_VERSION: u16 = 1;
/// Magic of the hello a rank sends to the root.
const ROOT_HELLO_MAGIC: [u8; 4] = *b"WVBH";
/// Magic of the rank table the root sends back.
const RANK_TABLE_MAGIC: [u8; 4] = *b"WVBT";
/// Magic of the hello two non-root ranks exchange when they build their link.
const PEER_HELLO_MAGIC: [u8; 4] = *b"WVBP";

/// Largest hello (root or peer) accepted from a connection that has not yet proven anything.
const MAX_HELLO_LEN: usize = 16 << 10;
/// Longest host identity a rank may announce.
const MAX_HOST_IDENTITY_LEN: usize = 2048;
/// How long an accepted connection may take to send its complete hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most accepted connections whose hello is still arriving; further ones wait in the listen
/// backlog until a slot frees up (hellos of real ranks complete in moments; silent ones are
/// dropped after [`HANDSHAKE_TIMEOUT`]).
const MAX_PENDING_HANDSHAKES: usize = 1024;
/// Longest sleep of the accept loop when nothing happens.
const ACCEPT_POLL_MAX: Duration = Duration::from_millis(5);
/// Longest pause between two attempts to reach the root.
const CONNECT_RETRY_MAX: Duration = Duration::from_millis(200);
/// On drop, how long to wait for peers to close their side too (a clean close on both sides).
const DROP_GRACE: Duration = Duration::from_millis(100);
/// On drop, how long to wait for reader threads after their sockets were shut down.
const DROP_JOIN_LIMIT: Duration = Duration::from_secs(2);
/// Payloads up to this size are copied into one buffer with their frame header (one write).
const SMALL_FRAME_LEN: usize = 64 << 10;
/// Buffer size of each link's reader.
const READ_BUFFER_LEN: usize = 64 << 10;
/// Largest up-front allocation for an incoming payload; larger ones grow as bytes arrive.
const MAX_PREALLOCATION: usize = 1 << 20;

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
            let configure = || -> io::Result<()> {
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
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(&tag.to_le_bytes());
        header[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let written = if data.len() <= SMALL_FRAME_LEN {
            let mut frame = Vec::with_capacity(header.len() + data.len());
            frame.extend_from_slice(&header);
            frame.extend_from_slice(data);
            write_all_until(&writer.stream, &frame, &deadline)
        } else {
            write_all_until(&writer.stream, &header, &deadline)
                .and_then(|()| write_all_until(&writer.stream, data, &deadline))
        };
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

impl std::fmt::Debug for TcpBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpBootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("job_key", &self.job_key)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

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

// ---------------------------------------------------------------------------------------------
// Links and the mailbox.

/// The sending half of one link.
struct Link {
    writer: Mutex<LinkWriter>,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, LinkWriter> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct LinkWriter {
    stream: Arc<TcpStream>,
    /// Set once a send failed; later sends fail at once with this reason.
    broken: Option<String>,
}

/// Messages received from all peers, waiting for `recv`.
struct Mailbox {
    state: Mutex<MailboxState>,
    /// Notified on every delivered message and every lost peer.
    changed: Condvar,
}

struct MailboxState {
    queues: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    /// Per peer: why its link ended, once it has.
    lost: Vec<Option<String>>,
}

impl Mailbox {
    fn new(world_size: usize) -> Self {
        Mailbox {
            state: Mutex::new(MailboxState { queues: HashMap::new(), lost: vec![None; world_size] }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        // Nothing panics while holding this lock; if something did, the state is still
        // consistent (every update is a single push, pop or assignment).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deliver(&self, peer: usize, tag: u64, payload: Vec<u8>) {
        self.lock().queues.entry((peer, tag)).or_default().push_back(payload);
        self.changed.notify_all();
    }

    fn mark_lost(&self, peer: usize, reason: String) {
        if let Some(slot) = self.lock().lost.get_mut(peer) {
            slot.get_or_insert(reason);
        }
        self.changed.notify_all();
    }
}

impl MailboxState {
    fn take(&mut self, peer: usize, tag: u64) -> Option<Vec<u8>> {
        let queue = self.queues.get_mut(&(peer, tag))?;
        let message = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&(peer, tag));
        }
        message
    }
}

/// Reads frames from `peer` into the mailbox until the link ends; returns why it ended.
fn read_frames(stream: Arc<TcpStream>, peer: usize, mailbox: &Mailbox) -> String {
    let mut reader = BufReader::with_capacity(READ_BUFFER_LEN, SharedStream(stream));
    loop {
        let mut tag = [0u8; 8];
        match reader.read_exact(&mut tag) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return "the connection was closed".to_string(),
            Err(e) => return format!("reading from the connection failed: {e}"),
        }
        let mut len = [0u8; 8];
        if let Err(e) = reader.read_exact(&mut len) {
            return format!("the connection ended inside a frame header: {e}");
        }
        let tag = u64::from_le_bytes(tag);
        let len = u64::from_le_bytes(len);
        let Some(len) = usize::try_from(len).ok().filter(|&l| l <= TcpBootstrap::MAX_MESSAGE_LEN) else {
            return format!(
                "protocol error: it announced a {len}-byte message (limit {} bytes)",
                TcpBootstrap::MAX_MESSAGE_LEN
            );
        };
        let mut payload = Vec::with_capacity(len.min(MAX_PREALLOCATION));
        match (&mut reader).take(len as u64).read_to_end(&mut payload) {
            Ok(n) if n == len => mailbox.deliver(peer, tag, payload),
            Ok(n) => return format!("the connection was closed inside a {len}-byte message after {n} bytes"),
            Err(e) => return format!("reading a {len}-byte message failed: {e}"),
        }
    }
}

/// Reads from a socket whose writing side is used elsewhere (`Read` for `&TcpStream`).
struct SharedStream(Arc<TcpStream>);

impl Read for SharedStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self.0).read(buf)
    }
}

// ---------------------------------------------------------------------------------------------
// Blocking I/O with a deadline.

/// Why a bounded read or write did not complete.
enum IoFailure {
    /// The deadline passed.
    TimedOut,
    /// The connection was closed or failed.
    Closed(String),
    /// The other side sent something that is not a valid message.
    Malformed(String),
}

fn is_transient(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted)
}

fn read_exact_until(stream: &mut TcpStream, buf: &mut [u8], deadline: &Deadline) -> Result<(), IoFailure> {
    let mut filled = 0;
    while filled < buf.len() {
        let remaining = deadline.remaining();
        if remaining.is_zero() {
            return Err(IoFailure::TimedOut);
        }
        stream.set_read_timeout(Some(remaining)).map_err(|e| IoFailure::Closed(e.to_string()))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(IoFailure::Closed("the connection was closed".to_string())),
            Ok(n) => filled += n,
            Err(e) if is_transient(&e) => {}
            Err(e) => return Err(IoFailure::Closed(e.to_string())),
        }
    }
    Ok(())
}

fn write_all_until(stream: &TcpStream, bytes: &[u8], deadline: &Deadline) -> Result<(), IoFailure> {
    let mut written = 0;
    let mut stream = stream;
    while written < bytes.len() {
        let remaining = deadline.remaining();
        if remaining.is_zero() {
            return Err(IoFailure::TimedOut);
        }
        stream.set_write_timeout(Some(remaining)).map_err(|e| IoFailure::Closed(e.to_string()))?;
        match stream.write(&bytes[written..]) {
            Ok(0) => return Err(IoFailure::Closed("the connection accepts no more data".to_string())),
            Ok(n) => written += n,
            Err(e) if is_transient(&e) => {}
            Err(e) => return Err(IoFailure::Closed(e.to_string())),
        }
    }
    Ok(())
}

/// Writes one handshake message: `u32` length, then the message.
fn write_handshake(stream: &TcpStream, message: &[u8], deadline: &Deadline) -> Result<(), IoFailure> {
    let len = u32::try_from(message.len()).map_err(|_| IoFailure::Malformed("handshake message too long".into()))?;
    let mut framed = Vec::with_capacity(4 + message.len());
    framed.extend_from_slice(&len.to_le_bytes());
    framed.extend_from_slice(message);
    write_all_until(stream, &framed, deadline)
}

/// Reads one handshake message of at most `max_len` bytes. Reads exactly its bytes and no
/// more, so frames that follow stay in the socket for the link's reader.
fn read_handshake(stream: &mut TcpStream, max_len: usize, deadline: &Deadline) -> Result<Vec<u8>, IoFailure> {
    let mut prefix = [0u8; 4];
    read_exact_until(stream, &mut prefix, deadline)?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 || len > max_len {
        return Err(IoFailure::Malformed(format!("announced a {len}-byte handshake message (limit {max_len})")));
    }
    let mut message = vec![0u8; len];
    read_exact_until(stream, &mut message, deadline)?;
    Ok(message)
}

// ---------------------------------------------------------------------------------------------
// Accepting connections from ranks and strangers alike.

/// An accepted connection whose hello is still arriving (non-blocking).
struct PendingHandshake {
    stream: TcpStream,
    from: SocketAddr,
    prefix: [u8; 4],
    prefix_filled: usize,
    body: Vec<u8>,
    body_filled: usize,
    accepted_at: Instant,
}

enum Progress {
    Complete(Vec<u8>),
    Waiting,
    Failed(String),
}

impl PendingHandshake {
    fn progress(&mut self, max_len: usize) -> Progress {
        loop {
            let reading_prefix = self.prefix_filled < self.prefix.len();
            if !reading_prefix && self.body_filled == self.body.len() {
                return Progress::Complete(std::mem::take(&mut self.body));
            }
            let read = if reading_prefix {
                self.stream.read(&mut self.prefix[self.prefix_filled..])
            } else {
                self.stream.read(&mut self.body[self.body_filled..])
            };
            match read {
                Ok(0) => return Progress::Failed("it closed the connection before completing its hello".into()),
                Ok(n) if reading_prefix => {
                    self.prefix_filled += n;
                    if self.prefix_filled == self.prefix.len() {
                        let len = u32::from_le_bytes(self.prefix) as usize;
                        if len == 0 || len > max_len {
                            return Progress::Failed(format!(
                                "it announced a {len}-byte hello (limit {max_len}); not a weave bootstrap peer"
                            ));
                        }
                        self.body = vec![0u8; len];
                    }
                }
                Ok(n) => self.body_filled += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Progress::Waiting,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Progress::Failed(format!("reading its hello failed: {e}")),
            }
        }
    }
}

/// Accepts connections on a listener and reads one hello from each, without letting a slow or
/// silent connection hold up the others.
struct Acceptor<'a> {
    listener: &'a TcpListener,
    pending: Vec<PendingHandshake>,
    rank: usize,
    warn: bool,
}

/// A connection that sent a complete hello (not yet checked).
struct Incoming {
    stream: TcpStream,
    from: SocketAddr,
    hello: Vec<u8>,
}

impl<'a> Acceptor<'a> {
    fn new(listener: &'a TcpListener, rank: usize, warn: bool) -> Result<Self> {
        listener.set_nonblocking(true).map_err(|e| Error::io("make the bootstrap listener non-blocking", e))?;
        Ok(Acceptor { listener, pending: Vec::new(), rank, warn })
    }

    /// Logs why a connection is closed (when warnings are on).
    fn refuse(&self, from: SocketAddr, reason: &str) {
        if self.warn {
            eprintln!("weave: warning: bootstrap rank {} refused a connection from {from}: {reason}", self.rank);
        }
    }

    /// The next connection with a complete hello, or `None` once `deadline` has passed.
    fn next(&mut self, deadline: &Deadline) -> Result<Option<Incoming>> {
        let mut idle_sleep = Duration::from_micros(200);
        loop {
            let mut progressed = false;
            while self.pending.len() < MAX_PENDING_HANDSHAKES {
                match self.listener.accept() {
                    Ok((stream, from)) => {
                        progressed = true;
                        if let Err(e) = stream.set_nonblocking(true) {
                            self.refuse(from, &format!("could not make its socket non-blocking: {e}"));
                        } else {
                            self.pending.push(PendingHandshake {
                                stream,
                                from,
                                prefix: [0; 4],
                                prefix_filled: 0,
                                body: Vec::new(),
                                body_filled: 0,
                                accepted_at: Instant::now(),
                            });
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted) => {}
                    Err(e) => return Err(Error::io("accept a bootstrap connection", e)),
                }
            }
            let mut index = 0;
            while index < self.pending.len() {
                match self.pending[index].progress(MAX_HELLO_LEN) {
                    Progress::Complete(hello) => {
                        let done = self.pending.swap_remove(index);
                        if let Err(e) = done.stream.set_nonblocking(false) {
                            self.refuse(done.from, &format!("could not make its socket blocking: {e}"));
                            progressed = true;
                            continue;
                        }
                        return Ok(Some(Incoming { stream: done.stream, from: done.from, hello }));
                    }
                    Progress::Failed(reason) => {
                        let failed = self.pending.swap_remove(index);
                        self.refuse(failed.from, &reason);
                        progressed = true;
                    }
                    Progress::Waiting if self.pending[index].accepted_at.elapsed() >= HANDSHAKE_TIMEOUT => {
                        let silent = self.pending.swap_remove(index);
                        self.refuse(silent.from, &format!("it sent no complete hello within {HANDSHAKE_TIMEOUT:?}"));
                        progressed = true;
                    }
                    Progress::Waiting => index += 1,
                }
            }
            if deadline.expired() {
                return Ok(None);
            }
            if progressed {
                idle_sleep = Duration::from_micros(200);
            } else {
                std::thread::sleep(idle_sleep.min(deadline.remaining()));
                idle_sleep = (idle_sleep * 2).min(ACCEPT_POLL_MAX);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rendezvous.

/// What the rank table says about one rank.
struct RankEntry {
    listen_addr: SocketAddr,
    host: String,
}

/// One rank's part of the rendezvous.
struct Rendezvous<'a> {
    id: &'a UniqueId,
    rank: usize,
    world_size: usize,
    deadline: Deadline,
    warn: bool,
    host: String,
}

/// Connected streams indexed by peer (`None` at the own rank) and host identities by rank.
type Mesh = (Vec<Option<TcpStream>>, Vec<String>);

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
    fn as_root(&self) -> Result<Mesh> {
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
    fn as_member(&self) -> Result<Mesh> {
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

/// Binds the listener of a non-root rank: on the root's own address if that is loopback, else on
/// the local address the system would use to reach the root; port 0.
fn bind_member_listener(root: SocketAddr) -> Result<TcpListener> {
    let local = if root.ip().is_loopback() {
        SocketAddr::new(root.ip(), 0)
    } else {
        let unspecified: IpAddr = match root {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        // Connecting a UDP socket sends nothing; it only asks the routing table for the
        // source address towards the root.
        let probe = UdpSocket::bind(SocketAddr::new(unspecified, 0))
            .and_then(|socket| socket.connect(root).map(|()| socket))
            .and_then(|socket| socket.local_addr())
            .map_err(|e| Error::io(format!("find the local interface that routes to the bootstrap root {root}"), e))?;
        let mut local = probe;
        local.set_port(0);
        local
    };
    TcpListener::bind(local).map_err(|e| Error::io(format!("bind the bootstrap listener on {local}"), e))
}

/// This rank's host identity (`WEAVE_HOST_ID` or `hostname/boot-id`, see [`crate::host`]); a
/// malformed `WEAVE_HOST_ID` is reported by whoever builds the Config, here it falls back.
fn local_host_identity() -> String {
    crate::host::host_identity(crate::config::host_id_from_env().ok().flatten().as_deref())
}

// ---------------------------------------------------------------------------------------------
// Handshake messages.

/// Reads the secret field and checks it against the job's.
fn check_secret(decoder: &mut Decoder<'_>, id: &UniqueId) -> Result<()> {
    let secret = decoder.raw::<16>()?;
    if !id.secret_matches(&secret) {
        return Err(Error::protocol("wrong job secret (a process of another job, or a stray connection)"));
    }
    Ok(())
}

fn check_world_size(decoder: &mut Decoder<'_>, world_size: usize) -> Result<()> {
    let theirs = decoder.usize()?;
    if theirs != world_size {
        return Err(Error::protocol(format!("world size {theirs} differs from this job's {world_size}")));
    }
    Ok(())
}

fn encode_root_hello(id: &UniqueId, rank: usize, world_size: usize, listen_addr: SocketAddr, host: &str) -> Vec<u8> {
    let mut encoder = Encoder::new(ROOT_HELLO_MAGIC, PROTOCOL_VERSION);
    encoder.raw(&id.secret).usize(rank).usize(world_size);
    encode_socket_addr(&mut encoder, &listen_addr);
    encoder.str(host).finish()
}

/// Checks a root hello; returns the rank and what it announced.
fn decode_root_hello(bytes: &[u8], id: &UniqueId, world_size: usize) -> Result<(usize, RankEntry)> {
    let mut decoder = Decoder::new(bytes, ROOT_HELLO_MAGIC, PROTOCOL_VERSION, "bootstrap hello")?;
    check_secret(&mut decoder, id)?;
    let rank = decoder.usize()?;
    check_world_size(&mut decoder, world_size)?;
    if rank == 0 || rank >= world_size {
        return Err(Error::protocol(format!("rank {rank} cannot join a {world_size}-rank job at its root")));
    }
    let listen_addr = decode_socket_addr(&mut decoder)?;
    let host = decoder.str()?;
    if host.len() > MAX_HOST_IDENTITY_LEN {
        return Err(Error::protocol(format!("host identity of {} bytes is too long", host.len())));
    }
    let host = host.to_string();
    decoder.finish()?;
    Ok((rank, RankEntry { listen_addr, host }))
}

fn encode_rank_table(id: &UniqueId, entries: &[RankEntry]) -> Vec<u8> {
    let mut encoder = Encoder::new(RANK_TABLE_MAGIC, PROTOCOL_VERSION);
    encoder.raw(&id.secret).usize(entries.len());
    for entry in entries {
        encode_socket_addr(&mut encoder, &entry.listen_addr);
        encoder.str(&entry.host);
    }
    encoder.finish()
}

fn decode_rank_table(bytes: &[u8], id: &UniqueId, world_size: usize) -> Result<Vec<RankEntry>> {
    let mut decoder = Decoder::new(bytes, RANK_TABLE_MAGIC, PROTOCOL_VERSION, "bootstrap rank table")?;
    check_secret(&mut decoder, id)?;
    check_world_size(&mut decoder, world_size)?;
    let mut entries = Vec::with_capacity(world_size);
    for _ in 0..world_size {
        let listen_addr = decode_socket_addr(&mut decoder)?;
        let host = decoder.str()?.to_string();
        entries.push(RankEntry { listen_addr, host });
    }
    decoder.finish()?;
    Ok(entries)
}

fn encode_peer_hello(id: &UniqueId, from: usize, to: usize, world_size: usize) -> Vec<u8> {
    Encoder::new(PEER_HELLO_MAGIC, PROTOCOL_VERSION).raw(&id.secret).usize(from).usize(to).usize(world_size).finish()
}

/// Checks a peer hello addressed to `me`; returns the sender's rank (in range, not `me`).
fn decode_peer_hello(bytes: &[u8], id: &UniqueId, world_size: usize, me: usize) -> Result<usize> {
    let mut decoder = Decoder::new(bytes, PEER_HELLO_MAGIC, PROTOCOL_VERSION, "bootstrap peer hello")?;
    check_secret(&mut decoder, id)?;
    let from = decoder.usize()?;
    let to = decoder.usize()?;
    check_world_size(&mut decoder, world_size)?;
    decoder.finish()?;
    if to != me {
        return Err(Error::protocol(format!("the hello is addressed to rank {to}, this is rank {me}")));
    }
    if from >= world_size || from == me {
        return Err(Error::protocol(format!("sender rank {from} is not another rank of a {world_size}-rank job")));
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;

    const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn new_id() -> UniqueId {
        UniqueId::on_free_port(LOCALHOST).unwrap()
    }

    /// Runs `body` on `world_size` ranks (threads) of one job and returns their results by rank.
    fn run_job<T: Send>(world_size: usize, timeout: Duration, body: impl Fn(TcpBootstrap) -> T + Sync) -> Vec<T> {
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

    /// Everything a job of any size must do right.
    fn exercise(b: &TcpBootstrap) {
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
    fn rendezvous_times_out_naming_a_missing_rank() {
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        let root = TcpBootstrap::new(&new_id(), 0, 3, timeout);
        assert!(matches!(root, Err(Error::Timeout { peer: Some(1), .. })), "{root:?}");
        let member = TcpBootstrap::new(&new_id(), 2, 3, timeout);
        assert!(matches!(member, Err(Error::Timeout { peer: Some(0), .. })), "{member:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
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

    #[test]
    fn handshake_messages_reject_garbage() {
        let id = UniqueId::with_secret("127.0.0.1:1".parse().unwrap(), [3; 16]);
        let hello = encode_root_hello(&id, 2, 4, "10.0.0.1:5".parse().unwrap(), "host/boot");
        let (rank, entry) = decode_root_hello(&hello, &id, 4).unwrap();
        assert_eq!((rank, entry.listen_addr, entry.host.as_str()), (2, "10.0.0.1:5".parse().unwrap(), "host/boot"));
        for cut in 0..hello.len() {
            assert!(matches!(decode_root_hello(&hello[..cut], &id, 4), Err(Error::Protocol(_))), "cut {cut}");
        }
        assert!(decode_root_hello(&hello, &id, 5).is_err(), "world size differs");
        assert!(decode_root_hello(&encode_root_hello(&id, 0, 4, id.addr, "h"), &id, 4).is_err(), "rank 0");
        assert!(decode_root_hello(&encode_root_hello(&id, 4, 4, id.addr, "h"), &id, 4).is_err(), "rank too big");
        let stranger = UniqueId::with_secret(id.addr, [4; 16]);
        assert!(decode_root_hello(&encode_root_hello(&stranger, 1, 4, id.addr, "h"), &id, 4).is_err());

        let peer = encode_peer_hello(&id, 3, 1, 4);
        assert_eq!(decode_peer_hello(&peer, &id, 4, 1).unwrap(), 3);
        assert!(decode_peer_hello(&peer, &id, 4, 2).is_err(), "addressed to another rank");
        assert!(decode_peer_hello(&peer, &stranger, 4, 1).is_err(), "wrong secret");
        assert!(decode_peer_hello(&encode_peer_hello(&id, 1, 1, 4), &id, 4, 1).is_err(), "from itself");
        assert!(decode_peer_hello(&encode_peer_hello(&id, 9, 1, 4), &id, 4, 1).is_err(), "from out of range");

        let entries = vec![
            RankEntry { listen_addr: id.addr, host: "a".into() },
            RankEntry { listen_addr: "[::1]:9".parse().unwrap(), host: "b".into() },
        ];
        let table = encode_rank_table(&id, &entries);
        let decoded = decode_rank_table(&table, &id, 2).unwrap();
        assert_eq!(decoded[1].listen_addr, entries[1].listen_addr);
        assert_eq!(decoded[1].host, "b");
        assert!(decode_rank_table(&table, &id, 3).is_err());
        assert!(decode_rank_table(&table, &stranger, 2).is_err());
        for cut in 0..table.len() {
            assert!(decode_rank_table(&table[..cut], &id, 2).is_err(), "cut {cut}");
        }
    }

    #[test]
    fn a_corrupt_frame_marks_the_peer_lost() {
        let listener = TcpListener::bind((LOCALHOST, 0)).unwrap();
        let mut writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (reader, _) = listener.accept().unwrap();
        let mailbox = Mailbox::new(2);
        let mut frame = 5u64.to_le_bytes().to_vec();
        frame.extend_from_slice(&3u64.to_le_bytes());
        frame.extend_from_slice(b"abc");
        frame.extend_from_slice(&6u64.to_le_bytes());
        frame.extend_from_slice(&u64::MAX.to_le_bytes());
        writer.write_all(&frame).unwrap();
        let reason = read_frames(Arc::new(reader), 1, &mailbox);
        assert!(reason.contains("protocol error"), "{reason}");
        assert_eq!(mailbox.lock().take(1, 5).unwrap(), b"abc");
    }
}
