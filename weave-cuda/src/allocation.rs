//! cuMem allocations: a physical allocation handle mapped at a reserved device address range
//! ([`VmmMapping`]), and the allocations this process creates itself ([`DeviceAllocation`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use comm_core::error::Result;
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUdeviceptr, CUmemGenericAllocationHandle};

use crate::device::bind;
use crate::driver;

/// Numbers this process's cuMem allocations; ids are unique within the process, so an
/// (owner pid, owner instance, id) triple names one allocation on a host.
static NEXT_ALLOCATION_ID: AtomicU64 = AtomicU64::new(1);

/// The next process-unique allocation id.
pub(crate) fn next_allocation_id() -> u64 {
    NEXT_ALLOCATION_ID.fetch_add(1, Ordering::Relaxed)
}

/// A cuMem allocation handle mapped at a reserved address range, readable and writable by one
/// device. Unmapped, unreserved and released on drop.
pub struct VmmMapping {
    ctx: Arc<CudaContext>,
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    size: usize,
}

impl std::fmt::Debug for VmmMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmmMapping")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl VmmMapping {
    /// Maps `handle` (`size` bytes, which this takes over: it is released on failure too) for
    /// device `device`, at an address aligned to `align` (0: the driver's default). The context
    /// `ctx` must be bound to the calling thread.
    ///
    /// # Safety
    ///
    /// `handle` is a live cuMem allocation handle (created or imported by this process) that
    /// nothing else releases: the mapping owns it from this call on.
    pub unsafe fn from_handle(
        ctx: &Arc<CudaContext>,
        handle: CUmemGenericAllocationHandle,
        size: usize,
        device: u32,
        align: usize,
    ) -> Result<Self> {
        let ptr = match driver::address_reserve(size, align) {
            Ok(p) => p,
            Err(e) => {
                let _ = driver::mem_release(handle);
                return Err(e);
            }
        };
        if let Err(e) = driver::mem_map(ptr, size, handle) {
            let _ = driver::address_free(ptr, size);
            let _ = driver::mem_release(handle);
            return Err(e);
        }
        // From here on, Drop undoes everything.
        let mapping = VmmMapping { ctx: ctx.clone(), handle, ptr, size };
        driver::set_access_rw(ptr, size, device)?;
        Ok(mapping)
    }

    /// The allocation handle (owned by the mapping: export it, never release it).
    pub fn handle(&self) -> CUmemGenericAllocationHandle {
        self.handle
    }

    /// The device address of the first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size of the mapping (the whole allocation).
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; each step is still attempted.
        let _ = bind(&self.ctx);
        let _ = driver::mem_unmap(self.ptr, self.size);
        let _ = driver::address_free(self.ptr, self.size);
        let _ = driver::mem_release(self.handle);
    }
}

/// A cuMem allocation this process created (pinned, exportable as a POSIX file descriptor),
/// mapped for its device.
#[derive(Debug)]
pub struct DeviceAllocation {
    mapping: VmmMapping,
    id: u64,
    owner: u64,
}

impl DeviceAllocation {
    pub(crate) fn new(mapping: VmmMapping, owner: u64) -> Self {
        DeviceAllocation { mapping, id: next_allocation_id(), owner }
    }

    /// The mapping of the allocation in this process.
    pub fn mapping(&self) -> &VmmMapping {
        &self.mapping
    }

    /// The allocation handle (to export it; the allocation keeps ownership).
    pub fn handle(&self) -> CUmemGenericAllocationHandle {
        self.mapping.handle
    }

    /// Size of the whole allocation (a multiple of the granularity).
    pub fn size(&self) -> usize {
        self.mapping.size
    }

    /// Process-unique allocation id (what peers name when they ask for it).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The tag given at allocation ([`CudaDevice::allocate`](crate::CudaDevice::allocate)): who
    /// allocated it, and so who may export it.
    pub fn owner(&self) -> u64 {
        self.owner
    }
}
