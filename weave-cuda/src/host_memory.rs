//! Pinned host memory mapped into the device's address space: blocks of its own
//! (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`) for words the host and kernels both read and
//! write without copies (the device status and abort words), or memory a network transport
//! owns, registered (`cuMemHostRegister`) so that kernels read what the network writes.

use std::ffi::c_void;
use std::sync::Arc;

use comm_core::error::Result;
use cudarc::driver::CudaContext;
use cudarc::driver::sys;

use crate::device::bind;
use crate::driver;

/// Pinned host memory mapped into the device's address space: the host sees it at
/// [`host_ptr`](Self::host_ptr), kernels at [`device_ptr`](Self::device_ptr). Either a zeroed
/// block of its own ([`new`](Self::new), freed on drop), or memory something else owns — a
/// network transport's receive region, say — page-locked and mapped while this value lives
/// ([`register`](Self::register), unregistered on drop).
pub struct PinnedHostMemory {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    device_ptr: u64,
    len: usize,
    /// Allocated here (`cuMemHostAlloc`) rather than registered (`cuMemHostRegister`).
    owned: bool,
}

// SAFETY: an owned block is owned by this value and freed once, in Drop; registered memory
// belongs to the caller. The raw pointer is only handed out, never dereferenced here except to
// zero an owned block at creation.
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
        let mut block = PinnedHostMemory { ctx: ctx.clone(), host, device_ptr: 0, len, owned: true };
        // SAFETY: `host` points at `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, len) };
        block.device_ptr = driver::host_device_pointer(host)?;
        Ok(block)
    }

    /// Page-locks `len` bytes at `host` and maps them for `ctx`'s device (and every context of
    /// this process), binding `ctx` to the calling thread.
    ///
    /// # Safety
    /// `host` is valid for `len` bytes of host memory that stays allocated until this value
    /// is dropped, and no other registration covers any of its pages.
    pub unsafe fn register(ctx: &Arc<CudaContext>, host: *mut u8, len: usize) -> Result<Self> {
        bind(ctx)?;
        let host = host.cast::<c_void>();
        driver::host_register(host, len, sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE)?;
        // Registered from here: dropped (unregistered) on the error path below.
        let mut block = PinnedHostMemory { ctx: ctx.clone(), host, device_ptr: 0, len, owned: false };
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
        let _ = if self.owned { driver::host_free(self.host) } else { driver::host_unregister(self.host) };
    }
}
