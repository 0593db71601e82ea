//! CUDA's side of device memory over verbs (the feature `cuda`): what a GPU supports, dmabufs
//! of device ranges (`cuMemGetHandleForAddressRange`), the copy engine and the pinned host
//! memory of staging. The driver is loaded at run time, so this builds and runs on hosts
//! without CUDA, where every device reports nothing supported.
//!
//! Not verified on real hardware: the GPU hosts here have no HCA, and the SoftRoCE guest no
//! GPU. What ran is the logic around it ([`crate::gpu_direct`], [`crate::staging`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use comm_core::{Error, Result};
use cudarc::driver::sys::{self, CUdevice_attribute, CUmemRangeHandleType};
use weave_cuda::{CudaContext, PinnedHostMemory, bind, driver};

use crate::device_sources::{CudaAccess, PinnedBuffer};
use crate::gpu_direct::GpuDirectSupport;
use crate::staging::CopyEngine;

/// The CUDA devices this backend met, by ordinal (their primary contexts).
#[derive(Default)]
pub(crate) struct Cuda {
    contexts: Mutex<HashMap<u32, Arc<CudaContext>>>,
}

impl Cuda {
    /// Device `ordinal`'s primary context, retained the first time (driver loaded and checked).
    fn context(&self, ordinal: u32) -> Result<Arc<CudaContext>> {
        let mut map = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ctx) = map.get(&ordinal) {
            return Ok(ctx.clone());
        }
        driver::ensure_driver()?;
        let ctx = CudaContext::new(ordinal as usize).map_err(|e| driver::from_driver("cuDevicePrimaryCtxRetain", e))?;
        map.insert(ordinal, ctx.clone());
        Ok(ctx)
    }
}

impl CudaAccess for Cuda {
    fn support(&self, ordinal: u32) -> GpuDirectSupport {
        let Ok(ctx) = self.context(ordinal) else {
            return GpuDirectSupport::default();
        };
        let dmabuf = driver::attribute(ctx.cu_device(), CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
        GpuDirectSupport { gpu_dmabuf: dmabuf.is_ok_and(|v| v != 0), staging: true, ..GpuDirectSupport::default() }
    }

    fn dmabuf(&self, ordinal: u32, ptr: u64, len: usize) -> Result<(OwnedFd, u64)> {
        let ctx = self.context(ordinal)?;
        bind(&ctx)?;
        // The range must start and end on host pages: the page that holds `ptr` up to the one
        // that holds its last byte (inside the allocation wherever it is page-aligned, as cuMem
        // allocations are).
        // SAFETY: sysconf has no preconditions.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let start = ptr / page * page;
        let end = (ptr + len.max(1) as u64).div_ceil(page) * page;
        let mut fd: i32 = -1;
        // SAFETY: the driver writes one int (the descriptor) through the pointer.
        let r = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&raw mut fd).cast::<c_void>(),
                start,
                (end - start) as usize,
                CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || fd < 0 {
            return Err(Error::Unsupported(format!(
                "cuMemGetHandleForAddressRange(DMA_BUF_FD) of {len} bytes at {ptr:#x} on device {ordinal}: {}",
                driver::describe(r)
            )));
        }
        // SAFETY: the driver just opened this descriptor for the caller, who owns it now.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, ptr - start))
    }

    fn copy_engine(&self, ordinal: u32) -> Result<Arc<dyn CopyEngine>> {
        Ok(Arc::new(CudaCopy { ctx: self.context(ordinal)? }))
    }

    fn pinned(&self, ordinal: u32, len: usize) -> Result<Box<dyn PinnedBuffer>> {
        Ok(Box::new(Pinned(PinnedHostMemory::new(&self.context(ordinal)?, len)?)))
    }
}

/// Copies with `cuMemcpyDtoH` (synchronous: the bytes are there when it returns).
struct CudaCopy {
    ctx: Arc<CudaContext>,
}

impl CopyEngine for CudaCopy {
    unsafe fn device_to_host(&self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: `dst` is valid for `len` bytes and `src` is device memory (caller).
        driver::check(unsafe { sys::cuMemcpyDtoH_v2(dst.cast(), src, len) }, "cuMemcpyDtoH (ib staging)")
    }
}

/// Pinned host memory of the CUDA driver, as a staging ring's.
struct Pinned(PinnedHostMemory);

impl PinnedBuffer for Pinned {
    fn as_ptr(&self) -> *mut u8 {
        self.0.host_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}
