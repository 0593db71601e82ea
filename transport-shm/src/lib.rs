//! # transport-shm
//!
//! weave's shared-memory transport: host buffers shared between processes of one host through
//! POSIX shared memory (`shm_open` + `mmap`). Hand [`ShmTransport`] to the communicator builder;
//! it opens one [`ShmBackend`] per communicator.
//!
//! ## Reachability
//!
//! Each rank's endpoint carries its hostname, boot id (`/proc/sys/kernel/random/boot_id`), the
//! device number of its `/dev/shm` mount, its pid namespace, pid and effective uid. Two ranks
//! use this transport only when all but the pid are equal: same host and boot, same `/dev/shm`
//! (containers with private mounts cannot share), same pid namespace (so the peer's pid can be
//! watched), same user (segments are 0600).
//!
//! ## Naming
//!
//! A segment is named `/weave-{job_key}-r{rank}-c{communicator_id}-{counter}` (the file
//! `/dev/shm/weave-…`): the job key comes from the job secret, so jobs never collide and a
//! job's leftovers can be listed ([`job_segments`]); the owner's rank, the communicator and a
//! per-process counter make names unique within a job. A name received from rank `p` is only
//! opened if it has exactly this form with `r{p}` and this job's key, so a peer cannot make a
//! rank open arbitrary shared-memory objects.
//!
//! ## Permissions
//!
//! Segments are created with `O_CREAT | O_EXCL` and mode 0600 (set again with `fchmod`, whatever
//! the umask), so only processes of the same user can open them. An importer checks with `fstat`
//! that the segment belongs to its own effective uid and holds the announced length before it
//! maps it. The whole segment is reserved with `posix_fallocate` at allocation, so a full
//! `/dev/shm` is an error from `allocate` rather than a `SIGBUS` later.
//!
//! ## Seal protocol
//!
//! The owner creates and maps a segment, exports its name, and every peer that needs it opens
//! and maps it. Once all have (the communicator knows, after its registration exchange), the
//! owner's [`seal`](comm_core::memory::MemoryRegion::seal) removes the name with `shm_unlink`.
//! The memory itself lives on as long as any process maps it, and the kernel frees it when the
//! last mapping goes — also when processes are killed. An owner region dropped before it was
//! sealed removes its name on drop; imported regions never remove names.
//!
//! ## When a rank dies
//!
//! - After sealing: nothing of it is left in `/dev/shm`; its segments vanish with the last
//!   process that maps them. Ranks waiting on it notice within about a millisecond through the
//!   connection's peer check ([`Error::PeerLost`]: the pid is gone,
//!   a zombie, or reused) and otherwise at their timeout.
//! - Between allocating and sealing (during setup): its unsealed segments stay in `/dev/shm`
//!   until removed; the surviving ranks' setup fails (their import finds no segment, or their
//!   bootstrap loses the peer). [`remove_job_segments`] cleans up after such a job.
//!
//! Same-user processes trust each other here as everywhere on Unix: a peer that shrinks a
//! segment it shared can make the importer fault. weave peers never do.

mod endpoint;
mod peer;
mod segment;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use comm_core::connection::{Connection, DirectConnection};
use comm_core::error::{Error, Result};
use comm_core::memory::{MemoryKind, MemoryRegion};
use comm_core::transport::{Transport, TransportBackend, TransportContext, TransportFactory};
use nix::unistd::Pid;

use crate::endpoint::Endpoint;
use crate::peer::PeerWatch;
use crate::segment::{Payload, check_job_key, check_peer_name};

pub use crate::segment::{SHM_DIR, ShmRegion, job_segments, remove_job_segments};

/// The shared-memory transport ([`Transport::SHM`]): give it to
/// `Communicator::builder().with_transport(...)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShmTransport;

impl TransportFactory for ShmTransport {
    fn transport(&self) -> Transport {
        Transport::SHM
    }

    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>> {
        Ok(Arc::new(ShmBackend::open(ctx)?))
    }
}

/// Tells backends of one process apart, so a backend exports only what it allocated.
static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

/// The shared-memory transport serving one communicator: allocates segments, exports and
/// imports them, and builds [`DirectConnection`]s whose peer check watches the peer's process.
#[derive(Debug)]
pub struct ShmBackend {
    id: u64,
    rank: usize,
    world_size: usize,
    job_key: String,
    communicator_id: u64,
    endpoint: Endpoint,
}

impl ShmBackend {
    /// Opens the transport for the communicator described by `ctx`. Fails with
    /// [`Error::InvalidArgument`] for a job key that cannot go into a segment name, and with
    /// [`Error::Unsupported`] where there is no `/dev/shm` or boot id (off Linux).
    pub fn open(ctx: &TransportContext) -> Result<Self> {
        check_job_key(&ctx.job_key)?;
        if ctx.rank >= ctx.world_size {
            return Err(Error::invalid(format!("transport shm: rank {} of {} ranks", ctx.rank, ctx.world_size)));
        }
        Ok(ShmBackend {
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
            rank: ctx.rank,
            world_size: ctx.world_size,
            job_key: ctx.job_key.clone(),
            communicator_id: ctx.communicator_id,
            endpoint: Endpoint::local()?,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The job key that names this backend's segments.
    pub fn job_key(&self) -> &str {
        &self.job_key
    }

    fn check_peer(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Endpoint> {
        if peer >= self.world_size {
            return Err(Error::invalid(format!("transport shm: peer rank {peer} of {} ranks", self.world_size)));
        }
        let theirs = Endpoint::decode(peer_endpoint)?;
        if !self.endpoint.can_share_with(&theirs) {
            return Err(Error::transport(
                "shm",
                format!(
                    "rank {peer} cannot share memory with rank {}: {}",
                    self.rank,
                    self.endpoint.difference(&theirs)
                ),
            ));
        }
        Ok(theirs)
    }
}

impl TransportBackend for ShmBackend {
    fn transport(&self) -> Transport {
        Transport::SHM
    }

    fn local_endpoint(&self) -> Result<Vec<u8>> {
        Ok(self.endpoint.encode())
    }

    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool> {
        Ok(Endpoint::decode(a)?.can_share_with(&Endpoint::decode(b)?))
    }

    fn direct_access(&self) -> bool {
        true
    }

    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        if kind != MemoryKind::Host {
            return Err(Error::Unsupported(format!(
                "transport shm allocates host memory only, not {kind:?}; device memory needs a GPU transport (cudaipc)"
            )));
        }
        let region = ShmRegion::create(&self.job_key, self.rank, self.communicator_id, len, self.id)?;
        Ok(Arc::new(region))
    }

    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>> {
        let Some(shm) = region.as_any().downcast_ref::<ShmRegion>() else { return Ok(None) };
        if !shm.allocated_by(self.id) {
            return Ok(None);
        }
        if shm.is_sealed() {
            return Err(Error::invalid(format!(
                "transport shm: segment {} was already sealed (its name removed); peers can no longer import it",
                shm.name()
            )));
        }
        Ok(Some(shm.export_payload().encode()))
    }

    fn import(
        &self,
        peer: usize,
        peer_endpoint: &[u8],
        payload: &[u8],
        len: usize,
        kind: MemoryKind,
    ) -> Result<Arc<dyn MemoryRegion>> {
        if kind != MemoryKind::Host {
            return Err(Error::Unsupported(format!("transport shm imports host memory only, not {kind:?}")));
        }
        let theirs = self.check_peer(peer, peer_endpoint)?;
        let p = Payload::decode(payload)?;
        check_peer_name(&p.name, &self.job_key, peer)?;
        if p.pid != theirs.pid {
            return Err(Error::protocol(format!(
                "shm export payload from rank {peer}: owner pid {} but the rank's endpoint says pid {}",
                p.pid, theirs.pid
            )));
        }
        if p.len != len {
            return Err(Error::protocol(format!(
                "shm export payload from rank {peer}: segment {} is {} bytes, the descriptor says {len}",
                p.name, p.len
            )));
        }
        Ok(Arc::new(ShmRegion::open(&p.name, len, peer)?))
    }

    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>> {
        let theirs = self.check_peer(peer, peer_endpoint)?;
        // Endpoint::decode accepted only pids in 1..=i32::MAX.
        let pid = i32::try_from(theirs.pid).map_err(|_| Error::protocol("shm endpoint: bad pid"))?;
        let watch = PeerWatch::new(peer, Pid::from_raw(pid));
        Ok(Arc::new(DirectConnection::new(Transport::SHM, peer, Box::new(move || watch.check()))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
