//! The one thread per rank that does all reading: it waits with `poll(2)` on the rank's
//! listener, every link and every link being opened, and a wake-up socket for commands.
//!
//! * Links: frames (tag `u64`, length `u64`, payload) are read as bytes arrive, without
//!   blocking, and filed into the mailbox; a link that ends or sends a malformed frame marks its
//!   peer lost.
//! * Links opened to this rank: the connection must send a *peer hello* (job secret, protocol
//!   version, sender, receiver, world size) within [`HANDSHAKE_TIMEOUT`]; it is answered with
//!   one and becomes a link, or is refused (closed, with a warning) — a stranger, a wrong secret
//!   or version, a late rendezvous hello.
//! * Links this rank opens ([`Command::Connect`]): a non-blocking connect, the peer hello, the
//!   answer, each bounded by the command's deadline. A refused connection or answer marks the
//!   peer lost (every rank listens until it drops its bootstrap); a timeout is reported in
//!   `connect_failed`.
//! * [`Command::Stop`]: everything is closed and the thread ends.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::TcpBootstrap;
use super::io::{HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES};
use super::links::{Command, Link, Shared};
use super::messages::{MAX_HELLO_LEN, ROOT_HELLO_MAGIC, decode_peer_hello, encode_peer_hello};
use crate::bootstrap::{TAG_NOTICE, UniqueId};
use crate::deadline::Deadline;
use crate::diagnostics;
use crate::tcp_bounded::start_connect;

/// Bound on writing a notice queued for a link when the link opens.
const NOTICE_WRITE: Duration = Duration::from_millis(200);
/// Longest sleep in `poll(2)` (commands and readiness wake it earlier).
const POLL_MAX: Duration = Duration::from_millis(250);
/// Size of the read buffer (one per poller).
const READ_BUFFER_LEN: usize = 64 << 10;
/// Reads of one link per wake-up, so a fast sender does not starve the others.
const READS_PER_WAKE: usize = 8;
/// Largest up-front allocation for an incoming payload; larger ones grow as bytes arrive.
const MAX_PREALLOCATION: usize = 1 << 20;

/// What the poller needs to know of its rank.
pub(super) struct PollerSetup {
    /// The job's id (its secret opens every link).
    pub(super) id: UniqueId,
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) listener: TcpListener,
    /// The reading end of the wake-up pair.
    pub(super) wake: UnixStream,
    pub(super) shared: Arc<Shared>,
}

/// Starts the poller thread of `setup.rank`.
pub(super) fn spawn(setup: PollerSetup) -> std::io::Result<std::thread::JoinHandle<()>> {
    setup.listener.set_nonblocking(true)?;
    setup.wake.set_nonblocking(true)?;
    let name = format!("weave-bootstrap-{}", setup.rank);
    let mut poller = Poller {
        setup,
        links: Vec::new(),
        handshakes: Vec::new(),
        buffer: vec![0; READ_BUFFER_LEN].into_boxed_slice(),
    };
    std::thread::Builder::new().name(name).spawn(move || poller.run())
}

struct Poller {
    setup: PollerSetup,
    links: Vec<(Arc<Link>, FrameReader)>,
    handshakes: Vec<Handshake>,
    buffer: Box<[u8]>,
}

impl Poller {
    fn run(&mut self) {
        while self.turn() {}
        // Closing: the poller's references go now, the shared state's with it.
        self.handshakes.clear();
        self.links.clear();
        let mut state = self.setup.shared.lock();
        state.links.clear();
        state.senders.clear();
        state.connecting.clear();
        state.stopped = true;
        drop(state);
        self.setup.shared.changed.notify_all();
    }

    /// One wait and what follows it; false once told to stop.
    fn turn(&mut self) -> bool {
        let accepting = self.handshakes.len() < MAX_PENDING_HANDSHAKES;
        let wait = self.handshakes.iter().map(|h| h.deadline.next_wait()).fold(POLL_MAX, Duration::min);
        let ready: Vec<bool> = {
            let mut fds = Vec::with_capacity(2 + self.links.len() + self.handshakes.len());
            fds.push(PollFd::new(self.setup.wake.as_fd(), PollFlags::POLLIN));
            let listen = if accepting { PollFlags::POLLIN } else { PollFlags::empty() };
            fds.push(PollFd::new(self.setup.listener.as_fd(), listen));
            fds.extend(self.links.iter().map(|(l, _)| PollFd::new(l.stream.as_fd(), PollFlags::POLLIN)));
            fds.extend(self.handshakes.iter().map(|h| PollFd::new(h.stream.as_fd(), h.interest())));
            // Errors (EINTR) are a wake-up like any other: everything below is non-blocking.
            let _ = poll(&mut fds, PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX));
            fds.iter().map(|fd| fd.any().unwrap_or(false)).collect()
        };
        if ready[0] && !self.take_commands() {
            return false;
        }
        if ready[1] {
            self.accept();
        }
        let link_ready = &ready[2..2 + self.links.len()];
        let readable: Vec<usize> = (0..self.links.len()).filter(|&i| link_ready[i]).collect();
        for index in readable.into_iter().rev() {
            self.read_link(index);
        }
        self.progress_handshakes();
        true
    }

    /// Drains the wake-up socket and carries out the commands; false on [`Command::Stop`].
    fn take_commands(&mut self) -> bool {
        let mut sink = [0u8; 64];
        while matches!((&self.setup.wake).read(&mut sink), Ok(n) if n > 0) {}
        let commands = std::mem::take(&mut self.setup.shared.lock().commands);
        for command in commands {
            match command {
                Command::Stop => return false,
                Command::Connect { peer, addr, deadline } => match start_connect(addr) {
                    Ok(stream) => {
                        let hello = encode_peer_hello(&self.setup.id, self.setup.rank, peer, self.setup.world_size);
                        self.handshakes.push(Handshake::outbound(stream, addr, peer, hello, deadline));
                    }
                    Err(e) => self.link_failed(peer, false, format!("connecting to {addr} failed: {e}")),
                },
            }
        }
        true
    }

    fn accept(&mut self) {
        while self.handshakes.len() < MAX_PENDING_HANDSHAKES {
            match self.setup.listener.accept() {
                Ok((stream, from)) => match stream.set_nonblocking(true) {
                    Ok(()) => self.handshakes.push(Handshake::inbound(stream, from)),
                    Err(e) => self.refuse(from, &format!("could not make its socket non-blocking: {e}")),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                // Interrupted, aborted before accept, out of descriptors (the next turn retries).
                Err(_) => return,
            }
        }
    }

    fn refuse(&self, from: SocketAddr, reason: &str) {
        let rank = self.setup.rank;
        tracing::warn!(target: crate::diagnostics::BOOTSTRAP, rank, %from, "bootstrap rank {rank} refused a connection from {from}: {reason}");
    }

    /// Reads what link `index` has; on its end, forgets it and marks its peer lost.
    fn read_link(&mut self, index: usize) {
        let (link, reader) = &mut self.links[index];
        let shared = &self.setup.shared;
        let mut ended = None;
        for _ in 0..READS_PER_WAKE {
            match (&link.stream).read(&mut self.buffer) {
                Ok(0) => {
                    ended = Some(reader.end_reason());
                    break;
                }
                Ok(n) => {
                    if let Err(reason) = reader.consume(&self.buffer[..n], |tag, payload| {
                        shared.deliver(link.peer, tag, payload);
                    }) {
                        ended = Some(reason);
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    ended = Some(format!("reading from the connection failed: {e}"));
                    break;
                }
            }
        }
        if let Some(reason) = ended {
            let (link, _) = self.links.swap_remove(index);
            let mut state = shared.lock();
            state.mark_lost(link.peer, reason);
            state.remove_link(&link);
            drop(state);
            shared.changed.notify_all();
        }
    }

    fn progress_handshakes(&mut self) {
        let mut index = 0;
        while index < self.handshakes.len() {
            let step = self.handshakes[index].progress(&self.setup);
            match step {
                Step::Waiting if self.handshakes[index].deadline.expired() => {
                    let h = self.handshakes.swap_remove(index);
                    match h.outbound {
                        Some(peer) => self.link_failed(peer, true, "no answer within the timeout".into()),
                        None => self.refuse(h.from, &format!("it sent no complete hello within {HANDSHAKE_TIMEOUT:?}")),
                    }
                }
                Step::Waiting => index += 1,
                Step::Failed(reason) => {
                    let h = self.handshakes.swap_remove(index);
                    match h.outbound {
                        Some(peer) => self.link_failed(peer, false, format!("{} ({reason})", h.from)),
                        None => self.refuse(h.from, &reason),
                    }
                }
                Step::Established(peer) => {
                    let h = self.handshakes.swap_remove(index);
                    // Only affects latency; a failure changes nothing else.
                    let _ = h.stream.set_nodelay(true);
                    let link = Arc::new(Link::new(peer, h.stream));
                    self.links.push((Arc::clone(&link), FrameReader::default()));
                    let notices = {
                        let mut state = self.setup.shared.lock();
                        state.add_link(Arc::clone(&link));
                        state.pending_notices.remove(&peer).unwrap_or_default()
                    };
                    self.setup.shared.changed.notify_all();
                    // Small frames into a new socket's empty buffer: they do not block.
                    for notice in notices {
                        if link.write_frame(TAG_NOTICE, &notice, &Deadline::after(NOTICE_WRITE)).is_err() {
                            tracing::debug!(target: diagnostics::BOOTSTRAP, peer, "a queued notice was not sent: the link broke");
                        }
                    }
                }
            }
        }
    }

    /// An attempt to open a link to `peer` failed: a timeout is reported to whoever waits for
    /// the link, anything else means the peer no longer listens: it is lost.
    fn link_failed(&self, peer: usize, timed_out: bool, reason: String) {
        let mut state = self.setup.shared.lock();
        state.connecting.remove(&peer);
        if let Some(dropped) = state.pending_notices.remove(&peer) {
            tracing::debug!(target: diagnostics::BOOTSTRAP, peer, "{} notice(s) dropped: {reason}", dropped.len());
        }
        if timed_out {
            state.connect_failed.insert(peer, format!("opening a bootstrap link timed out: {reason}"));
        } else {
            state.mark_lost(peer, format!("opening a bootstrap link to it failed: {reason}"));
        }
        drop(state);
        self.setup.shared.changed.notify_all();
    }
}

/// Where a link being opened stands.
enum Step {
    Waiting,
    Failed(String),
    /// The link to this peer stands.
    Established(usize),
}

/// A link being opened, in either direction: connect (outbound), write the hello or answer,
/// read the answer or hello — all without blocking.
struct Handshake {
    stream: TcpStream,
    from: SocketAddr,
    /// The peer this rank connects to; `None` for a connection made to this rank.
    outbound: Option<usize>,
    connecting: bool,
    /// To write: the hello (outbound) or the answer (inbound).
    out: Vec<u8>,
    written: usize,
    /// Whether a hello or answer is still to be read.
    reading: bool,
    prefix: [u8; 4],
    prefix_filled: usize,
    body: Vec<u8>,
    body_filled: usize,
    /// The peer, once its hello was checked (inbound).
    peer: Option<usize>,
    deadline: Deadline,
}

impl Handshake {
    fn inbound(stream: TcpStream, from: SocketAddr) -> Self {
        Handshake {
            stream,
            from,
            outbound: None,
            connecting: false,
            out: Vec::new(),
            written: 0,
            reading: true,
            prefix: [0; 4],
            prefix_filled: 0,
            body: Vec::new(),
            body_filled: 0,
            peer: None,
            deadline: Deadline::after(HANDSHAKE_TIMEOUT),
        }
    }

    fn outbound(stream: TcpStream, addr: SocketAddr, peer: usize, hello: Vec<u8>, deadline: Deadline) -> Self {
        let mut framed = (hello.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&hello);
        Handshake {
            outbound: Some(peer),
            connecting: true,
            out: framed,
            reading: false,
            deadline,
            ..Handshake::inbound(stream, addr)
        }
    }

    fn interest(&self) -> PollFlags {
        if self.connecting || self.written < self.out.len() { PollFlags::POLLOUT } else { PollFlags::POLLIN }
    }

    fn progress(&mut self, setup: &PollerSetup) -> Step {
        loop {
            if self.connecting {
                match self.stream.take_error() {
                    Ok(Some(e)) | Err(e) => return Step::Failed(format!("connecting failed: {e}")),
                    Ok(None) => {}
                }
                match self.stream.peer_addr() {
                    Ok(_) => self.connecting = false,
                    Err(e) if e.kind() == ErrorKind::NotConnected => return Step::Waiting,
                    Err(e) => return Step::Failed(format!("connecting failed: {e}")),
                }
            }
            if self.written < self.out.len() {
                match (&self.stream).write(&self.out[self.written..]) {
                    Ok(0) => return Step::Failed("the connection accepts no data".into()),
                    Ok(n) => self.written += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Waiting,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Step::Failed(format!("writing the hello failed: {e}")),
                }
                continue;
            }
            if !self.reading {
                match (self.outbound, self.peer) {
                    // Outbound: the hello is out, now the answer.
                    (Some(_), None) => self.reading = true,
                    (_, Some(peer)) => return Step::Established(peer),
                    (None, None) => return Step::Failed("internal: an inbound link without a peer".into()),
                }
                continue;
            }
            let body = match self.read_message() {
                Ok(Some(body)) => body,
                Ok(None) => return Step::Waiting,
                Err(reason) => return Step::Failed(reason),
            };
            self.reading = false;
            let PollerSetup { id, rank, world_size, .. } = setup;
            match (self.outbound, decode_peer_hello(&body, id, *world_size, *rank)) {
                (Some(peer), Ok(from)) if from == peer => self.peer = Some(peer),
                (Some(_), Ok(from)) => return Step::Failed(format!("it answered as rank {from}")),
                (Some(_), Err(e)) => return Step::Failed(format!("its answer was refused: {e}")),
                (None, Ok(from)) => {
                    self.peer = Some(from);
                    let answer = encode_peer_hello(id, *rank, from, *world_size);
                    self.out = (answer.len() as u32).to_le_bytes().to_vec();
                    self.out.extend_from_slice(&answer);
                    self.written = 0;
                }
                (None, Err(_)) if body.starts_with(&ROOT_HELLO_MAGIC) => {
                    return Step::Failed(
                        "it sent a rendezvous hello after the rendezvous ended (a late or duplicate rank?)".into(),
                    );
                }
                (None, Err(e)) => return Step::Failed(e.to_string()),
            }
        }
    }

    /// Reads the length-prefixed hello or answer: the body once complete, `None` while bytes are
    /// still to come.
    fn read_message(&mut self) -> Result<Option<Vec<u8>>, String> {
        loop {
            let in_prefix = self.prefix_filled < self.prefix.len();
            if !in_prefix && self.body_filled == self.body.len() {
                return Ok(Some(std::mem::take(&mut self.body)));
            }
            let read = if in_prefix {
                (&self.stream).read(&mut self.prefix[self.prefix_filled..])
            } else {
                (&self.stream).read(&mut self.body[self.body_filled..])
            };
            match read {
                Ok(0) => return Err("it closed the connection before completing its hello".into()),
                Ok(n) if in_prefix => {
                    self.prefix_filled += n;
                    if self.prefix_filled == self.prefix.len() {
                        let len = u32::from_le_bytes(self.prefix) as usize;
                        if len == 0 || len > MAX_HELLO_LEN {
                            return Err(format!(
                                "it announced a {len}-byte hello (limit {MAX_HELLO_LEN}); not a weave bootstrap peer"
                            ));
                        }
                        self.body = vec![0; len];
                    }
                }
                Ok(n) => self.body_filled += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading its hello failed: {e}")),
            }
        }
    }
}

/// Turns the bytes of one link into frames (tag `u64`, length `u64`, payload).
#[derive(Default)]
pub(super) struct FrameReader {
    header: [u8; 16],
    header_filled: usize,
    /// The frame whose payload is arriving: tag, length, bytes so far.
    payload: Option<(u64, usize, Vec<u8>)>,
}

impl FrameReader {
    /// Consumes `input`, handing every completed frame to `deliver`; `Err` says why the link
    /// cannot go on (an announced length over [`TcpBootstrap::MAX_MESSAGE_LEN`]).
    pub(super) fn consume(&mut self, mut input: &[u8], mut deliver: impl FnMut(u64, Vec<u8>)) -> Result<(), String> {
        while !input.is_empty() {
            match &mut self.payload {
                None => {
                    let take = (self.header.len() - self.header_filled).min(input.len());
                    self.header[self.header_filled..self.header_filled + take].copy_from_slice(&input[..take]);
                    self.header_filled += take;
                    input = &input[take..];
                    if self.header_filled < self.header.len() {
                        continue;
                    }
                    self.header_filled = 0;
                    let [tag, len] = [0, 8].map(|at| {
                        let mut word = [0u8; 8];
                        word.copy_from_slice(&self.header[at..at + 8]);
                        u64::from_le_bytes(word)
                    });
                    let Some(len) = usize::try_from(len).ok().filter(|&l| l <= TcpBootstrap::MAX_MESSAGE_LEN) else {
                        return Err(format!(
                            "protocol error: it announced a {len}-byte message (limit {} bytes)",
                            TcpBootstrap::MAX_MESSAGE_LEN
                        ));
                    };
                    if len == 0 {
                        deliver(tag, Vec::new());
                    } else {
                        self.payload = Some((tag, len, Vec::with_capacity(len.min(MAX_PREALLOCATION))));
                    }
                }
                Some((_, len, bytes)) => {
                    let take = (*len - bytes.len()).min(input.len());
                    bytes.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if let Some((tag, _, bytes)) = self.payload.take_if(|(_, len, bytes)| bytes.len() == *len) {
                        deliver(tag, bytes);
                    }
                }
            }
        }
        Ok(())
    }

    /// Why the link ended when its stream did.
    pub(super) fn end_reason(&self) -> String {
        match &self.payload {
            Some((_, len, bytes)) => {
                format!("the connection was closed inside a {len}-byte message after {} bytes", bytes.len())
            }
            None if self.header_filled > 0 => "the connection ended inside a frame header".into(),
            None => "the connection was closed".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_anywhere_arrive_whole_and_a_huge_length_ends_the_link() {
        let mut stream = Vec::new();
        for (tag, payload) in [(5u64, &b"abc"[..]), (6, b""), (7, b"0123456789")] {
            stream.extend_from_slice(&tag.to_le_bytes());
            stream.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            stream.extend_from_slice(payload);
        }
        for chunk in [1, 2, 3, 7, 16, 17, stream.len()] {
            let mut reader = FrameReader::default();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                reader.consume(piece, |tag, payload| got.push((tag, payload))).unwrap();
            }
            assert_eq!(got, vec![(5, b"abc".to_vec()), (6, Vec::new()), (7, b"0123456789".to_vec())], "{chunk}");
            assert_eq!(reader.end_reason(), "the connection was closed");
        }
        let mut reader = FrameReader::default();
        let mut header = 9u64.to_le_bytes().to_vec();
        header.extend_from_slice(&u64::MAX.to_le_bytes());
        let ended = reader.consume(&header, |_, _| panic!("nothing to deliver"));
        assert!(ended.is_err_and(|reason| reason.contains("protocol error")));
        let mut cut = FrameReader::default();
        cut.consume(&stream[..18], |_, _| {}).unwrap();
        assert!(cut.end_reason().contains("inside a 3-byte message"), "{}", cut.end_reason());
    }
}
