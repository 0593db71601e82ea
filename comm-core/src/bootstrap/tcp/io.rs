//! What the rendezvous of the TCP bootstrap does with sockets, before the poller takes over
//! (connecting and bounded reads and writes are [`tcp_bounded`](crate::tcp_bounded)'s): the
//! length-prefixed handshake messages, the [`Acceptor`] with which a root reads
//! one hello from every accepted connection without letting a slow or silent one hold up the
//! others, and binding a member's listener.

use std::io::{self, ErrorKind, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::messages::MAX_HELLO_LEN;
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::tcp_bounded::{read_exact_within, write_all_within};

/// How long an accepted connection may take to send its complete hello (at the root during the
/// rendezvous, and at every rank's poller later).
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most accepted connections whose hello is still arriving; further ones wait in the listen
/// backlog until a slot frees up (hellos of real ranks complete in moments; silent ones are
/// dropped after [`HANDSHAKE_TIMEOUT`]).
pub(super) const MAX_PENDING_HANDSHAKES: usize = 1024;
/// Longest sleep of the accept loop when nothing happens.
const ACCEPT_POLL_MAX: Duration = Duration::from_millis(5);

// ---------------------------------------------------------------------------------------------
// Blocking I/O with a deadline.

/// Why a bounded read or write did not complete.
pub(super) enum IoFailure {
    /// The deadline passed.
    TimedOut,
    /// The connection was closed or failed.
    Closed(String),
    /// The other side sent something that is not a valid message.
    Malformed(String),
}

/// A bounded read or write's outcome as the rendezvous tells failures apart.
fn bounded(done: io::Result<()>) -> Result<(), IoFailure> {
    done.map_err(|e| match e.kind() {
        ErrorKind::TimedOut => IoFailure::TimedOut,
        _ => IoFailure::Closed(e.to_string()),
    })
}

/// Writes one handshake message: `u32` length, then the message.
pub(super) fn write_handshake(stream: &TcpStream, message: &[u8], deadline: &Deadline) -> Result<(), IoFailure> {
    let len = u32::try_from(message.len()).map_err(|_| IoFailure::Malformed("handshake message too long".into()))?;
    let mut framed = Vec::with_capacity(4 + message.len());
    framed.extend_from_slice(&len.to_le_bytes());
    framed.extend_from_slice(message);
    bounded(write_all_within(stream, &framed, deadline))
}

/// Reads one handshake message of at most `max_len` bytes. Reads exactly its bytes and no
/// more, so frames that follow stay in the socket for the link's reader.
pub(super) fn read_handshake(
    stream: &mut TcpStream,
    max_len: usize,
    deadline: &Deadline,
) -> Result<Vec<u8>, IoFailure> {
    let mut prefix = [0u8; 4];
    bounded(read_exact_within(stream, &mut prefix, deadline))?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 || len > max_len {
        return Err(IoFailure::Malformed(format!("announced a {len}-byte handshake message (limit {max_len})")));
    }
    let mut message = vec![0u8; len];
    bounded(read_exact_within(stream, &mut message, deadline))?;
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
pub(super) struct Acceptor<'a> {
    listener: &'a TcpListener,
    pending: Vec<PendingHandshake>,
    rank: usize,
}

/// A connection that sent a complete hello (not yet checked).
pub(super) struct Incoming {
    pub(super) stream: TcpStream,
    pub(super) from: SocketAddr,
    pub(super) hello: Vec<u8>,
}

impl<'a> Acceptor<'a> {
    pub(super) fn new(listener: &'a TcpListener, rank: usize) -> Result<Self> {
        listener.set_nonblocking(true).map_err(|e| Error::io("make the bootstrap listener non-blocking", e))?;
        Ok(Acceptor { listener, pending: Vec::new(), rank })
    }

    /// Reports why a connection is closed (a warning event).
    pub(super) fn refuse(&self, from: SocketAddr, reason: &str) {
        let rank = self.rank;
        tracing::warn!(target: crate::diagnostics::BOOTSTRAP, rank, %from, "bootstrap rank {rank} refused a connection from {from}: {reason}");
    }

    /// The next connection with a complete hello, or `None` once `deadline` has passed (checked
    /// first on every call, so a stream of hellos the caller refuses cannot keep it waiting).
    pub(super) fn next(&mut self, deadline: &Deadline) -> Result<Option<Incoming>> {
        let mut idle_sleep = Duration::from_micros(200);
        loop {
            if deadline.expired() {
                return Ok(None);
            }
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
            if progressed {
                idle_sleep = Duration::from_micros(200);
            } else {
                std::thread::sleep(idle_sleep.min(deadline.remaining()));
                idle_sleep = (idle_sleep * 2).min(ACCEPT_POLL_MAX);
            }
        }
    }
}

/// Binds a listener of the bootstrap on `addr` (`what` names it in the error) with the deepest
/// accept queue the system allows: a root's rendezvous takes a connection from every rank of
/// its group at once ([`crate::tcp_listener`]).
pub(super) fn bind_listener(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    crate::tcp_listener::bind(addr).map_err(|e| Error::io(format!("bind the bootstrap {what} on {addr}"), e))
}

/// Binds the listener of a non-root rank: on the root's own address if that is loopback, else on
/// the local address the system would use to reach the root; port 0.
pub(super) fn bind_member_listener(root: SocketAddr) -> Result<TcpListener> {
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
    bind_listener(local, "listener")
}
