//! TCP connections of weave (the bootstrap's, the tcp transport's), made within a bound that a
//! cancelled [`Deadline`] cuts short.
//!
//! A blocking `connect` to a host that drops the handshake (its accept queue full, the host
//! gone) waits out the kernel's SYN retries, more than a minute, and sees no abort flag. Here
//! the connect is non-blocking and watched in the deadline's [`next_wait`](Deadline::next_wait)
//! slices, so a call that is called off ends within [`CANCEL_LOOK`](crate::deadline::CANCEL_LOOK).

use std::io::{self, ErrorKind};
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
