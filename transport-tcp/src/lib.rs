//! # transport-tcp
//!
//! weave over TCP sockets, everywhere a Linux socket works: the transport that carries the
//! channel algorithms between hosts.
//!
//! - **Endpoint**: each rank listens on the address of `WEAVE_SOCKET_IFNAME`, or of the route
//!   to `MASTER_ADDR`, and announces it with a random 16-byte token through the bootstrap
//!   (which is authenticated by the job secret). A socket that does not present the token is
//!   closed: strangers learn nothing and write nothing, and, each handshake being read on a
//!   thread of its own within one timeout, a stranger that says nothing delays no rank.
//! - **Memory**: [`TcpBackend::allocate`](comm_core::transport::TransportBackend::allocate)
//!   gives host memory with an id; peers name it by that id. Frames carry (region id, offset,
//!   length) and the receiver checks the range — no pointer ever travels (see [`wire`]).
//! - **Connection**: several sockets per pair of ranks (`WEAVE_TCP_SOCKETS`), which carry
//!   both directions (the lower rank dials them, the higher writes on what it accepted);
//!   large writes cut into frames and striped over them; a flag lands only after the data it
//!   covers; `flush` returns when the peer has applied everything. EOF, a reset or a lying
//!   peer is `Error::PeerLost`; a silent one a timeout — never a hang.
//! - **Receiving**: a reader thread per stripe number — one `poll(2)` over that stripe's
//!   sockets of every peer — applies frames as they come, and a rank that waits for a peer
//!   applies that peer's frames itself (`Connection::progress`), so a small message is stored
//!   by the thread that waits for it; meanwhile the stripe-0 reader leaves that peer's socket
//!   out of its `poll` and naps instead of being woken by every segment ([`Tending`]).
//!
//! Memory imported through this transport is not mapped here (`direct_access` is false), so
//! the collectives run their channel family over it. Device buffers cross it staged through
//! pinned host memory by the collectives (this crate carries host memory only).

pub mod config;
mod connection;
mod endpoint;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod listener;
mod reader;
mod receive;
mod region;
pub mod wire;
mod writer;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use comm_core::connection::Connection;
use comm_core::memory::{MemoryKind, MemoryRegion};
use comm_core::transport::{PeerExport, Transport, TransportBackend, TransportContext, TransportFactory};
use comm_core::{Error, Result};

pub use config::{TcpConfig, Tending};
pub use connection::TcpConnection;
use endpoint::Endpoint;
use listener::Listener;
use region::{Regions, TcpRegion};

/// The name this transport registers, and answers to in `WEAVE_TRANSPORTS`.
pub const NAME: &str = "tcp";

comm_core::transport_id!(NAME);

/// The TCP transport factory: hand it to the communicator builder (the collectives crate's
/// feature `tcp` does, after shared memory, so it carries what shared memory cannot reach).
#[derive(Debug, Clone, Default)]
pub struct TcpTransport {
    config: Option<TcpConfig>,
}

impl TcpTransport {
    /// The transport with settings from the environment (read when a communicator opens it).
    pub fn new() -> Self {
        TcpTransport { config: None }
    }

    /// The transport with `config` instead of the environment.
    pub fn with_config(config: TcpConfig) -> Self {
        TcpTransport { config: Some(config) }
    }
}

impl TransportFactory for TcpTransport {
    fn transport(&self) -> Transport {
        transport()
    }

    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>> {
        let config = match &self.config {
            Some(c) => c.clone(),
            None => TcpConfig::from_env()?,
        };
        Ok(Arc::new(TcpBackend::open(ctx, config)?))
    }
}

/// The TCP transport serving one communicator.
pub struct TcpBackend {
    rank: usize,
    config: TcpConfig,
    token: [u8; 16],
    regions: Arc<Regions>,
    listener: Listener,
    timeout: Duration,
    abort: Arc<AtomicBool>,
}

impl std::fmt::Debug for TcpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpBackend").field("rank", &self.rank).field("addr", &self.listener.addr()).finish()
    }
}

impl TcpBackend {
    /// Starts listening for this communicator's peers.
    pub fn open(ctx: &TransportContext, config: TcpConfig) -> Result<Self> {
        let ip = endpoint::listen_ip(config.interface.as_deref(), config.master_addr.as_deref())?;
        let token = comm_core::wire::random_bytes("read /dev/urandom for the tcp token")?;
        let regions = Arc::new(Regions::default());
        let listener = Listener::start(ip, token, regions.clone(), ctx.config.timeout, config.tending)?;
        Ok(TcpBackend {
            rank: ctx.rank,
            config,
            token,
            regions,
            listener,
            timeout: ctx.config.timeout,
            abort: ctx.abort.clone(),
        })
    }

    /// Where this rank listens.
    pub fn listen_addr(&self) -> std::net::SocketAddr {
        self.listener.addr()
    }
}

impl TransportBackend for TcpBackend {
    fn transport(&self) -> Transport {
        transport()
    }

    fn local_endpoint(&self) -> Result<Vec<u8>> {
        Ok(Endpoint { addr: self.listener.addr(), token: self.token }.encode())
    }

    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool> {
        Endpoint::decode(a)?;
        Endpoint::decode(b)?;
        Ok(true)
    }

    fn direct_access(&self) -> bool {
        false
    }

    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        match kind {
            MemoryKind::Host => Ok(self.regions.allocate(len)?),
            MemoryKind::Device(_) => {
                Err(Error::Unsupported("transport tcp does not carry device memory yet (staging is not built)".into()))
            }
        }
    }

    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>> {
        let Some(mine) = region.as_any().downcast_ref::<TcpRegion>() else { return Ok(None) };
        // Only regions of this backend: another communicator's ids mean nothing to our peers.
        let ours = self.regions.find(mine.id()).is_some_and(|r| std::ptr::eq(Arc::as_ptr(&r), mine));
        Ok(ours.then(|| region::encode_export(mine.id())))
    }

    fn import(&self, export: PeerExport<'_>) -> Result<Arc<dyn MemoryRegion>> {
        export.require_host(NAME)?;
        Ok(Arc::new(region::decode_export(export.peer, export.payload, export.len)?))
    }

    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>> {
        let ep = Endpoint::decode(peer_endpoint)?;
        let dial = connection::Dial {
            transport: transport(),
            rank: self.rank,
            stripes: self.config.sockets,
            inbound: self.listener.inbound().clone(),
            timeout: self.timeout,
            abort: self.abort.clone(),
        };
        Ok(Arc::new(TcpConnection::open(peer, ep.addr, ep.token, dial)?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Where the rank whose TCP endpoint is `endpoint` (its backend's
/// [`local_endpoint`](TransportBackend::local_endpoint)) listens, and the token a socket must
/// present there: for tools and tests that talk to a rank's listener from outside the job.
pub fn endpoint_parts(endpoint: &[u8]) -> Result<(std::net::SocketAddr, [u8; 16])> {
    let ep = Endpoint::decode(endpoint)?;
    Ok((ep.addr, ep.token))
}

#[cfg(test)]
mod tests;
