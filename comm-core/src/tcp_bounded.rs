//! TCP sockets of weave (the bootstrap's, the tcp transport's) used within a [`Deadline`]:
//! connecting, and blocking reads and writes, each cut short when the deadline is cancelled.
//!
//! A blocking `connect` to a host that drops the handshake (its accept queue full, the host
//! gone) waits out the kernel's SYN retries, more than a minute, and sees no abort flag; so does
//! a read of an answer that never comes. Here every wait is sliced by the deadline's
//! [`next_wait`](Deadline::next_wait), so a call that is called off ends within
//! [`CANCEL_LOOK`](crate::deadline::CANCEL_LOOK).

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, connect, socket};

use crate::deadline::Deadline;

/// Starts a non-blocking connect to `addr`: the stream comes back at once, connected or on its
/// way (writable once the handshake ended; `take_error` then says whether it failed).
pub fn start_connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let (fd, connected) = match addr {
        SocketAddr::V4(v4) => {
            let fd = socket(AddressFamily::Inet, SockType::Stream, flags, None)?;
            let connected = connect(fd.as_raw_fd(), &SockaddrIn::from(v4));
            (fd, connected)
        }
        SocketAddr::V6(v6) => {
            let fd = socket(AddressFamily::Inet6, SockType::Stream, flags, None)?;
            let connected = connect(fd.as_raw_fd(), &SockaddrIn6::from(v6));
            (fd, connected)
        }
    };
    match connected {
        Ok(()) | Err(Errno::EINPROGRESS) => Ok(TcpStream::from(fd)),
        Err(e) => Err(e.into()),
    }
}

/// One attempt to connect to `addr`, given up after `limit` or once `deadline` passes or is
/// cancelled (seen within its [`next_wait`](Deadline::next_wait), even while the host at
/// `addr` drops the handshake). The stream comes back blocking.
pub fn connect_within(addr: SocketAddr, limit: Duration, deadline: &Deadline) -> io::Result<TcpStream> {
    let given_up = || {
        let why = if deadline.cancelled() { "the wait was called off" } else { "no answer in time" };
        io::Error::new(ErrorKind::TimedOut, format!("connecting to {addr}: {why}"))
    };
    if deadline.expired() {
        return Err(given_up());
    }
    let attempt = Deadline::after(limit);
    let stream = start_connect(addr)?;
    loop {
        let wait = deadline.next_wait().min(attempt.remaining());
        if wait.is_zero() {
            return Err(given_up());
        }
        // Whole milliseconds, at least one: a shorter wait would spin.
        let millis = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {
                if let Some(e) = stream.take_error()? {
                    return Err(e);
                }
                if connected_to_itself(&stream) {
                    return Err(io::Error::new(
                        ErrorKind::ConnectionRefused,
                        format!("connecting to {addr}: nobody listens there yet and the socket met itself"),
                    ));
                }
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether `stream` is connected to itself: a connect to a free port of this host can pick that
/// very port as its own and complete by simultaneous open. A root's port is free until the root
/// binds it, so a rank that dials early and often would otherwise, now and then, read its own
/// hello as the root's answer.
pub fn connected_to_itself(stream: &TcpStream) -> bool {
    matches!((stream.local_addr(), stream.peer_addr()), (Ok(local), Ok(peer)) if local == peer)
}

/// Reads exactly `buf.len()` bytes from the blocking `stream`, or fails with
/// [`ErrorKind::TimedOut`] once `deadline` has passed or was cancelled (no other error has
/// that kind); the other side closing first is [`ErrorKind::UnexpectedEof`].
pub fn read_exact_within(stream: &TcpStream, buf: &mut [u8], deadline: &Deadline) -> io::Result<()> {
    let len = buf.len();
    let read = |mut s: &TcpStream, filled: usize| s.read(&mut buf[filled..]);
    let ended = (ErrorKind::UnexpectedEof, "the connection was closed");
    transfer_within(stream, len, deadline, TcpStream::set_read_timeout, ended, read)
}

/// Writes all of `bytes` to the blocking `stream`, or fails with [`ErrorKind::TimedOut`] once
/// `deadline` has passed or was cancelled (no other error has that kind).
pub fn write_all_within(stream: &TcpStream, bytes: &[u8], deadline: &Deadline) -> io::Result<()> {
    let write = |mut s: &TcpStream, written: usize| s.write(&bytes[written..]);
    let ended = (ErrorKind::WriteZero, "the connection accepts no more data");
    transfer_within(stream, bytes.len(), deadline, TcpStream::set_write_timeout, ended, write)
}

/// Moves `len` bytes through `stream` by calling `step(stream, done)`, which reads or writes
/// some of the bytes after the first `done` and says how many it moved, until all are moved or
/// `deadline` passes. Each step is bounded by the time left (a slice of it where the deadline
/// is cancellable), through `set_timeout`; a step that moves nothing means the other side is
/// gone (`ended` says how), a step that timed out or was interrupted is tried again.
fn transfer_within(
    stream: &TcpStream,
    len: usize,
    deadline: &Deadline,
    set_timeout: fn(&TcpStream, Option<Duration>) -> io::Result<()>,
    ended: (ErrorKind, &str),
    mut step: impl FnMut(&TcpStream, usize) -> io::Result<usize>,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let wait = deadline.next_wait();
        if wait.is_zero() {
            let why = if deadline.cancelled() { "the wait was called off" } else { "no answer in time" };
            return Err(io::Error::new(ErrorKind::TimedOut, why));
        }
        // A socket error here must not read as the deadline's.
        let unusable = |e: io::Error| io::Error::other(format!("set a socket timeout: {e}"));
        set_timeout(stream, Some(wait)).map_err(unusable)?;
        match step(stream, done) {
            Ok(0) => return Err(io::Error::new(ended.0, ended.1)),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
