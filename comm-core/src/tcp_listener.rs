//! TCP listeners of weave (the bootstrap's, the tcp transport's), bound with the deepest accept
//! queue the system allows.
//!
//! Whenever ranks connect, they connect at once: every rank of a root's group dials the root
//! in the rendezvous, every lower rank dials all its sockets to a peer when a communicator is
//! set up. std binds with a backlog of 128, past which the kernel drops handshakes; under load
//! a rank then got a reset instead of its answer (a 256-rank rendezvous in CI did).

use std::io;
use std::net::{SocketAddr, TcpListener};

/// Binds a listener on `addr` (std sets `SO_REUSEADDR` on Unix) and sets its accept queue to
/// the system's maximum (`net.core.somaxconn`).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    // listen(2) on a listening socket only sets its backlog again; -1 asks for the maximum.
    nix::sys::socket::listen(&listener, nix::sys::socket::Backlog::MAXALLOWABLE).map_err(io::Error::from)?;
    Ok(listener)
}
