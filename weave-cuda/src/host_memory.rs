//! Pinned host memory mapped into the device's address space (`cuMemHostAlloc` with
//! `DEVICEMAP | PORTABLE`): words the host and kernels both read and write without copies, such
//! as the device status and abort words, or staging buffers of a network transport.

use std::ffi::c_void;
use std::sync::Arc;

use comm_core::error::Result;
use cudarc::driver::CudaContext;
use cudarc::driver::sys;

use crate::device::bind;
use crate::driver;

/// A zeroed block of pinned, device-mapped host memory, freed on drop. The host sees it at
/// [`host_ptr`](Self::host_ptr), kernels at [`device_ptr`](Self::device_ptr).
pub struct PinnedHostMemory {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    device_ptr: u64,
    len: usize,
}

// SAFETY: the block is owned by this value and freed once, in Drop; the raw pointer is only
// handed out, never dereferenced here except to zero the block at creation.
unsafe impl Send for PinnedHostMemory {}
// SAFETY: see Send: `&self` methods only return addresses.
unsafe impl Sync for PinnedHostMemory {}

comm_core::debug_fields!(PinnedHostMemory { host, device_ptr, len });

impl PinnedHostMemory {
    /// Allocates `len` zeroed bytes (page-aligned) for kernels of `ctx`'s device and every
    /// other context of this process, binding `ctx` to the calling thread.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        bind(ctx)?;
        let host = driver::host_alloc(len, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE)?;
        // Owned from here: dropped (freed) on the error path below.
        let mut block = PinnedHostMemory { ctx: ctx.clone(), host, device_ptr: 0, len };
        // SAFETY: `host` points at `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, len) };
        block.device_ptr = driver::host_device_pointer(host)?;
        Ok(block)
    }

    /// The host address of the first byte (valid for [`len`](Self::len) bytes while `self`
    /// lives; kernels may access the same bytes concurrently).
    pub fn host_ptr(&self) -> *mut u8 {
        self.host.cast::<u8>()
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a block of zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedHostMemory {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = driver::host_free(self.host);
    }
}

/// Host memory that something else owns (a network transport's receive region, say), page-locked
/// and mapped for kernels while this value lives (`cuMemHostRegister` with `DEVICEMAP |
/// PORTABLE`): kernels reach the bytes at [`device_ptr`](Self::device_ptr) without copies.
/// Drop it before the memory is freed.
pub struct HostRegistration {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    device_ptr: u64,
    len: usize,
}

// SAFETY: the registration only records addresses; the memory belongs to the caller, and the
// CUDA calls made with them are thread-safe once a context is bound.
unsafe impl Send for HostRegistration {}
// SAFETY: see Send: `&self` methods only return addresses.
unsafe impl Sync for HostRegistration {}

comm_core::debug_fields!(HostRegistration { host, device_ptr, len });

impl HostRegistration {
    /// Registers `len` bytes at `host` for `ctx`'s device (and every context of this process).
    ///
    /// # Safety
    /// `host` is valid for `len` bytes of host memory that stays allocated until this value
    /// is dropped, and no other registration covers any of its pages.
    pub unsafe fn new(ctx: &Arc<CudaContext>, host: *mut u8, len: usize) -> Result<Self> {
        bind(ctx)?;
        let host = host.cast::<c_void>();
        driver::host_register(host, len, sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE)?;
        // Registered from here: dropped (unregistered) on the error path below.
        let mut registration = HostRegistration { ctx: ctx.clone(), host, device_ptr: 0, len };
        registration.device_ptr = driver::host_device_pointer(host)?;
        Ok(registration)
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a registration of zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = driver::host_unregister(self.host);
    }
}
