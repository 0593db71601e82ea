//! # transport-cudaipc
//!
//! weave's CUDA IPC transport: GPU memory shared between processes of one host, mapped into
//! each GPU's address space so kernels load and store peer memory directly (NVLink or PCIe
//! peer-to-peer), plus copy-engine connections. Hand [`CudaIpcTransport`] to the communicator
//! builder; it opens one [`CudaIpcBackend`] per communicator.
//!
//! What every GPU transport shares comes from `weave-cuda`: the device and its context
//! ([`CudaDevice`]), the cuMem allocations this transport exports, the [`DeviceRegion`]s it
//! allocates, registers and imports, the device status words and the builders of the device
//! handles kernels receive. This crate adds what is particular to CUDA IPC: the FD server and
//! the legacy IPC handles that move memory between processes, the import cache, its endpoint,
//! connection and backend.
//!
//! The driver is loaded at run time (cudarc's dynamic loading): this crate builds and runs on
//! hosts without CUDA, where [`CudaIpcTransport`]'s `open` fails with [`Error::Unsupported`]
//! and the communicator goes on with its other transports. [`weave_cuda::driver_available`]
//! probes for the driver without touching a driver symbol (with dynamic loading, calling a
//! missing symbol panics); every driver failure after that is an [`Error::Cuda`] naming the call.
//!
//! ## Device
//!
//! A backend serves one GPU: [`CudaIpcTransport::on_device`] names it, otherwise rank
//! `r` takes device `r % device_count` — right for the usual one-rank-per-GPU launch where
//! every node runs the same number of ranks and sees all of its GPUs. With another layout (or
//! `CUDA_VISIBLE_DEVICES` set per rank), name the device.
//!
//! ## Reachability
//!
//! Two ranks reach each other when they run on one host (hostname and boot id), in one pid and
//! network namespace, as one user. The device does not matter (ranks may share a GPU). Whether
//! two different GPUs can map each other's memory (peer-to-peer support) is only known at
//! import time, where a failure is an error naming the driver call.
//!
//! ## Export protocol
//!
//! [`allocate`](TransportBackend::allocate) of [`MemoryKind::Device`] memory creates a cuMem
//! allocation (`cuMemCreate`, pinned, granularity-rounded, requested exportable as a POSIX file
//! descriptor), maps it read/write for the backend's device and zeroes it. Its export payload is
//! (owner pid, owner process instance, allocation id, allocation size); no descriptor travels
//! in it. An importer asks the owner's **FD server** for the descriptor, imports it
//! (`cuMemImportFromShareableHandle`), closes it, and maps the allocation for its own device.
//!
//! Memory the user allocated with `cudaMalloc`/`cuMemAlloc` is registered with
//! [`CudaIpcBackend::register_device_memory`] (the legacy path): the payload is the
//! `cuIpcGetMemHandle` of the base allocation (`cuMemGetAddressRange`), its size and the offset
//! of the region; importers open it with `cuIpcOpenMemHandle`. Memory from a stream-ordered pool
//! (`cuMemAllocAsync`, which cudarc's `CudaSlice` uses) cannot be exported by CUDA: that is an
//! [`Error::Unsupported`] telling to allocate through weave.
//!
//! Every payload is an explicit, versioned little-endian message; decoding checks every length,
//! kind and size (a region longer than its allocation, an offset past its base) and returns
//! [`Error::Protocol`] on garbage.
//!
//! ## FD server
//!
//! Each backend runs one thread serving an abstract-namespace Unix socket (no file is left
//! behind, whatever happens to the process) named `@weave-{job_key}-r{rank}-c{communicator_id}`.
//! It serves one `SOCK_SEQPACKET` connection per request: it checks the client's uid with
//! `SO_PEERCRED`, reads the allocation id, exports a fresh descriptor of that allocation (only
//! allocations this backend exported and that still exist; anything else gets an error reply),
//! sends it with `SCM_RIGHTS`, and closes its own copy. The client checks with `SO_PEERCRED`
//! that the server is the process the peer's endpoint names. Every socket operation is bounded
//! by the communicator's timeout (the server's by at most 10 s). The thread binds the device
//! context as its first action; dropping the backend stops and joins it.
//!
//! ## Import cache
//!
//! Imports are cached process-wide per (owner pid, owner process instance, allocation id or IPC
//! handle, importing device), with weak references: a second import of the same allocation
//! returns the same mapping (no second descriptor, no second `cuIpcOpenMemHandle`), and the
//! mapping is unmapped (`cuMemUnmap`, `cuMemAddressFree`, `cuMemRelease`; or
//! `cuIpcCloseMemHandle`) when the last region using it drops. [`import_cache_entries`] counts
//! live entries.
//!
//! ## When a peer dies
//!
//! Memory a rank imported stays valid after its owner dies: the import holds its own reference
//! to the physical allocation, which the driver frees when the last process holding it unmaps
//! it. Nothing names the memory in the file system, so nothing is left behind. A connection's
//! peer check ([`Error::PeerLost`]) watches the peer's pid (gone, zombie, or reused), at most a
//! syscall per millisecond; [`Connection::flush`] checks it while waiting. An import from a
//! dead rank fails promptly: its FD server socket is gone with it, and the client reports
//! [`Error::PeerLost`] when the pid no longer exists. Kernels spinning on a dead peer's
//! semaphore stop at their cycle budget ([`DeviceStatus`]) and report
//! [`DeviceError::SemaphoreTimeout`](comm_core::device::DeviceError::SemaphoreTimeout).

mod connection;
mod cu;
mod endpoint;
mod fd_server;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod payload;
mod region;

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use comm_core::connection::Connection;
use comm_core::error::{Error, Result};
use comm_core::memory::{MemoryKind, MemoryRegion};
use comm_core::same_host::{SameHostEndpoint, checked_peer_endpoint};
use comm_core::transport::{PeerExport, Transport, TransportBackend, TransportContext, TransportFactory};
use cudarc::driver::CudaContext;
use nix::unistd::Pid;
use weave_cuda::{CudaDevice, DeviceRegion, DeviceStatus, driver};

use crate::endpoint::Endpoint;
use crate::fd_server::{ExportTable, FdServer, FdSource, socket_name};
use crate::payload::{Export, Payload};
use comm_core::peer_watch::PeerWatch;

pub use crate::connection::CudaIpcConnection;
pub use crate::region::import_cache_entries;

/// The name this transport registers, and answers to in `WEAVE_TRANSPORTS`.
pub const NAME: &str = "cudaipc";

comm_core::transport_id!(NAME);

/// The CUDA IPC transport (id [`transport()`], name [`NAME`]): give it to
/// `Communicator::builder().with_transport(...)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaIpcTransport {
    device: Option<u32>,
}

impl CudaIpcTransport {
    /// The transport on the default device: rank `r` uses device `r % device_count`.
    pub fn new() -> Self {
        CudaIpcTransport { device: None }
    }

    /// The transport on device `ordinal` (as this process numbers its visible devices).
    pub fn on_device(ordinal: u32) -> Self {
        CudaIpcTransport { device: Some(ordinal) }
    }

    /// The device named with [`on_device`](Self::on_device), if any.
    pub fn device(&self) -> Option<u32> {
        self.device
    }
}

impl TransportFactory for CudaIpcTransport {
    fn transport(&self) -> Transport {
        transport()
    }

    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>> {
        Ok(Arc::new(CudaIpcBackend::open(ctx, self.device)?))
    }
}

/// Tells backends of one process apart, so a backend exports only what it allocated or
/// registered.
static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

/// Checks a job key before it goes into socket names: 1 to 64 ASCII letters, digits or `_`.
fn check_job_key(job_key: &str) -> Result<()> {
    if job_key.is_empty() || job_key.len() > 64 || !job_key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(Error::invalid(format!(
            "transport cudaipc: job key {job_key:?} must be 1 to 64 ASCII letters, digits or '_'"
        )));
    }
    Ok(())
}

/// The CUDA IPC transport serving one communicator on one GPU: allocates exportable device
/// memory, exports and imports it, runs the FD server, and builds [`CudaIpcConnection`]s.
pub struct CudaIpcBackend {
    id: u64,
    rank: usize,
    world_size: usize,
    job_key: String,
    gpu: CudaDevice,
    endpoint: Endpoint,
    timeout: Duration,
    abort: Arc<AtomicBool>,
    exports: Arc<ExportTable>,
    server: FdServer,
}

comm_core::debug_fields!(CudaIpcBackend {
    rank,
    device: |b| b.gpu.ordinal(),
    pci_bus_id: |b| b.endpoint.pci_bus_id.clone(),
    granularity: |b| b.gpu.granularity(),
    fd_server: |b| b.server.name().to_owned(),
});

impl CudaIpcBackend {
    /// Opens the transport for the communicator described by `ctx` on device `device` (default:
    /// `rank % device_count`). [`Error::Unsupported`] when there is no CUDA driver, no device, a
    /// driver older than CUDA 12, or a device without exportable cuMem allocations;
    /// [`Error::InvalidArgument`] for a bad job key, rank or device ordinal.
    pub fn open(ctx: &TransportContext, device: Option<u32>) -> Result<Self> {
        check_job_key(&ctx.job_key)?;
        if ctx.rank >= ctx.world_size {
            return Err(Error::invalid(format!("transport cudaipc: rank {} of {} ranks", ctx.rank, ctx.world_size)));
        }
        driver::ensure_driver()?;
        let count = driver::device_count()?;
        if count == 0 {
            return Err(Error::Unsupported("no CUDA device visible to this process".into()));
        }
        let ordinal = match device {
            Some(d) => d,
            None => u32::try_from(ctx.rank % count).map_err(|_| Error::invalid("device ordinal out of range"))?,
        };
        if ordinal as usize >= count {
            return Err(Error::invalid(format!(
                "transport cudaipc: device {ordinal} requested, but this process sees {count} device(s)"
            )));
        }
        let gpu = CudaDevice::open(ordinal)?;
        let granularity = gpu.granularity();
        let endpoint =
            Endpoint::local(ordinal, gpu.pci_bus_id().to_string(), ctx.communicator_id, ctx.config.host_id.as_deref())?;
        let exports: Arc<ExportTable> = Arc::new(Mutex::new(HashMap::new()));
        let name = socket_name(&ctx.job_key, ctx.rank, ctx.communicator_id);
        let server = FdServer::start(name, gpu.context().clone(), ordinal, exports.clone(), ctx.config.timeout)?;
        tracing::info!(
            target: comm_core::diagnostics::TRANSPORT,
            rank = ctx.rank,
            device = ordinal,
            "cudaipc on device {ordinal} ({}), granularity {granularity} bytes, fd server @{}",
            endpoint.pci_bus_id,
            server.name()
        );
        Ok(CudaIpcBackend {
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
            rank: ctx.rank,
            world_size: ctx.world_size,
            job_key: ctx.job_key.clone(),
            gpu,
            endpoint,
            timeout: ctx.config.timeout,
            abort: ctx.abort.clone(),
            exports,
            server,
        })
    }

    /// The device this backend serves (its context, allocations and status words).
    pub fn device(&self) -> &CudaDevice {
        &self.gpu
    }

    /// The CUDA context (primary context of the backend's device).
    pub fn context(&self) -> &Arc<CudaContext> {
        self.gpu.context()
    }

    /// The device ordinal this backend serves.
    pub fn device_ordinal(&self) -> u32 {
        self.gpu.ordinal()
    }

    /// Whether this device reaches the device at PCI bus id `peer_bus_id` (a peer rank's
    /// [`pci_bus_id`](Self::pci_bus_id)) over NVLink, judged by native peer atomics, which
    /// NVLink has and PCIe peer access has not. False when this process does not see that
    /// device, so callers that need NVLink stay on the safe side.
    pub fn nvlink_with(&self, peer_bus_id: &str) -> Result<bool> {
        self.gpu.nvlink_with(peer_bus_id)
    }

    /// The PCI bus id of the device.
    pub fn pci_bus_id(&self) -> &str {
        &self.endpoint.pci_bus_id
    }

    /// The allocation granularity: device allocations are rounded up to a multiple of it.
    pub fn granularity(&self) -> usize {
        self.gpu.granularity()
    }

    /// The abstract socket name of this backend's FD server (without the leading NUL).
    pub fn socket_name(&self) -> &str {
        self.server.name()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Registers `len` bytes at device address `ptr` that the user allocated with
    /// `cudaMalloc`/`cuMemAlloc` on this backend's device, for export through legacy IPC handles.
    /// The user keeps ownership: the memory must outlive the returned region and every peer's
    /// import of it. Memory from a stream-ordered pool (`cuMemAllocAsync`, cudarc's `CudaSlice`)
    /// is [`Error::Unsupported`]: allocate it through weave instead.
    pub fn register_device_memory(&self, ptr: u64, len: usize) -> Result<Arc<dyn MemoryRegion>> {
        self.gpu.bind()?;
        Ok(Arc::new(region::register_user(self.gpu.context(), self.gpu.ordinal(), ptr, len, self.id)?))
    }

    /// Host-visible status words for kernels on this backend's device.
    pub fn device_status(&self) -> Result<DeviceStatus> {
        self.gpu.device_status()
    }

    /// `peer`'s endpoint, checked: a rank of this communicator that can share GPU memory with
    /// this rank.
    fn peer_endpoint(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Endpoint> {
        checked_peer_endpoint(NAME, &self.endpoint, self.rank, self.world_size, peer, peer_endpoint)
    }
}

impl TransportBackend for CudaIpcBackend {
    fn transport(&self) -> Transport {
        transport()
    }

    fn local_endpoint(&self) -> Result<Vec<u8>> {
        Ok(self.endpoint.encode())
    }

    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool> {
        Endpoint::can_reach(a, b)
    }

    fn direct_access(&self) -> bool {
        true
    }

    fn device(&self) -> Option<u32> {
        Some(self.gpu.ordinal())
    }

    fn allocates(&self, kind: MemoryKind) -> bool {
        matches!(kind, MemoryKind::Device(_))
    }

    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        match kind {
            MemoryKind::Device(d) if d == self.gpu.ordinal() => Ok(Arc::new(self.gpu.allocate(len, self.id)?)),
            MemoryKind::Device(d) => Err(Error::invalid(format!(
                "transport cudaipc of rank {} serves device {}, not device {d}",
                self.rank,
                self.gpu.ordinal()
            ))),
            MemoryKind::Host => Err(Error::Unsupported(
                "transport cudaipc allocates device memory only; host memory comes from transport shm".into(),
            )),
        }
    }

    fn register_existing(&self, address: u64, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        match kind {
            MemoryKind::Device(d) if d == self.gpu.ordinal() => self.register_device_memory(address, len),
            _ => Err(Error::Unsupported(format!(
                "transport cudaipc of rank {} shares memory of device {}, not {kind:?}",
                self.rank,
                self.gpu.ordinal()
            ))),
        }
    }

    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>> {
        let Some(r) = region.as_any().downcast_ref::<DeviceRegion>() else { return Ok(None) };
        let export = if let Some(a) = r.allocation() {
            if a.owner() != self.id {
                return Ok(None);
            }
            let mut table = self.exports.lock().unwrap_or_else(|p| p.into_inner());
            table.retain(|_, w| w.strong_count() > 0);
            table.insert(a.id(), Arc::downgrade(a));
            Export::Vmm { id: a.id(), size: a.size() as u64 }
        } else if let Some(u) = region::user_memory(r) {
            if u.backend != self.id {
                return Ok(None);
            }
            Export::Legacy { handle: u.handle, base: u.base, base_size: u.base_size as u64, offset: u.offset as u64 }
        } else {
            // Imported memory is not re-exported: peers import it from its owner.
            return Ok(None);
        };
        Ok(Some(Payload { pid: self.endpoint.process.pid, instance: region::process_instance(), export }.encode()))
    }

    fn import(&self, export: PeerExport<'_>) -> Result<Arc<dyn MemoryRegion>> {
        let PeerExport { peer, peer_endpoint, payload, len, kind } = export;
        if kind == MemoryKind::Host {
            return Err(Error::Unsupported("transport cudaipc imports device memory only".into()));
        }
        let theirs = self.peer_endpoint(peer, peer_endpoint)?;
        let p = Payload::decode(payload)?;
        if p.pid != theirs.process.pid {
            return Err(Error::protocol(format!(
                "cudaipc export payload from rank {peer}: owner pid {} but the rank's endpoint says pid {}",
                p.pid, theirs.process.pid
            )));
        }
        self.gpu.bind()?;
        let (ctx, device) = (self.gpu.context(), self.gpu.ordinal());
        let region = match p.export {
            Export::Vmm { id, size } => {
                if len as u64 > size {
                    return Err(Error::protocol(format!(
                        "cudaipc export payload from rank {peer}: region of {len} bytes in an allocation of {size}"
                    )));
                }
                let size = usize::try_from(size).map_err(|_| Error::protocol("allocation size does not fit usize"))?;
                let name = socket_name(&self.job_key, peer, theirs.communicator_id);
                let source = FdSource { name: &name, peer, pid: theirs.process.pid, timeout: self.timeout };
                region::import_vmm(ctx, device, (p.pid, p.instance, id), size, len, kind, || {
                    source.fetch(id, size as u64)
                })?
            }
            Export::Legacy { handle, base, base_size, offset } => {
                if offset.checked_add(len as u64).is_none_or(|end| end > base_size) {
                    return Err(Error::protocol(format!(
                        "cudaipc export payload from rank {peer}: region [{offset}, +{len}) past its allocation of \
                         {base_size} bytes"
                    )));
                }
                if p.pid == self.endpoint.process.pid && p.instance == region::process_instance() {
                    region::same_process(device, base, base_size as usize, offset as usize, len, kind)?
                } else {
                    region::import_ipc(ctx, device, (p.pid, p.instance), &handle, offset as usize, len, kind)?
                }
            }
        };
        Ok(Arc::new(region))
    }

    fn map_at_peer(&self, peer: usize, peer_endpoint: &[u8], key: u64, region: &Arc<dyn MemoryRegion>) -> Result<u64> {
        let theirs = self.peer_endpoint(peer, peer_endpoint)?;
        let payload = self.export(region)?.ok_or_else(|| {
            Error::Unsupported(format!("transport cudaipc of rank {} did not register this region", self.rank))
        })?;
        if !matches!(Payload::decode(&payload)?.export, Export::Legacy { .. }) {
            return Err(Error::Unsupported(
                "transport cudaipc maps user memory registered in place (legacy IPC) at a peer's request, not its \
                 own allocations (exchange those)"
                    .into(),
            ));
        }
        let name = socket_name(&self.job_key, peer, theirs.communicator_id);
        FdSource { name: &name, peer, pid: theirs.process.pid, timeout: self.timeout }.map(key, region.len(), payload)
    }

    fn unmap_at_peer(&self, peer: usize, peer_endpoint: &[u8], key: u64) -> Result<()> {
        let theirs = self.peer_endpoint(peer, peer_endpoint)?;
        let name = socket_name(&self.job_key, peer, theirs.communicator_id);
        FdSource { name: &name, peer, pid: theirs.process.pid, timeout: self.timeout }.unmap(key)
    }

    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>> {
        let theirs = self.peer_endpoint(peer, peer_endpoint)?;
        // Endpoint::decode accepted only pids in 1..=i32::MAX.
        let pid = i32::try_from(theirs.process.pid).map_err(|_| Error::protocol("cudaipc endpoint: bad pid"))?;
        let watch = PeerWatch::new(peer, Pid::from_raw(pid), "cudaipc peer check");
        let conn = CudaIpcConnection::new(
            self.gpu.context().clone(),
            self.gpu.ordinal(),
            peer,
            watch,
            self.timeout,
            self.abort.clone(),
        )?;
        Ok(Arc::new(conn))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::config::Config;

    fn context(rank: usize, world_size: usize, job_key: &str) -> TransportContext {
        TransportContext {
            rank,
            world_size,
            job_key: job_key.into(),
            communicator_id: 1,
            config: Config::default(),
            abort: Arc::new(AtomicBool::new(false)),
            liveness: Default::default(),
        }
    }

    #[test]
    fn factory_names_its_transport_and_device() {
        assert_eq!((transport().name(), transport()), ("cudaipc", Transport::named(NAME).unwrap()));
        assert_eq!(CudaIpcTransport::new().transport(), transport());
        assert_eq!(CudaIpcTransport::new().device(), None);
        assert_eq!(CudaIpcTransport::default().device(), None);
        assert_eq!(CudaIpcTransport::on_device(3).device(), Some(3));
    }

    #[test]
    fn open_without_a_driver_is_unsupported() {
        let r = CudaIpcTransport::new().open(&context(0, 1, "cpuonly"));
        if !weave_cuda::driver_available() {
            println!("branch: no CUDA driver here; open must be Unsupported");
            assert!(matches!(&r, Err(Error::Unsupported(m)) if m.contains("no CUDA driver")), "{:?}", r.err());
            assert_eq!(weave_cuda::device_count().unwrap(), 0);
            // Bad arguments are reported before the driver is looked for.
            assert!(matches!(CudaIpcBackend::open(&context(0, 1, "a-b"), None), Err(Error::InvalidArgument(_))));
            assert!(matches!(CudaIpcBackend::open(&context(2, 2, "k"), None), Err(Error::InvalidArgument(_))));
        } else {
            println!("branch: a CUDA driver is present; open gave {:?}", r.as_ref().map(|b| b.transport()).err());
            // With a driver, open either works or says why not; it never panics.
            match r {
                Ok(b) => assert_eq!(b.transport(), transport()),
                Err(e) => assert!(matches!(e, Error::Unsupported(_) | Error::Cuda { .. }), "{e}"),
            }
        }
    }

    #[test]
    fn job_keys_are_checked() {
        for good in ["a", "abc_123", &"k".repeat(64)] {
            check_job_key(good).unwrap();
        }
        for bad in ["", "a-b", "a/b", "a b", &"k".repeat(65), "é"] {
            assert!(matches!(check_job_key(bad), Err(Error::InvalidArgument(_))), "{bad:?}");
        }
    }

    #[test]
    fn can_reach_is_symmetric_deterministic_and_rejects_garbage() {
        let a = Endpoint::local(0, "0000:18:00.0".into(), 1, None).unwrap();
        let mut same_host = a.clone();
        same_host.process.pid = a.process.pid.wrapping_add(1).max(1);
        same_host.device = 1;
        same_host.communicator_id = 5;
        let mut other_host = a.clone();
        other_host.process.boot_id.push('x');
        let mut other_user = a.clone();
        other_user.process.uid ^= 1;
        let all = [a, same_host, other_host, other_user];
        for x in &all {
            for y in &all {
                let (ex, ey) = (x.encode(), y.encode());
                let r = Endpoint::can_reach(&ex, &ey).unwrap();
                assert_eq!(r, Endpoint::can_reach(&ey, &ex).unwrap(), "asymmetric for {x:?} / {y:?}");
                assert_eq!(r, Endpoint::can_reach(&ex, &ey).unwrap());
            }
        }
        let e = (all[0].encode(), all[1].encode(), all[2].encode());
        assert!(Endpoint::can_reach(&e.0, &e.1).unwrap());
        assert!(!Endpoint::can_reach(&e.0, &e.2).unwrap());
        assert!(matches!(Endpoint::can_reach(&e.0, &e.1[..e.1.len() - 1]), Err(Error::Protocol(_))));
        assert!(matches!(Endpoint::can_reach(b"garbage", &e.0), Err(Error::Protocol(_))));
    }
}
