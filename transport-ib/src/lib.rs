//! # transport-ib
//!
//! weave over InfiniBand and RoCE verbs: the transport that carries the channel algorithms
//! between hosts with RDMA.
//!
//! - **Port**: `WEAVE_IB_HCA` (`mlx5_0` or `mlx5_0:1`) picks the device and port, else the first
//!   active port of the first device that has one; on RoCE the first RoCE v2 GID of an IPv4
//!   address (`WEAVE_IB_GID_INDEX` overrides). No RDMA here (no device list, no device, no
//!   active port) is [`Error::Unsupported`]: the communicator then runs without this transport.
//! - **Endpoint**: one RC queue pair per peer is made when the transport opens, and every rank's
//!   port address and queue-pair numbers travel in its endpoint, which the communicator
//!   all-gathers through the bootstrap (module `endpoint`): connecting needs no further
//!   handshake.
//! - **Memory**: [`IbBackend`] allocates host memory registered for remote write and atomics;
//!   peers name it by (address, key, number), checked against the exported length. Memory imported
//!   through this transport is not mapped here (`direct_access` is false), so the collectives
//!   run their channel family over it.
//! - **Device memory** (the feature `cuda`): a connection sends from CUDA device memory through
//!   a dmabuf registration, else `nvidia_peermem`, else staging through pinned host memory
//!   (module `gpu_direct` chooses, `WEAVE_IB_GPU_DIRECT` overrides; module `staging`). Device
//!   memory as a destination is [`Error::Unsupported`]. None of it has run on real hardware yet.
//! - **Connection** ([`IbConnection`]): RDMA writes, and flags that the peer's receive queue
//!   takes — in the immediate of the data's last write where they fit, else as a small send — and
//!   the peer stores itself, after the data: on the thread that waits for them
//!   (`Connection::progress`), or on the backend's watcher thread when nobody waits.
//!   `WEAVE_IB_FLAG=atomic` sends them instead as fetch-and-adds on the peer's word behind the
//!   data (`imm`, the default, is faster on SoftRoCE: see docs/perf-log/infiniband.md, "Flags as
//!   atomics").
//!
//! The verbs layer ([`verbs`]) wraps `ibverbs-sys`. No machine here has an HCA: the tests that
//! need a device are `#[ignore]`d and run inside a QEMU guest with SoftRoCE
//! (`transport-ib/vm/softroce-guest.sh DIR` runs `DIR/test.sh` there).

mod chain;
mod connection;
#[cfg(feature = "cuda")]
mod cuda;
mod device_sources;
mod endpoint;
mod flags;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod gpu_direct;
mod inbound;
mod region;
mod staging;
pub mod verbs;
mod watcher;

use std::any::Any;
use std::sync::{Arc, Mutex};

use comm_core::connection::Connection;
use comm_core::memory::{MemoryKind, MemoryRegion};
use comm_core::transport::{PeerExport, Transport, TransportBackend, TransportContext, TransportFactory};
use comm_core::{Error, Result};

pub use connection::IbConnection;
pub use verbs::PortChoice;

use connection::{Bounds, SEND_QUEUE_DEPTH, Sources, Wire};
use device_sources::{CudaAccess, DeviceSources};
use endpoint::Endpoint;
use inbound::{Inbound, RECEIVES};
use region::{IbRegion, LocalRegions, RemoteRegion, SourceRegistrations};
use verbs::{CompletionQueue, Port, ProtectionDomain, QueuePair};
use watcher::Watcher;

/// The name this transport registers, and answers to in `WEAVE_TRANSPORTS`.
pub const NAME: &str = "ib";

comm_core::transport_id!(NAME);

/// The IB transport factory: hand it to the communicator builder (the collectives crate's
/// feature `ib` does, after shared memory, so it carries what shared memory cannot reach).
#[derive(Debug, Clone, Default)]
pub struct IbTransport {
    choice: Option<PortChoice>,
}

impl IbTransport {
    /// The transport with the port from the environment (`WEAVE_IB_HCA`, `WEAVE_IB_GID_INDEX`),
    /// read when a communicator opens it.
    pub fn new() -> Self {
        IbTransport { choice: None }
    }

    /// The transport on the port `choice` names.
    pub fn with_port(choice: PortChoice) -> Self {
        IbTransport { choice: Some(choice) }
    }
}

/// The port choice `WEAVE_IB_HCA` and `WEAVE_IB_GID_INDEX` make.
pub fn port_choice_from_env() -> Result<PortChoice> {
    let mut choice = match std::env::var("WEAVE_IB_HCA") {
        Ok(v) if !v.trim().is_empty() => PortChoice::parse(&v)?,
        _ => PortChoice::default(),
    };
    if let Ok(v) = std::env::var("WEAVE_IB_GID_INDEX") {
        let index = v
            .trim()
            .parse::<u8>()
            .map_err(|_| Error::invalid(format!("WEAVE_IB_GID_INDEX={v:?} is not a number from 0 to 255")))?;
        choice.gid_index = Some(index);
    }
    Ok(choice)
}

impl TransportFactory for IbTransport {
    fn transport(&self) -> Transport {
        transport()
    }

    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>> {
        let choice = match &self.choice {
            Some(c) => c.clone(),
            None => port_choice_from_env()?,
        };
        Ok(Arc::new(IbBackend::open(ctx, &choice)?))
    }
}

/// The IB transport serving one communicator.
pub struct IbBackend {
    rank: usize,
    world_size: usize,
    /// This rank's queue pair for each peer, until the connection to it takes it.
    wires: Mutex<Vec<Option<Wire>>>,
    endpoint: Endpoint,
    sources: Arc<SourceRegistrations>,
    /// Device memory connections send from.
    device_sources: Arc<DeviceSources>,
    /// The regions peers write into, by number (where their flags land).
    regions: Arc<LocalRegions>,
    pd: Arc<ProtectionDomain>,
    bounds: Bounds,
    /// Applies peers' flags nobody waits on.
    watcher: Arc<Watcher>,
}

impl std::fmt::Debug for IbBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbBackend").field("rank", &self.rank).field("device", &self.pd.port().device()).finish()
    }
}

impl IbBackend {
    /// Opens the port and makes one queue pair per peer.
    pub fn open(ctx: &TransportContext, choice: &PortChoice) -> Result<Self> {
        Self::open_with(ctx, choice, cuda_access())
    }

    /// [`open`](Self::open) with `cuda` for device memory (the tests stand host memory in).
    pub(crate) fn open_with(
        ctx: &TransportContext,
        choice: &PortChoice,
        cuda: Option<Arc<dyn CudaAccess>>,
    ) -> Result<Self> {
        let port = Port::open(choice)?;
        let pd = ProtectionDomain::new(&port)?;
        let watcher = Watcher::start(&port)?;
        let regions = Arc::new(LocalRegions::default());
        let (n, me) = (ctx.world_size, ctx.rank);
        let mut wires = Vec::with_capacity(n);
        let mut queue_pairs = Vec::with_capacity(n);
        for peer in 0..n {
            if peer == me {
                wires.push(None);
                queue_pairs.push((0, 0));
                continue;
            }
            let sends = CompletionQueue::new(&port, SEND_QUEUE_DEPTH as i32 + 8)?;
            let context = watcher.next_context();
            let receives = CompletionQueue::with_channel(&port, RECEIVES as i32 + 8, watcher.channel(), context)?;
            let psn = first_psn(me, peer, ctx.communicator_id);
            let qp = Arc::new(QueuePair::new(&pd, &sends, &receives, SEND_QUEUE_DEPTH, RECEIVES, psn)?);
            let inbound = Arc::new(Inbound::new(peer, &pd, &qp, &receives, &regions)?);
            watcher.watch(context, &inbound);
            let address = qp.address();
            queue_pairs.push((address.qpn, address.psn));
            wires.push(Some(Wire { qp, sends, inbound }));
        }
        Ok(IbBackend {
            rank: me,
            world_size: n,
            wires: Mutex::new(wires),
            endpoint: Endpoint { port: port.address(), queue_pairs },
            sources: Arc::default(),
            device_sources: Arc::new(DeviceSources::new(cuda, gpu_direct::PathRequest::from_env()?)),
            regions,
            pd,
            bounds: Bounds { timeout: ctx.config.timeout, abort: ctx.abort.clone(), liveness: ctx.liveness.clone() },
            watcher,
        })
    }
}

/// CUDA for device memory, where this build has it (the feature `cuda`).
fn cuda_access() -> Option<Arc<dyn CudaAccess>> {
    #[cfg(feature = "cuda")]
    return Some(Arc::new(cuda::Cuda::default()));
    #[cfg(not(feature = "cuda"))]
    return None;
}

/// A first packet sequence number that differs between pairs and communicators (24 bits).
fn first_psn(me: usize, peer: usize, communicator: u64) -> u32 {
    let mixed = comm_core::wire::digest64(&[
        &(me as u64).to_le_bytes(),
        &(peer as u64).to_le_bytes(),
        &communicator.to_le_bytes(),
    ]);
    (mixed & 0xff_ffff) as u32
}

impl TransportBackend for IbBackend {
    fn transport(&self) -> Transport {
        transport()
    }

    fn local_endpoint(&self) -> Result<Vec<u8>> {
        Ok(self.endpoint.encode())
    }

    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool> {
        let (a, b) = (Endpoint::decode(a, self.world_size)?, Endpoint::decode(b, self.world_size)?);
        // One fabric is assumed: a RoCE port and an InfiniBand port never talk.
        Ok(a.port.roce == b.port.roce)
    }

    fn direct_access(&self) -> bool {
        false
    }

    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        match kind {
            MemoryKind::Host => Ok(self.regions.allocate(&self.pd, len)?),
            // A device destination needs the NIC's writes flushed to the GPU (a read back)
            // before the peer's flag is stored, which is not built: GPU channel links put their
            // inboxes in pinned host memory instead. Device memory can be a source (module
            // `device_sources`).
            MemoryKind::Device(_) => Err(Error::Unsupported(
                "transport ib does not allocate device memory: a device destination needs a flush of the \
                 NIC's writes before the flag, which is not built (device memory can be sent from)"
                    .into(),
            )),
        }
    }

    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>> {
        Ok(region.as_any().downcast_ref::<IbRegion>().map(IbRegion::export))
    }

    fn import(&self, export: PeerExport<'_>) -> Result<Arc<dyn MemoryRegion>> {
        export.require_host(NAME)?;
        Ok(Arc::new(RemoteRegion::decode(export.peer, export.payload, export.len)?))
    }

    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>> {
        let theirs = Endpoint::decode(peer_endpoint, self.world_size)?;
        let remote = theirs.queue_pair_for(self.rank)?;
        let wire = self
            .wires
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(peer)
            .and_then(Option::take)
            .ok_or_else(|| Error::invalid(format!("ib: no queue pair left for rank {peer} (connected twice?)")))?;
        wire.qp.connect(&remote)?;
        let sources = Sources { host: self.sources.clone(), device: self.device_sources.clone() };
        Ok(Arc::new(IbConnection::new(peer, wire, &self.pd, sources, self.bounds.clone(), &self.watcher)?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests;
