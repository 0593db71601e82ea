//! Device memory regions: a CUDA device address range registered with the communicator, either
//! allocated here ([`DeviceAllocation`]) or kept mapped by something a transport provides (a
//! peer's memory it imported, user memory it registered), described by [`RegionBacking`].

use std::any::Any;
use std::sync::Arc;

use comm_core::error::{Error, Result};
use comm_core::memory::{MAX_REGISTRATION_LEN, MemoryKind, MemoryRegion, RegisteredMemory};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUdeviceptr, CUmemAllocationProp};

use crate::allocation::{DeviceAllocation, VmmMapping};
use crate::driver;

/// What keeps a [`DeviceRegion`]'s memory mapped when this crate did not allocate it: a
/// transport's mapping of a peer's memory, or user memory the transport registered. The region
/// holds it (in an `Arc`) for as long as it lives; the transport finds it again with
/// [`DeviceRegion::backing`].
pub trait RegionBacking: Any + Send + Sync {
    /// True when the memory belongs to another process (or another rank's registration) and is
    /// only mapped here.
    fn is_imported(&self) -> bool;

    /// A short description for debug output (e.g. "imported cuMem allocation of 4096 bytes").
    fn describe(&self) -> String;
}

enum Backing {
    /// Allocated here with cuMem.
    Owned(Arc<DeviceAllocation>),
    /// Kept mapped by a transport.
    Other(Arc<dyn RegionBacking>),
}

/// GPU memory that a GPU transport allocated, registered or mapped: `as_ptr` is a CUDA device
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
            Backing::Owned(a) => format!("owned cuMem allocation #{}", a.id()),
            Backing::Other(b) => b.describe(),
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
        owner: u64,
    ) -> Result<Self> {
        if len > MAX_REGISTRATION_LEN {
            return Err(Error::invalid(format!("cannot allocate {len} bytes: more than {MAX_REGISTRATION_LEN}")));
        }
        // Cannot overflow: len <= 2^48 and granularity is a small power of two.
        let size = len.max(1).div_ceil(granularity) * granularity;
        let handle = driver::mem_create(size, prop).map_err(|e| match e {
            Error::Cuda { operation, message } => {
                Error::Cuda { operation, message: format!("{message} (allocating {size} bytes on device {device})") }
            }
            e => e,
        })?;
        // SAFETY: `handle` was just created by cuMemCreate and nothing else holds it.
        let mapping = unsafe { VmmMapping::from_handle(ctx, handle, size, device, granularity) }?;
        // Zeroed on a stream of weave's own, and waited for, so that no copy on another stream
        // (ours, a peer's) can overtake it; not on the legacy default stream, which would wait
        // for every blocking stream of the program (calls queued there may wait for peers) and
        // is not allowed beside a stream being captured into a graph.
        let zeroing = crate::PrivateStream::new(ctx)?;
        let raw = zeroing.stream().cu_stream();
        driver::memset_d8_async(mapping.ptr(), 0, size, raw)?;
        driver::stream_synchronize(raw)?;
        let ptr = mapping.ptr();
        Ok(DeviceRegion {
            ptr,
            len,
            kind: MemoryKind::Device(device),
            device,
            backing: Backing::Owned(Arc::new(DeviceAllocation::new(mapping, owner))),
        })
    }

    /// A region of `len` bytes at device address `ptr`, usable by device `device`'s kernels
    /// and copies, kept mapped by `backing` (a transport's import or registration) while the
    /// region lives. The caller vouches that `[ptr, ptr + len)` is mapped for `device` as long
    /// as `backing` lives.
    pub fn mapped(
        ptr: CUdeviceptr,
        len: usize,
        kind: MemoryKind,
        device: u32,
        backing: Arc<dyn RegionBacking>,
    ) -> Self {
        DeviceRegion { ptr, len, kind, device, backing: Backing::Other(backing) }
    }

    /// The [`DeviceRegion`] behind a registration, if a GPU transport made it.
    pub fn of(m: &RegisteredMemory) -> Option<&DeviceRegion> {
        m.region().as_any().downcast_ref::<DeviceRegion>()
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
        match &self.backing {
            Backing::Owned(_) => false,
            Backing::Other(b) => b.is_imported(),
        }
    }

    /// The cuMem allocation this process made, if this region is one.
    pub fn allocation(&self) -> Option<&Arc<DeviceAllocation>> {
        match &self.backing {
            Backing::Owned(a) => Some(a),
            Backing::Other(_) => None,
        }
    }

    /// The transport's backing of this region, if it is a `T`.
    pub fn backing<T: RegionBacking>(&self) -> Option<&T> {
        match &self.backing {
            Backing::Owned(_) => None,
            Backing::Other(b) => {
                let any: &dyn Any = &**b;
                any.downcast_ref::<T>()
            }
        }
    }
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
