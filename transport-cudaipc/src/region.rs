//! Device memory regions: allocations this process owns (cuMem, exportable), user memory
//! registered for the legacy IPC path, and peers' memory mapped here, with the process-wide
//! import cache.

use std::any::Any;
use std::collections::HashMap;
use std::hash::Hash;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use comm_core::error::{Error, Result};
use comm_core::memory::{MAX_REGISTRATION_LEN, MemoryKind, MemoryRegion, RegisteredMemory};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUdeviceptr, CUmemAllocationProp, CUmemGenericAllocationHandle};

use crate::cu;

/// Numbers this process's cuMem allocations; ids are unique within the process, so an
/// (owner pid, owner instance, id) triple names one allocation on a host.
static NEXT_ALLOCATION_ID: AtomicU64 = AtomicU64::new(1);

/// A number that tells this process apart from an earlier one with the same pid (so a stale
/// cache entry of a dead process can never be taken for a live one's).
pub(crate) fn process_instance() -> u64 {
    static INSTANCE: LazyLock<u64> = LazyLock::new(|| {
        let pid = std::process::id();
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let local = 0u8;
        let addr = std::ptr::addr_of!(local) as usize;
        comm_core::wire::digest64(&[&pid.to_le_bytes(), stat.as_bytes(), &now.to_le_bytes(), &addr.to_le_bytes()])
    });
    *INSTANCE
}

fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().map_err(|e| cu::from_driver("cuCtxSetCurrent (bind device context)", e))
}

/// A cuMem allocation handle mapped at a reserved address range, readable and writable by one
/// device. Unmapped, unreserved and released on drop.
pub(crate) struct VmmMapping {
    ctx: Arc<CudaContext>,
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    size: usize,
}

impl VmmMapping {
    /// Maps `handle` (`size` bytes, which this takes over: it is released on failure too) for
    /// `device`, at an address aligned to `align` (0: the driver's default).
    fn map(
        ctx: &Arc<CudaContext>,
        handle: CUmemGenericAllocationHandle,
        size: usize,
        device: u32,
        align: usize,
    ) -> Result<Self> {
        let ptr = match cu::address_reserve(size, align) {
            Ok(p) => p,
            Err(e) => {
                let _ = cu::mem_release(handle);
                return Err(e);
            }
        };
        if let Err(e) = cu::mem_map(ptr, size, handle) {
            let _ = cu::address_free(ptr, size);
            let _ = cu::mem_release(handle);
            return Err(e);
        }
        // From here on, Drop undoes everything.
        let mapping = VmmMapping { ctx: ctx.clone(), handle, ptr, size };
        cu::set_access_rw(ptr, size, device)?;
        Ok(mapping)
    }

    pub(crate) fn handle(&self) -> CUmemGenericAllocationHandle {
        self.handle
    }

    /// Size of the mapping (the whole allocation).
    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; each step is still attempted.
        let _ = bind(&self.ctx);
        let _ = cu::mem_unmap(self.ptr, self.size);
        let _ = cu::address_free(self.ptr, self.size);
        let _ = cu::mem_release(self.handle);
    }
}

/// A cuMem allocation this process owns and exports through its backend's FD server.
pub(crate) struct OwnedAllocation {
    pub(crate) mapping: VmmMapping,
    /// Process-unique allocation id (what peers ask the FD server for).
    pub(crate) id: u64,
    /// The backend that allocated it (only that backend exports it).
    pub(crate) backend: u64,
}

/// A peer's legacy IPC allocation opened in this process; closed on drop.
pub(crate) struct IpcMapping {
    ctx: Arc<CudaContext>,
    base: CUdeviceptr,
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        let _ = cu::ipc_close(self.base);
    }
}

/// Memory the user allocated with cudaMalloc/cuMemAlloc and registered for the legacy path.
pub(crate) struct UserMemory {
    /// Keeps the context (and so the allocation's address space) alive while registered.
    _ctx: Arc<CudaContext>,
    pub(crate) handle: [u8; 64],
    pub(crate) base: CUdeviceptr,
    pub(crate) base_size: usize,
    pub(crate) offset: usize,
    pub(crate) backend: u64,
}

enum Backing {
    /// Allocated here with cuMem; exportable through the FD server.
    Owned(Arc<OwnedAllocation>),
    /// A peer's cuMem allocation imported through its FD server.
    ImportedVmm(Arc<VmmMapping>),
    /// User memory registered for the legacy IPC path (not owned: the user frees it).
    User(UserMemory),
    /// A peer's legacy allocation opened with cuIpcOpenMemHandle.
    ImportedIpc(Arc<IpcMapping>),
    /// Legacy memory of a rank in this same process, used at its own address (IPC handles
    /// cannot be opened by the process that exported them).
    SameProcess,
}

/// GPU memory that transport cudaipc allocated, registered or mapped: `as_ptr` is a CUDA device
/// virtual address (valid in kernels and copies on [`mapped_device`](Self::mapped_device), never
/// dereferenceable by the CPU).
pub struct DeviceRegion {
    ptr: CUdeviceptr,
    len: usize,
    kind: MemoryKind,
    device: u32,
    backing: Backing,
}

impl std::fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backing = match &self.backing {
            Backing::Owned(a) => format!("owned cuMem allocation #{}", a.id),
            Backing::ImportedVmm(m) => format!("imported cuMem allocation of {} bytes", m.size),
            Backing::User(_) => "registered user memory".to_string(),
            Backing::ImportedIpc(m) => format!("imported IPC handle at base {:#x}", m.base),
            Backing::SameProcess => "same-process legacy memory".to_string(),
        };
        f.debug_struct("DeviceRegion")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("kind", &self.kind)
            .field("mapped_device", &self.device)
            .field("backing", &backing)
            .finish()
    }
}

impl DeviceRegion {
    /// Allocates `len` bytes (at least one granule) on `device` with `prop`, maps them
    /// read/write for `device` and zeroes them. The context must be bound.
    pub(crate) fn allocate(
        ctx: &Arc<CudaContext>,
        device: u32,
        len: usize,
        prop: &CUmemAllocationProp,
        granularity: usize,
        backend: u64,
    ) -> Result<Self> {
        if len > MAX_REGISTRATION_LEN {
            return Err(Error::invalid(format!("cannot allocate {len} bytes: more than {MAX_REGISTRATION_LEN}")));
        }
        // Cannot overflow: len <= 2^48 and granularity is a small power of two.
        let size = len.max(1).div_ceil(granularity) * granularity;
        let handle = cu::mem_create(size, prop).map_err(|e| match e {
            Error::Cuda { operation, message } => {
                Error::Cuda { operation, message: format!("{message} (allocating {size} bytes on device {device})") }
            }
            e => e,
        })?;
        let mapping = VmmMapping::map(ctx, handle, size, device, granularity)?;
        cu::memset_d8(mapping.ptr, 0, size)?;
        // The memset runs on the legacy default stream; wait for it so that no copy on a
        // non-blocking stream (ours, a peer's) can overtake it.
        cu::stream_synchronize(std::ptr::null_mut())?;
        let id = NEXT_ALLOCATION_ID.fetch_add(1, Ordering::Relaxed);
        let ptr = mapping.ptr;
        Ok(DeviceRegion {
            ptr,
            len,
            kind: MemoryKind::Device(device),
            device,
            backing: Backing::Owned(Arc::new(OwnedAllocation { mapping, id, backend })),
        })
    }

    /// Registers user memory `[ptr, ptr + len)` of `device` for the legacy IPC path.
    pub(crate) fn register_user(
        ctx: &Arc<CudaContext>,
        device: u32,
        ptr: CUdeviceptr,
        len: usize,
        backend: u64,
    ) -> Result<Self> {
        if ptr == 0 {
            return Err(Error::invalid("cannot register device memory at address 0"));
        }
        let (base, base_size) = cu::address_range(ptr).map_err(|e| {
            Error::invalid(format!("{ptr:#x} is not device memory of device {device} known to this process: {e}"))
        })?;
        let offset = (ptr - base) as usize;
        if offset.checked_add(len).is_none_or(|end| end > base_size) {
            return Err(Error::invalid(format!(
                "range [{ptr:#x}, +{len}) runs past its allocation [{base:#x}, +{base_size})"
            )));
        }
        if cu::is_pool_memory(base) == Some(true) {
            return Err(pool_unsupported(ptr));
        }
        let handle = cu::ipc_get_handle(base).map_err(|r| {
            if r == cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE {
                pool_unsupported(ptr)
            } else {
                cu::error("cuIpcGetMemHandle", r)
            }
        })?;
        Ok(DeviceRegion {
            ptr,
            len,
            kind: MemoryKind::Device(device),
            device,
            backing: Backing::User(UserMemory { _ctx: ctx.clone(), handle, base, base_size, offset, backend }),
        })
    }

    /// Maps a peer's cuMem allocation (through the cache): `fetch_fd` is called only when this
    /// process has no live mapping of it yet. The region is `len` bytes of the allocation.
    pub(crate) fn import_vmm(
        ctx: &Arc<CudaContext>,
        device: u32,
        owner: (u32, u64, u64),
        size: usize,
        len: usize,
        kind: MemoryKind,
        fetch_fd: impl FnOnce() -> Result<OwnedFd>,
    ) -> Result<Self> {
        let (pid, instance, id) = owner;
        let key = VmmKey { pid, instance, id, device };
        let mapping = cached(&VMM_CACHE, key, || {
            let fd = fetch_fd()?;
            let handle = cu::import_fd(&fd)?;
            drop(fd);
            VmmMapping::map(ctx, handle, size, device, 0)
        })?;
        if mapping.size < len {
            return Err(Error::protocol(format!(
                "imported allocation is {} bytes, the region should be {len}",
                mapping.size
            )));
        }
        Ok(DeviceRegion { ptr: mapping.ptr, len, kind, device, backing: Backing::ImportedVmm(mapping) })
    }

    /// Opens a peer's legacy IPC handle (through the cache); the region starts `offset` bytes
    /// into the base allocation.
    pub(crate) fn import_ipc(
        ctx: &Arc<CudaContext>,
        device: u32,
        owner: (u32, u64),
        handle: &[u8; 64],
        offset: usize,
        len: usize,
        kind: MemoryKind,
    ) -> Result<Self> {
        let (pid, instance) = owner;
        let key = IpcKey { pid, instance, handle: *handle, device };
        let mapping = cached(&IPC_CACHE, key, || Ok(IpcMapping { ctx: ctx.clone(), base: cu::ipc_open(handle)? }))?;
        let ptr = mapping.base + offset as u64;
        Ok(DeviceRegion { ptr, len, kind, device, backing: Backing::ImportedIpc(mapping) })
    }

    /// Legacy memory of another rank of this process, used in place after checking that
    /// `[base, base + base_size)` is still one live allocation, with peer access enabled when it
    /// lives on another device. The context must be bound.
    pub(crate) fn same_process(
        device: u32,
        base: CUdeviceptr,
        base_size: usize,
        offset: usize,
        len: usize,
        kind: MemoryKind,
    ) -> Result<Self> {
        let (b, s) = cu::pointer_range(base)?;
        if (b, s) != (base, base_size) {
            return Err(Error::protocol(format!(
                "legacy export names allocation [{base:#x}, +{base_size}) of this process, which is now [{b:#x}, +{s})"
            )));
        }
        // The memory may live on another device of this process: let this device's kernels in.
        cu::enable_peer_access_to(base)?;
        Ok(DeviceRegion { ptr: base + offset as u64, len, kind, device, backing: Backing::SameProcess })
    }

    /// The CUDA device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The ordinal (in this process) of the device whose kernels and copies may use the address.
    pub fn mapped_device(&self) -> u32 {
        self.device
    }

    /// True when the memory belongs to another process (or another rank's registration) and is
    /// only mapped here.
    pub fn is_imported(&self) -> bool {
        matches!(self.backing, Backing::ImportedVmm(_) | Backing::ImportedIpc(_) | Backing::SameProcess)
    }

    /// The owned cuMem allocation, if this region is one.
    pub(crate) fn owned(&self) -> Option<&Arc<OwnedAllocation>> {
        match &self.backing {
            Backing::Owned(a) => Some(a),
            _ => None,
        }
    }

    /// The registered user memory, if this region is some.
    pub(crate) fn user(&self) -> Option<&UserMemory> {
        match &self.backing {
            Backing::User(u) => Some(u),
            _ => None,
        }
    }
}

fn pool_unsupported(ptr: CUdeviceptr) -> Error {
    Error::Unsupported(format!(
        "device memory at {ptr:#x} comes from a stream-ordered memory pool (cuMemAllocAsync, e.g. a cudarc \
         CudaSlice), which CUDA cannot export to other processes; allocate the buffer through weave \
         (Communicator::register with MemoryKind::Device) or with cudaMalloc/cuMemAlloc"
    ))
}

impl MemoryRegion for DeviceRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        self.kind
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The [`DeviceRegion`] behind a registration, if transport cudaipc made it.
pub(crate) fn device_region(m: &RegisteredMemory) -> Option<&DeviceRegion> {
    m.region().as_any().downcast_ref::<DeviceRegion>()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct VmmKey {
    pid: u32,
    instance: u64,
    id: u64,
    device: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct IpcKey {
    pid: u32,
    instance: u64,
    handle: [u8; 64],
    device: u32,
}

type Cache<K, V> = LazyLock<Mutex<HashMap<K, Weak<V>>>>;

static VMM_CACHE: Cache<VmmKey, VmmMapping> = LazyLock::new(|| Mutex::new(HashMap::new()));
static IPC_CACHE: Cache<IpcKey, IpcMapping> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Live entries of the process-wide import cache (mappings of peers' memory that some region
/// still uses). For leak checks in tests and diagnostics.
pub fn import_cache_entries() -> usize {
    fn live<K, V>(c: &Cache<K, V>) -> usize {
        c.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|w| w.strong_count() > 0).count()
    }
    live(&VMM_CACHE) + live(&IPC_CACHE)
}

/// The live value for `key`, or a new one from `create` (run without the lock held, so slow
/// driver calls do not serialize unrelated imports). No `Arc` is ever dropped while the lock is
/// held: the values' destructors call the driver, and must never wait for this lock.
fn cached<K: Eq + Hash + Copy, V>(cache: &Cache<K, V>, key: K, create: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
    {
        let map = cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = map.get(&key).and_then(Weak::upgrade) {
            drop(map);
            return Ok(v);
        }
    }
    let fresh = Arc::new(create()?);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(existing) = map.get(&key).and_then(Weak::upgrade) {
        // Another thread mapped it meanwhile: use theirs, drop ours after unlocking.
        drop(map);
        drop(fresh);
        return Ok(existing);
    }
    map.retain(|_, w| w.strong_count() > 0);
    map.insert(key, Arc::downgrade(&fresh));
    drop(map);
    Ok(fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_shares_live_values_and_forgets_dead_ones() {
        static CACHE: Cache<u32, String> = LazyLock::new(|| Mutex::new(HashMap::new()));
        let a = cached(&CACHE, 1, || Ok("one".to_string())).unwrap();
        let b = cached(&CACHE, 1, || panic!("must come from the cache")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = cached(&CACHE, 2, || Ok("two".to_string())).unwrap();
        assert_eq!(*c, "two");
        drop((a, b));
        let again = cached(&CACHE, 1, || Ok("one again".to_string())).unwrap();
        assert_eq!(*again, "one again");
        assert!(cached(&CACHE, 3, || Err(Error::invalid("no"))).is_err());
        let map = CACHE.lock().unwrap();
        assert!(!map.contains_key(&3));
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn process_instance_is_stable() {
        assert_eq!(process_instance(), process_instance());
    }
}
