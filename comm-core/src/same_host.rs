//! Endpoints of transports that share memory between processes of one host (shared memory,
//! CUDA IPC): what such an endpoint must tell, and the check each of those transports makes
//! before it imports from or connects to a peer.

use crate::error::{Error, Result};

/// A rank's endpoint for a transport that maps a peer's memory into this process: it tells
/// whether two ranks may share memory (same host, namespaces, user…) and, if not, why.
pub trait SameHostEndpoint: Sized {
    /// What the transport shares, for error messages ("memory", "GPU memory").
    const SHARES: &'static str;

    /// Parses and checks a peer's endpoint bytes; garbage is [`Error::Protocol`].
    fn decode(bytes: &[u8]) -> Result<Self>;

    /// Whether the two ranks can share memory through this transport. Symmetric.
    fn can_share_with(&self, other: &Self) -> bool;

    /// Why [`can_share_with`](Self::can_share_with) is false, for error messages.
    fn difference(&self, other: &Self) -> String;

    /// [`TransportBackend::can_reach`](crate::transport::TransportBackend::can_reach) of such a
    /// transport: a pure function of the two endpoints, so every rank gives the same answer for
    /// `(a, b)` and `(b, a)`.
    fn can_reach(a: &[u8], b: &[u8]) -> Result<bool> {
        Ok(Self::decode(a)?.can_share_with(&Self::decode(b)?))
    }
}

/// The endpoint of `peer` (its bytes `peer_endpoint`) after checking that `peer` is one of the
/// `world_size` ranks ([`Error::InvalidArgument`]), that the bytes decode, and that the peer can
/// share memory with this rank `rank`, whose endpoint is `mine` ([`Error::Transport`] of
/// `transport`, saying what differs).
pub fn checked_peer_endpoint<E: SameHostEndpoint>(
    transport: &str,
    mine: &E,
    rank: usize,
    world_size: usize,
    peer: usize,
    peer_endpoint: &[u8],
) -> Result<E> {
    if peer >= world_size {
        return Err(Error::invalid(format!("transport {transport}: peer rank {peer} of {world_size} ranks")));
    }
    let theirs = E::decode(peer_endpoint)?;
    if !mine.can_share_with(&theirs) {
        return Err(Error::transport(
            transport,
            format!("rank {peer} cannot share {} with rank {rank}: {}", E::SHARES, mine.difference(&theirs)),
        ));
    }
    Ok(theirs)
}
