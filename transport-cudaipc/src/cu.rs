//! Checked wrappers over the `cudarc::driver::sys` calls this crate makes.
//!
//! Every wrapper turns a failing `CUresult` into [`Error::Cuda`] naming the call. None of them
//! may run before [`ensure_driver`] succeeded: with dynamic loading, a call into a library that
//! is absent (or lacks the symbol) panics inside cudarc instead of returning an error.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use comm_core::error::{Error, Result};
use cudarc::driver::sys::{
    self, CUdevice, CUdevice_attribute, CUdeviceptr, CUipcMemHandle, CUmemAccess_flags, CUmemAccessDesc,
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult, CUstream,
};

/// Oldest driver API version (`cuDriverGetVersion`) this crate uses: 12.0. The VMM, export and
/// `_v2` stream-memop entry points are all older, so a newer driver has every symbol we call.
pub(crate) const MIN_DRIVER_VERSION: i32 = 12000;

/// Whether a CUDA driver library can be loaded (probed once per process, without touching a
/// driver symbol).
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen the candidate library names and closes
    // what it opened; it calls no driver function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `NAME (code): description` for a driver result code.
pub(crate) fn describe(r: CUresult) -> String {
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: only called after the driver was loaded (a CUresult came from it); both calls
    // write a pointer to a static, NUL-terminated string or leave the out-pointer untouched.
    unsafe {
        let _ = sys::cuGetErrorName(r, &mut name);
        let _ = sys::cuGetErrorString(r, &mut text);
    }
    let read = |p: *const c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: non-null pointers from cuGetErrorName/String point at static C strings.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    match (read(name), read(text)) {
        (Some(n), Some(t)) => format!("{n} ({}): {t}", r as u32),
        (Some(n), None) => format!("{n} ({})", r as u32),
        _ => format!("{r:?} ({})", r as u32),
    }
}

/// The error for `operation` failing with `r`.
pub(crate) fn error(operation: &str, r: CUresult) -> Error {
    Error::Cuda { operation: operation.to_string(), message: describe(r) }
}

/// `Ok(())` for `CUDA_SUCCESS`, else [`Error::Cuda`] naming `operation`.
pub(crate) fn check(r: CUresult, operation: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(error(operation, r)) }
}

/// Wraps an error of cudarc's safe API.
pub(crate) fn from_driver(operation: &str, e: cudarc::driver::DriverError) -> Error {
    error(operation, e.0)
}

/// Loads the driver, initializes it and checks its version. [`Error::Unsupported`] when there
/// is no driver, no device, or a driver older than [`MIN_DRIVER_VERSION`].
pub(crate) fn ensure_driver() -> Result<()> {
    if !driver_present() {
        return Err(Error::Unsupported(
            "no CUDA driver: libcuda.so could not be loaded (CPU-only host, or the driver is not on the \
             library path)"
                .into(),
        ));
    }
    // SAFETY: the driver library is present (checked above); cuInit takes flags 0.
    let r = unsafe { sys::cuInit(0) };
    if r == CUresult::CUDA_ERROR_NO_DEVICE {
        return Err(Error::Unsupported("no CUDA device: the driver found no GPU (check CUDA_VISIBLE_DEVICES)".into()));
    }
    check(r, "cuInit")?;
    let version = driver_version()?;
    if version < MIN_DRIVER_VERSION {
        return Err(Error::Unsupported(format!(
            "CUDA driver API version {version} is older than {MIN_DRIVER_VERSION} (CUDA 12.0), which transport \
             cudaipc needs for exportable memory and stream memory operations; update the NVIDIA driver"
        )));
    }
    Ok(())
}

/// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
pub(crate) fn driver_version() -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    check(unsafe { sys::cuDriverGetVersion(&mut v) }, "cuDriverGetVersion")?;
    Ok(v)
}

/// `cuDeviceGetCount`.
pub(crate) fn device_count() -> Result<usize> {
    let mut n: c_int = 0;
    // SAFETY: writes one int through a valid pointer; the driver was initialized by the caller.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// `cuDeviceGetAttribute`.
pub(crate) fn attribute(dev: CUdevice, attr: CUdevice_attribute) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer; `dev` came from the driver.
    check(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) }, "cuDeviceGetAttribute")?;
    Ok(v)
}

/// `cuDeviceGetPCIBusId`: `domain:bus:device.function`.
pub(crate) fn pci_bus_id(dev: CUdevice) -> Result<String> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the driver writes at most `len` bytes, NUL included, into `buf`.
    check(unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) }, "cuDeviceGetPCIBusId")?;
    // Force termination even if the driver filled the buffer.
    buf[buf.len() - 1] = 0;
    // SAFETY: `buf` is NUL-terminated (last byte forced to 0).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// Whether `dev` reaches the device at PCI bus id `peer_bus_id` with native atomics
/// (`CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`): true over NVLink, false over PCIe.
/// `None` when this process does not see that device (then nothing is known about the link).
pub(crate) fn native_atomics_with(dev: CUdevice, peer_bus_id: &str) -> Result<Option<bool>> {
    let Ok(id) = std::ffi::CString::new(peer_bus_id) else { return Ok(None) };
    let mut peer: CUdevice = 0;
    // SAFETY: `id` is a NUL-terminated string that outlives the call; one CUdevice is written.
    if unsafe { sys::cuDeviceGetByPCIBusId(&mut peer, id.as_ptr()) } != CUresult::CUDA_SUCCESS {
        return Ok(None);
    }
    if peer == dev {
        return Ok(Some(true));
    }
    let mut v: c_int = 0;
    let attr = sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED;
    // SAFETY: writes one int through a valid pointer; both devices came from the driver.
    check(unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, dev, peer) }, "cuDeviceGetP2PAttribute")?;
    Ok(Some(v != 0))
}

/// The location of device `ordinal`.
fn device_location(ordinal: u32) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal as c_int }
}

/// Properties of a pinned, POSIX-FD-exportable allocation on device `ordinal`.
pub(crate) fn allocation_prop(ordinal: u32, rdma_capable: bool) -> CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is a plain C struct of integers, C enums whose zero value is a
    // valid variant (INVALID) and a nullable pointer: all-zero is a valid value.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = device_location(ordinal);
    prop.allocFlags.gpuDirectRDMACapable = u8::from(rdma_capable);
    prop
}

/// `cuMemGetAllocationGranularity` (recommended granularity).
pub(crate) fn granularity(prop: &CUmemAllocationProp) -> Result<usize> {
    let mut g: usize = 0;
    check(
        // SAFETY: `prop` is a valid property struct; writes one usize.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                prop,
                CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    if g == 0 || !g.is_power_of_two() {
        return Err(Error::Cuda {
            operation: "cuMemGetAllocationGranularity".into(),
            message: format!("driver reported granularity {g}, not a power of two"),
        });
    }
    Ok(g)
}

/// `cuMemCreate`.
pub(crate) fn mem_create(size: usize, prop: &CUmemAllocationProp) -> Result<CUmemGenericAllocationHandle> {
    let mut h: CUmemGenericAllocationHandle = 0;
    // SAFETY: writes one handle; `prop` is valid; the current context was bound by the caller.
    check(unsafe { sys::cuMemCreate(&mut h, size, prop, 0) }, "cuMemCreate")?;
    Ok(h)
}

/// `cuMemRelease`.
pub(crate) fn mem_release(h: CUmemGenericAllocationHandle) -> Result<()> {
    // SAFETY: `h` is a handle this process created or imported and has not released.
    check(unsafe { sys::cuMemRelease(h) }, "cuMemRelease")
}

/// `cuMemAddressReserve` of `size` bytes aligned to `align`.
pub(crate) fn address_reserve(size: usize, align: usize) -> Result<CUdeviceptr> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: writes one address; no fixed address is requested.
    check(unsafe { sys::cuMemAddressReserve(&mut p, size, align, 0, 0) }, "cuMemAddressReserve")?;
    Ok(p)
}

/// `cuMemAddressFree`.
pub(crate) fn address_free(p: CUdeviceptr, size: usize) -> Result<()> {
    // SAFETY: `p..p+size` is a range this process reserved and no longer maps.
    check(unsafe { sys::cuMemAddressFree(p, size) }, "cuMemAddressFree")
}

/// `cuMemMap` of the whole allocation `h` at `p`.
pub(crate) fn mem_map(p: CUdeviceptr, size: usize, h: CUmemGenericAllocationHandle) -> Result<()> {
    // SAFETY: `p..p+size` is reserved by this process and unmapped; `h` is a live handle of at
    // least `size` bytes.
    check(unsafe { sys::cuMemMap(p, size, 0, h, 0) }, "cuMemMap")
}

/// `cuMemUnmap`.
pub(crate) fn mem_unmap(p: CUdeviceptr, size: usize) -> Result<()> {
    // SAFETY: `p..p+size` was mapped by this process with cuMemMap.
    check(unsafe { sys::cuMemUnmap(p, size) }, "cuMemUnmap")
}

/// `cuMemSetAccess`: read/write for device `ordinal`.
pub(crate) fn set_access_rw(p: CUdeviceptr, size: usize, ordinal: u32) -> Result<()> {
    let desc = CUmemAccessDesc {
        location: device_location(ordinal),
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `p..p+size` is mapped; one descriptor is passed.
    check(unsafe { sys::cuMemSetAccess(p, size, &desc, 1) }, "cuMemSetAccess")
}

/// `cuMemsetD8` (synchronous with respect to the host for device memory).
pub(crate) fn memset_d8(p: CUdeviceptr, value: u8, size: usize) -> Result<()> {
    // SAFETY: `p..p+size` is device memory mapped read/write for the current context.
    check(unsafe { sys::cuMemsetD8_v2(p, value, size) }, "cuMemsetD8")
}

/// `cuStreamSynchronize` (a null stream is the legacy default stream of the current context).
pub(crate) fn stream_synchronize(s: CUstream) -> Result<()> {
    // SAFETY: `s` is a live stream of the bound context, or null for its default stream.
    check(unsafe { sys::cuStreamSynchronize(s) }, "cuStreamSynchronize")
}

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

/// `cuMemHostAlloc`: pinned host memory with `flags`.
pub(crate) fn host_alloc(size: usize, flags: u32) -> Result<*mut c_void> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: writes one pointer; the caller bound a context.
    check(unsafe { sys::cuMemHostAlloc(&mut p, size, flags) }, "cuMemHostAlloc")?;
    if p.is_null() {
        return Err(Error::Cuda { operation: "cuMemHostAlloc".into(), message: "driver returned null".into() });
    }
    Ok(p)
}

/// `cuMemFreeHost`.
pub(crate) fn host_free(p: *mut c_void) -> Result<()> {
    // SAFETY: `p` came from cuMemHostAlloc and is freed once.
    check(unsafe { sys::cuMemFreeHost(p) }, "cuMemFreeHost")
}

/// `cuMemHostGetDevicePointer`: the device address of mapped pinned host memory.
pub(crate) fn host_device_pointer(p: *mut c_void) -> Result<CUdeviceptr> {
    let mut d: CUdeviceptr = 0;
    // SAFETY: `p` is pinned, device-mapped host memory; writes one address.
    check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) }, "cuMemHostGetDevicePointer")?;
    Ok(d)
}
