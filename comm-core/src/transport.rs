//! Transport flags and the extension trait every transport crate implements.
//!
//! A transport is two objects:
//! - a [`TransportFactory`], which the user hands to
//!   [`CommunicatorBuilder::with_transport`](crate::communicator::CommunicatorBuilder::with_transport);
//! - the [`TransportBackend`] it opens for one communicator, which allocates and exports
//!   memory, imports peers' memory, and connects to peers.
//!
//! comm-core knows no transport but the in-process [`loopback`](crate::loopback) one used by
//! tests; `transport-shm`, `transport-cudaipc` and `transport-ib` live in their own crates, and a
//! user transport plugs in the same way.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use bitflags::bitflags;

use crate::config::Config;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::memory::{MemoryKind, MemoryRegion};

bitflags! {
    /// A set of transports. Compile-time features decide which exist; this mask (from
    /// `WEAVE_TRANSPORTS` or the API) decides which are used.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct Transport: u32 {
        /// In-process transport: ranks are threads of one process (tests).
        const LOOPBACK = 1 << 0;
        /// POSIX shared memory between processes of one host.
        const SHM = 1 << 1;
        /// CUDA IPC / NVLink between GPUs of one host.
        const CUDA_IPC = 1 << 2;
        /// InfiniBand verbs.
        const IB = 1 << 3;
        /// First of eight flags free for user transports.
        const USER0 = 1 << 24;
        /// User transport slot 1.
        const USER1 = 1 << 25;
        /// User transport slot 2.
        const USER2 = 1 << 26;
        /// User transport slot 3.
        const USER3 = 1 << 27;
        /// User transport slot 4.
        const USER4 = 1 << 28;
        /// User transport slot 5.
        const USER5 = 1 << 29;
        /// User transport slot 6.
        const USER6 = 1 << 30;
        /// User transport slot 7.
        const USER7 = 1 << 31;
    }
}

impl Transport {
    /// The lower-case name of a single transport flag (`"shm"`), or a `|`-joined list.
    pub fn name(self) -> String {
        let names: Vec<String> = self
            .iter()
            .map(|t| match t {
                Transport::LOOPBACK => "loopback".to_string(),
                Transport::SHM => "shm".to_string(),
                Transport::CUDA_IPC => "cudaipc".to_string(),
                Transport::IB => "ib".to_string(),
                other => format!("user{}", other.bits().trailing_zeros() - 24),
            })
            .collect();
        if names.is_empty() { "none".to_string() } else { names.join("|") }
    }

    /// Parses one transport name (`shm`, `loopback`, `cudaipc`, `ib`, `user0`..`user7`).
    pub fn parse(name: &str) -> Result<Transport> {
        let n = name.trim().to_ascii_lowercase();
        Ok(match n.as_str() {
            "loopback" => Transport::LOOPBACK,
            "shm" => Transport::SHM,
            "cudaipc" | "cuda_ipc" | "nvlink" => Transport::CUDA_IPC,
            "ib" | "infiniband" => Transport::IB,
            _ => match n.strip_prefix("user").and_then(|d| d.parse::<u32>().ok()) {
                Some(i) if i < 8 => Transport::from_bits_retain(1 << (24 + i)),
                _ => {
                    return Err(Error::invalid(format!(
                        "unknown transport {name:?}; expected shm, loopback, cudaipc, ib or user0..user7"
                    )));
                }
            },
        })
    }

    /// Parses a comma-separated list of transport names.
    pub fn parse_list(list: &str) -> Result<Transport> {
        let mut t = Transport::empty();
        for part in list.split(',').filter(|p| !p.trim().is_empty()) {
            t |= Transport::parse(part)?;
        }
        Ok(t)
    }
}

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
}

impl std::fmt::Debug for TransportContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportContext")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("job_key", &self.job_key)
            .field("communicator_id", &self.communicator_id)
            .finish_non_exhaustive()
    }
}

/// The user-facing half of a transport: a value handed to the communicator builder, which
/// opens one [`TransportBackend`] per communicator.
pub trait TransportFactory: Send + Sync {
    /// The single flag this transport answers to.
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
    /// The single flag of this transport.
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

    /// Allocates `len` bytes of `kind` memory that peers can import through this transport.
    /// Transports that cannot own memory return [`Error::Unsupported`].
    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        let _ = len;
        Err(Error::Unsupported(format!("transport {} cannot allocate {kind:?} memory", self.transport().name())))
    }

    /// Describes `region` for peers of this transport, or `Ok(None)` when this transport cannot
    /// export that region (it was allocated elsewhere, or is the wrong kind).
    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>>;

    /// Maps the region `peer` exported (`payload` from its [`export`](Self::export)). `len` and
    /// `kind` come from the checked descriptor; the result must be exactly that long.
    fn import(
        &self,
        peer: usize,
        peer_endpoint: &[u8],
        payload: &[u8],
        len: usize,
        kind: MemoryKind,
    ) -> Result<Arc<dyn MemoryRegion>>;

    /// Builds a connection to `peer`. Both sides call it, in the same order relative to other
    /// connection setups with that peer.
    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>>;

    /// Lets a transport return its own extra interface.
    fn as_any(&self) -> &dyn Any;
}
