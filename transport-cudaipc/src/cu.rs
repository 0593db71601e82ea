//! Checked wrappers over the driver calls particular to this transport: legacy IPC handles,
//! cuMem export and import as POSIX file descriptors, pointer queries of user memory, and the
//! copy engine's streams, copies and stream memory operations.
//!
//! Every wrapper turns a failing `CUresult` into [`Error::Cuda`] naming the call
//! ([`weave_cuda::driver::check`]). None of them may run before
//! [`weave_cuda::driver::ensure_driver`] succeeded: with dynamic loading, a call into a library
//! that is absent (or lacks the symbol) panics inside cudarc instead of returning an error.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use comm_core::error::{Error, Result};
use cudarc::driver::sys::{
    self, CUdeviceptr, CUipcMemHandle, CUmemAllocationHandleType, CUmemGenericAllocationHandle, CUresult, CUstream,
};
use weave_cuda::driver::{check, error};

/// `cuMemGetAddressRange`: base and size of the allocation holding `p`.
pub(crate) fn address_range(p: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: writes two values through valid pointers; `p` is only looked up.
    check(unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, p) }, "cuMemGetAddressRange")?;
    Ok((base, size))
}

/// Whether `p` belongs to a stream-ordered memory pool (`cuMemAllocAsync`), whose memory the
/// legacy IPC path cannot export. `None` when the driver cannot tell.
pub(crate) fn is_pool_memory(p: CUdeviceptr) -> Option<bool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: for MEMPOOL_HANDLE the driver writes one CUmemoryPool through `data`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut pool as *mut sys::CUmemoryPool).cast::<c_void>(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            p,
        )
    };
    (r == CUresult::CUDA_SUCCESS).then(|| !pool.is_null())
}

/// One pointer attribute of `p` (of type `T`, as the driver documents for `attr`).
fn pointer_attribute<T: Copy>(p: CUdeviceptr, attr: sys::CUpointer_attribute, zero: T, what: &str) -> Result<T> {
    let mut v = zero;
    // SAFETY: the caller picks `T` to match what the driver writes for `attr` (a CUcontext,
    // a CUdeviceptr, a size_t or an int); `v` is valid for writes of that size.
    check(unsafe { sys::cuPointerGetAttribute((&mut v as *mut T).cast::<c_void>(), attr, p) }, what)?;
    Ok(v)
}

/// Base and size of the allocation holding `p`, from any context of this process (unlike
/// `cuMemGetAddressRange`, which only knows the current context's allocations).
pub(crate) fn pointer_range(p: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    use sys::CUpointer_attribute::{CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
    let what = "cuPointerGetAttribute (allocation range)";
    let base: CUdeviceptr = pointer_attribute(p, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 0, what)?;
    let size: usize = pointer_attribute(p, CU_POINTER_ATTRIBUTE_RANGE_SIZE, 0, what)?;
    Ok((base, size))
}

/// Makes memory of the context owning `p` accessible to kernels of the current context (peer
/// access); nothing to do when both are the same context or access is already enabled.
pub(crate) fn enable_peer_access_to(p: CUdeviceptr) -> Result<()> {
    let owner: sys::CUcontext = pointer_attribute(
        p,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
        std::ptr::null_mut(),
        "cuPointerGetAttribute (context)",
    )?;
    let mut current: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    check(unsafe { sys::cuCtxGetCurrent(&mut current) }, "cuCtxGetCurrent")?;
    if owner.is_null() || owner == current {
        return Ok(());
    }
    // SAFETY: `owner` is a live context of this process (it owns the live allocation `p`).
    match unsafe { sys::cuCtxEnablePeerAccess(owner, 0) } {
        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => Err(Error::Unsupported(
            "the two GPUs cannot access each other's memory (no peer-to-peer support between them)".into(),
        )),
        r => Err(error("cuCtxEnablePeerAccess", r)),
    }
}

/// `cuIpcGetMemHandle`; the raw result on failure so the caller can explain it.
pub(crate) fn ipc_get_handle(base: CUdeviceptr) -> std::result::Result<[u8; 64], CUresult> {
    // SAFETY: CUipcMemHandle is 64 plain bytes; zero is a valid value.
    let mut h: CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: writes one handle; `base` is only looked up by the driver.
    let r = unsafe { sys::cuIpcGetMemHandle(&mut h, base) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(r);
    }
    Ok(h.reserved.map(|c| c as u8))
}

/// `cuIpcOpenMemHandle` with lazy peer access: the base address of the exporter's allocation.
pub(crate) fn ipc_open(handle: &[u8; 64]) -> Result<CUdeviceptr> {
    // SAFETY: CUipcMemHandle is 64 plain bytes.
    let mut h: CUipcMemHandle = unsafe { std::mem::zeroed() };
    h.reserved = handle.map(|b| b as c_char);
    let mut p: CUdeviceptr = 0;
    check(
        // SAFETY: writes one address; the handle is passed by value.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut p, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint)
        },
        "cuIpcOpenMemHandle",
    )?;
    Ok(p)
}

/// `cuIpcCloseMemHandle`.
pub(crate) fn ipc_close(p: CUdeviceptr) -> Result<()> {
    // SAFETY: `p` came from cuIpcOpenMemHandle in this process and is closed once.
    check(unsafe { sys::cuIpcCloseMemHandle(p) }, "cuIpcCloseMemHandle")
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor (owned by the caller).
pub(crate) fn export_fd(h: CUmemGenericAllocationHandle) -> Result<OwnedFd> {
    let mut fd: c_int = -1;
    check(
        // SAFETY: for POSIX_FILE_DESCRIPTOR the driver writes one int through the pointer.
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut c_int).cast::<c_void>(),
                h,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemExportToShareableHandle",
    )?;
    if fd < 0 {
        return Err(Error::Cuda {
            operation: "cuMemExportToShareableHandle".into(),
            message: format!("driver returned file descriptor {fd}"),
        });
    }
    // SAFETY: the driver just created this descriptor for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor (which the caller still owns and
/// closes).
pub(crate) fn import_fd(fd: &OwnedFd) -> Result<CUmemGenericAllocationHandle> {
    let mut h: CUmemGenericAllocationHandle = 0;
    // The descriptor is passed by value, cast to a pointer, as the driver API specifies.
    let os_handle = fd.as_raw_fd() as isize as *mut c_void;
    check(
        // SAFETY: writes one handle; the descriptor is open for the duration of the call.
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                os_handle,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        },
        "cuMemImportFromShareableHandle",
    )?;
    Ok(h)
}

/// `cuMemcpyDtoDAsync` on `stream`.
pub(crate) fn memcpy_dtod_async(dst: CUdeviceptr, src: CUdeviceptr, len: usize, stream: CUstream) -> Result<()> {
    // SAFETY: both ranges are device memory accessible from the current context (checked by the
    // caller against registered ranges); `stream` is a live stream of this context.
    check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream) }, "cuMemcpyDtoDAsync")
}

/// `cuMemcpyHtoD` (synchronous).
pub(crate) fn memcpy_htod(dst: CUdeviceptr, src: &[u8]) -> Result<()> {
    // SAFETY: `src` is a live host slice of `src.len()` bytes; `dst` has as many bytes mapped.
    check(unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast::<c_void>(), src.len()) }, "cuMemcpyHtoD")
}

/// `cuStreamCreate` with `CU_STREAM_NON_BLOCKING`.
pub(crate) fn stream_create_non_blocking() -> Result<CUstream> {
    let mut s: CUstream = std::ptr::null_mut();
    check(
        // SAFETY: writes one stream handle; the caller bound the context to create it in.
        unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint) },
        "cuStreamCreate",
    )?;
    Ok(s)
}

/// `cuStreamDestroy`.
pub(crate) fn stream_destroy(s: CUstream) -> Result<()> {
    // SAFETY: `s` was created by this process and is destroyed once.
    check(unsafe { sys::cuStreamDestroy_v2(s) }, "cuStreamDestroy")
}

/// `cuStreamQuery`: `true` once all work on the stream completed.
pub(crate) fn stream_query(s: CUstream) -> Result<bool> {
    // SAFETY: `s` is a live stream.
    match unsafe { sys::cuStreamQuery(s) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => Err(error("cuStreamQuery", r)),
    }
}

/// `cuStreamWriteValue64` (default flags: a memory barrier orders it after earlier work).
pub(crate) fn stream_write_value64(s: CUstream, p: CUdeviceptr, value: u64) -> Result<()> {
    // SAFETY: `p` is an 8-byte aligned word of device memory mapped for this context (checked by
    // the caller); `s` is a live stream.
    check(unsafe { sys::cuStreamWriteValue64_v2(s, p, value, 0) }, "cuStreamWriteValue64")
}
