//! Transport ids and the extension trait every transport crate implements.
//!
//! A transport is two objects:
//! - a [`TransportFactory`], which the user hands to
//!   [`CommunicatorBuilder::with_transport`](crate::communicator::CommunicatorBuilder::with_transport);
//! - the [`TransportBackend`] it opens for one communicator, which allocates and exports
//!   memory, imports peers' memory, and connects to peers.
//!
//! comm-core knows no transport but the in-process [`loopback`](crate::loopback) one used by
//! tests; every other transport lives in its own crate, and a user transport plugs in the same
//! way.
//!
//! Transport names and their ids live in [`transport_names`](crate::transport_names).

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::config::Config;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::memory::{MemoryKind, MemoryRegion};

pub use crate::transport_names::{MAX_TRANSPORT_NAME_LEN, MAX_TRANSPORTS, Transport};

/// What a transport learns about the communicator it serves.
#[derive(Clone)]
pub struct TransportContext {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// A short hex string unique to this job (derived from the bootstrap secret); name OS objects
    /// (shared-memory segments, sockets) with it so jobs never collide and leftovers can be found.
    pub job_key: String,
    /// A number unique to this communicator within the process, for naming objects.
    pub communicator_id: u64,
    /// The communicator's settings (timeout, log level).
    pub config: Config,
    /// Set when the communicator aborts; long operations check it.
    pub abort: Arc<AtomicBool>,
    /// Whether a peer process is known to be gone (from the bootstrap's links).
    pub liveness: PeerLiveness,
}

/// Tells whether a peer process is known to be gone, from the communicator's bootstrap (see
/// [`Bootstrap::peer_lost`](crate::bootstrap::Bootstrap::peer_lost)); transports whose own
/// signals of a lost peer are slow ask it while they wait. Knows nothing by default.
#[derive(Clone, Default)]
pub struct PeerLiveness(Option<Arc<dyn crate::bootstrap::Bootstrap>>);

impl PeerLiveness {
    /// Liveness as `bootstrap` sees it.
    pub fn of(bootstrap: Arc<dyn crate::bootstrap::Bootstrap>) -> Self {
        PeerLiveness(Some(bootstrap))
    }

    /// Why `peer` is known to be gone, or `None`.
    pub fn lost(&self, peer: usize) -> Option<String> {
        self.0.as_ref()?.peer_lost(peer)
    }
}

impl std::fmt::Debug for PeerLiveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "PeerLiveness(bootstrap)" } else { "PeerLiveness(none)" })
    }
}

crate::debug_fields!(TransportContext { rank, world_size, job_key, communicator_id });

/// A region a peer exported through a transport, as [`TransportBackend::import`] receives it.
#[derive(Debug, Clone, Copy)]
pub struct PeerExport<'a> {
    /// The rank that owns the memory.
    pub peer: usize,
    /// That rank's endpoint for this transport (its [`TransportBackend::local_endpoint`]).
    pub peer_endpoint: &'a [u8],
    /// What that rank's [`TransportBackend::export`] gave for the region.
    pub payload: &'a [u8],
    /// Length of the region in bytes, from the checked descriptor.
    pub len: usize,
    /// Kind of the memory, from the checked descriptor.
    pub kind: MemoryKind,
}

impl PeerExport<'_> {
    /// `Err(Unsupported)` unless the export is host memory: the check of a transport (named
    /// `transport`) that carries host memory only.
    pub fn require_host(&self, transport: &str) -> Result<()> {
        if self.kind == MemoryKind::Host {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "rank {} exported {:?} memory through transport {transport}, which imports host memory only",
            self.peer, self.kind
        )))
    }
}

/// The user-facing half of a transport: a value handed to the communicator builder, which
/// opens one [`TransportBackend`] per communicator.
pub trait TransportFactory: Send + Sync {
    /// This transport's id (the name its crate registered).
    fn transport(&self) -> Transport;

    /// Opens this transport for one communicator.
    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>>;
}

/// One transport serving one communicator.
///
/// The communicator all-gathers every backend's [`local_endpoint`](Self::local_endpoint), picks
/// for each peer the first allowed backend whose [`can_reach`](Self::can_reach) holds, and from
/// then on routes that peer's memory imports and connections through it.
pub trait TransportBackend: Send + Sync {
    /// This transport's id; the same as its factory's.
    fn transport(&self) -> Transport;

    /// Bytes that tell a peer's backend of the same transport where this rank is (host identity,
    /// process id, device, queue-pair numbers…). Exchanged once per communicator.
    fn local_endpoint(&self) -> Result<Vec<u8>>;

    /// Whether the ranks with endpoints `a` and `b` can talk through this transport. Must give
    /// the same answer for `(a, b)` and `(b, a)` on every rank; may fail on malformed bytes.
    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool>;

    /// Whether memory imported through this transport is mapped into this process, so that
    /// memory channels can load and store it directly.
    fn direct_access(&self) -> bool;

    /// Whether [`allocate`](Self::allocate) gives memory of `kind` (host memory, by default):
    /// what a caller asks before choosing where a pairwise region lives (GPU channel links
    /// put their inboxes in host memory the GPU maps when no transport to the peer carries
    /// device memory).
    fn allocates(&self, kind: MemoryKind) -> bool {
        kind == MemoryKind::Host
    }

    /// The GPU whose memory this backend serves (its ordinal, as this process numbers its
    /// visible devices), if it serves one: the device a GPU engine over the communicator runs
    /// on. None by default.
    fn device(&self) -> Option<u32> {
        None
    }

    /// Allocates `len` bytes of `kind` memory that peers can import through this transport.
    /// Transports that cannot own memory return [`Error::Unsupported`].
    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        let _ = len;
        Err(Error::Unsupported(format!("transport {} cannot allocate {kind:?} memory", self.transport().name())))
    }

    /// Registers `len` bytes of existing `kind` memory at `address` (the caller's, which stays
    /// the caller's: it must outlive the region and every peer's import of it) so that peers
    /// can import it through this transport. Transports that cannot share such memory return
    /// [`Error::Unsupported`] (the default).
    fn register_existing(&self, address: u64, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        let _ = (address, len);
        Err(Error::Unsupported(format!("transport {} cannot share existing {kind:?} memory", self.transport().name())))
    }

    /// Describes `region` for peers of this transport, or `Ok(None)` when this transport cannot
    /// export that region (it was allocated elsewhere, or is the wrong kind).
    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>>;

    /// Maps the region a peer exported through this transport; the result must be exactly
    /// [`export.len`](PeerExport::len) long.
    fn import(&self, export: PeerExport<'_>) -> Result<Arc<dyn MemoryRegion>>;

    /// Asks `peer` (its endpoint `peer_endpoint`) to map `region` — memory this rank registered
    /// in place through this backend ([`register_existing`](Self::register_existing)) — into its
    /// own process now, keeping it under `key` until [`unmap_at_peer`](Self::unmap_at_peer);
    /// returns the region's address as `peer` sees it. Unlike an exchange, only this rank
    /// acts: the peer's backend answers on its own (a registration one rank makes alone, shared
    /// when a call first needs it). Transports that cannot do this return
    /// [`Error::Unsupported`] (the default).
    fn map_at_peer(&self, peer: usize, peer_endpoint: &[u8], key: u64, region: &Arc<dyn MemoryRegion>) -> Result<u64> {
        let _ = (peer, peer_endpoint, key, region);
        Err(Error::Unsupported(format!("transport {} cannot map memory at a peer's", self.transport().name())))
    }

    /// Asks `peer` to drop the mapping [`map_at_peer`](Self::map_at_peer) made under `key`.
    /// The caller makes sure no work of the peer still uses it.
    fn unmap_at_peer(&self, peer: usize, peer_endpoint: &[u8], key: u64) -> Result<()> {
        let _ = (peer, peer_endpoint, key);
        Err(Error::Unsupported(format!("transport {} cannot map memory at a peer's", self.transport().name())))
    }

    /// Builds a connection to `peer`. Both sides call it, in the same order relative to other
    /// connection setups with that peer.
    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>>;

    /// Lets a transport return its own extra interface.
    fn as_any(&self) -> &dyn Any;
}
