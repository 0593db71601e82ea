//! This transport's device regions beyond weave-cuda's own allocations: user memory registered
//! for the legacy IPC path, and peers' memory mapped here (cuMem allocations imported through
//! the FD server, legacy IPC handles opened, same-process memory used in place), with the
//! process-wide import cache. Each is a [`DeviceRegion`] whose [`RegionBacking`] is one of the
//! types below.

use std::collections::HashMap;
use std::hash::Hash;
use std::os::fd::OwnedFd;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use comm_core::error::{Error, Result};
use comm_core::memory::MemoryKind;
use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdeviceptr;
use weave_cuda::{DeviceRegion, RegionBacking, VmmMapping, bind};

use crate::cu;

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

/// A peer's cuMem allocation imported through its FD server and mapped here.
struct ImportedAllocation(VmmMapping);

impl RegionBacking for ImportedAllocation {
    fn is_imported(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        format!("imported cuMem allocation of {} bytes", self.0.size())
    }
}

/// A peer's legacy IPC allocation opened in this process; closed on drop.
struct IpcMapping {
    ctx: Arc<CudaContext>,
    base: CUdeviceptr,
    /// Bytes the driver mapped: the exporter's allocation as it really is, whatever the
    /// exporter's message claimed.
    size: usize,
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let _ = bind(&self.ctx);
        let _ = cu::ipc_close(self.base);
    }
}

impl RegionBacking for IpcMapping {
    fn is_imported(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        format!("imported IPC handle at base {:#x}", self.base)
    }
}

/// Memory the user allocated with cudaMalloc/cuMemAlloc and registered for the legacy path
/// (not owned: the user frees it).
pub(crate) struct UserMemory {
    /// Keeps the context (and so the allocation's address space) alive while registered.
    _ctx: Arc<CudaContext>,
    pub(crate) handle: [u8; 64],
    pub(crate) base: CUdeviceptr,
    pub(crate) base_size: usize,
    pub(crate) offset: usize,
    pub(crate) backend: u64,
}

impl RegionBacking for UserMemory {
    fn is_imported(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "registered user memory".to_string()
    }
}

/// Legacy memory of a rank in this same process, used at its own address (IPC handles cannot
/// be opened by the process that exported them).
struct SameProcess;

impl RegionBacking for SameProcess {
    fn is_imported(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "same-process legacy memory".to_string()
    }
}

/// Registers user memory `[ptr, ptr + len)` of `device` for the legacy IPC path.
pub(crate) fn register_user(
    ctx: &Arc<CudaContext>,
    device: u32,
    ptr: CUdeviceptr,
    len: usize,
    backend: u64,
) -> Result<DeviceRegion> {
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
            weave_cuda::driver::error("cuIpcGetMemHandle", r)
        }
    })?;
    let user = UserMemory { _ctx: ctx.clone(), handle, base, base_size, offset, backend };
    Ok(DeviceRegion::mapped(ptr, len, MemoryKind::Device(device), device, Arc::new(user)))
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
) -> Result<DeviceRegion> {
    let (pid, instance, id) = owner;
    let key = VmmKey { pid, instance, id, device };
    let mapping = cached(&VMM_CACHE, key, || {
        let fd = fetch_fd()?;
        let handle = cu::import_fd(&fd)?;
        drop(fd);
        // SAFETY: `handle` was just imported by cuMemImportFromShareableHandle; nothing else
        // holds it, and the mapping releases it.
        Ok(ImportedAllocation(unsafe { VmmMapping::from_handle(ctx, handle, size, device, 0) }?))
    })?;
    if mapping.0.size() < len {
        return Err(Error::protocol(format!(
            "imported allocation is {} bytes, the region should be {len}",
            mapping.0.size()
        )));
    }
    Ok(DeviceRegion::mapped(mapping.0.ptr(), len, kind, device, mapping))
}

/// Opens a peer's legacy IPC handle (through the cache); the region starts `offset` bytes into
/// the base allocation.
pub(crate) fn import_ipc(
    ctx: &Arc<CudaContext>,
    device: u32,
    owner: (u32, u64),
    handle: &[u8; 64],
    offset: usize,
    len: usize,
    kind: MemoryKind,
) -> Result<DeviceRegion> {
    let (pid, instance) = owner;
    let key = IpcKey { pid, instance, handle: *handle, device };
    let mapping = cached(&IPC_CACHE, key, || {
        let base = cu::ipc_open(handle)?;
        // Owned at once, so that a failure below closes the mapping again.
        let mut mapping = IpcMapping { ctx: ctx.clone(), base, size: 0 };
        mapping.size = cu::pointer_range(base)?.1;
        Ok(mapping)
    })?;
    if offset.checked_add(len).is_none_or(|end| end > mapping.size) {
        return Err(Error::protocol(format!(
            "rank memory of pid {pid}: [{offset}, +{len}) lies past the {} B the driver mapped",
            mapping.size
        )));
    }
    let ptr = mapping.base + offset as u64;
    Ok(DeviceRegion::mapped(ptr, len, kind, device, mapping))
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
) -> Result<DeviceRegion> {
    let (b, s) = cu::pointer_range(base)?;
    if (b, s) != (base, base_size) {
        return Err(Error::protocol(format!(
            "legacy export names allocation [{base:#x}, +{base_size}) of this process, which is now [{b:#x}, +{s})"
        )));
    }
    // The memory may live on another device of this process: let this device's kernels in.
    cu::enable_peer_access_to(base)?;
    Ok(DeviceRegion::mapped(base + offset as u64, len, kind, device, Arc::new(SameProcess)))
}

/// The registered user memory behind `region`, if it is some.
pub(crate) fn user_memory(region: &DeviceRegion) -> Option<&UserMemory> {
    region.backing::<UserMemory>()
}

fn pool_unsupported(ptr: CUdeviceptr) -> Error {
    Error::Unsupported(format!(
        "device memory at {ptr:#x} comes from a stream-ordered memory pool (cuMemAllocAsync, e.g. a cudarc \
         CudaSlice), which CUDA cannot export to other processes; allocate the buffer through weave \
         (Communicator::register with MemoryKind::Device) or with cudaMalloc/cuMemAlloc"
    ))
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

static VMM_CACHE: Cache<VmmKey, ImportedAllocation> = LazyLock::new(|| Mutex::new(HashMap::new()));
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
