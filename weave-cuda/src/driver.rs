//! Checked wrappers over the `cudarc::driver::sys` calls weave makes outside cudarc's safe API.
//!
//! Every wrapper turns a failing `CUresult` into [`Error::Cuda`] naming the call. None of them
//! may run before [`ensure_driver`] succeeded: with dynamic loading, a call into a library that
//! is absent (or lacks the symbol) panics inside cudarc instead of returning an error.
//!
//! The public wrappers only read: driver presence and version, device count, attributes and
//! PCI bus ids, plus the error helpers transports use for their own calls. The ones that create,
//! map or free memory stay inside this crate, behind the owning types
//! ([`VmmMapping`](crate::VmmMapping), [`PinnedHostMemory`](crate::PinnedHostMemory)).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use comm_core::error::{Error, Result};
use cudarc::driver::sys::{
    self, CUdevice, CUdevice_attribute, CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc,
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult, CUstream,
};

/// Oldest driver API version (`cuDriverGetVersion`) this crate uses: 12.0. The VMM, export and
/// `_v2` stream-memop entry points are all older, so a newer driver has every symbol we call.
pub const MIN_DRIVER_VERSION: i32 = 12000;

/// Whether a CUDA driver library can be loaded (probed once per process, without touching a
/// driver symbol).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen the candidate library names and closes
    // what it opened; it calls no driver function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `NAME (code): description` for a driver result code.
pub fn describe(r: CUresult) -> String {
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
pub fn error(operation: &str, r: CUresult) -> Error {
    Error::Cuda { operation: operation.to_string(), message: describe(r) }
}

/// `Ok(())` for `CUDA_SUCCESS`, else [`Error::Cuda`] naming `operation`.
pub fn check(r: CUresult, operation: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(error(operation, r)) }
}

/// Wraps an error of cudarc's safe API.
pub fn from_driver(operation: &str, e: cudarc::driver::DriverError) -> Error {
    error(operation, e.0)
}

/// Loads the driver, initializes it and checks its version. [`Error::Unsupported`] when there
/// is no driver, no device, or a driver older than [`MIN_DRIVER_VERSION`].
pub fn ensure_driver() -> Result<()> {
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
            "CUDA driver API version {version} is older than {MIN_DRIVER_VERSION} (CUDA 12.0), which weave's \
             GPU layer needs for exportable memory and stream memory operations; update the NVIDIA driver"
        )));
    }
    Ok(())
}

/// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
pub fn driver_version() -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    check(unsafe { sys::cuDriverGetVersion(&mut v) }, "cuDriverGetVersion")?;
    Ok(v)
}

/// `cuDeviceGetCount`.
pub fn device_count() -> Result<usize> {
    let mut n: c_int = 0;
    // SAFETY: writes one int through a valid pointer; the driver was initialized by the caller.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// `cuDeviceGetAttribute`.
pub fn attribute(dev: CUdevice, attr: CUdevice_attribute) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer; `dev` came from the driver.
    check(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) }, "cuDeviceGetAttribute")?;
    Ok(v)
}

/// `cuDeviceGetPCIBusId`: `domain:bus:device.function`.
pub fn pci_bus_id(dev: CUdevice) -> Result<String> {
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
pub fn native_atomics_with(dev: CUdevice, peer_bus_id: &str) -> Result<Option<bool>> {
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

/// `cuMemsetD8Async` on stream `s`.
pub(crate) fn memset_d8_async(p: CUdeviceptr, value: u8, size: usize, s: CUstream) -> Result<()> {
    // SAFETY: `p..p+size` is device memory mapped read/write for the current context; `s` is a
    // live stream of it.
    check(unsafe { sys::cuMemsetD8Async(p, value, size, s) }, "cuMemsetD8Async")
}

/// `cuStreamSynchronize`.
pub(crate) fn stream_synchronize(s: CUstream) -> Result<()> {
    // SAFETY: `s` is a live stream of the bound context.
    check(unsafe { sys::cuStreamSynchronize(s) }, "cuStreamSynchronize")
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

/// `cuMemHostRegister`: page-locks `size` bytes at `p` and maps them for the device.
pub(crate) fn host_register(p: *mut c_void, size: usize, flags: u32) -> Result<()> {
    // SAFETY: the caller passes memory it owns for `size` bytes and keeps alive until
    // `host_unregister`; the caller bound a context.
    check(unsafe { sys::cuMemHostRegister_v2(p, size, flags) }, "cuMemHostRegister")
}

/// `cuMemHostUnregister`.
pub(crate) fn host_unregister(p: *mut c_void) -> Result<()> {
    // SAFETY: `p` was registered by `host_register` and is unregistered once.
    check(unsafe { sys::cuMemHostUnregister(p) }, "cuMemHostUnregister")
}

/// `cuMemHostGetDevicePointer`: the device address of mapped pinned host memory.
pub(crate) fn host_device_pointer(p: *mut c_void) -> Result<CUdeviceptr> {
    let mut d: CUdeviceptr = 0;
    // SAFETY: `p` is pinned, device-mapped host memory; writes one address.
    check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) }, "cuMemHostGetDevicePointer")?;
    Ok(d)
}

/// While alive, this thread's stream-capture mode is *relaxed*: setup work that is not stream
/// work (allocations, module loads, synchronous copies on streams of its own) may run while the
/// caller's stream captures a CUDA graph, as the first collective captured into a graph needs.
/// Dropping it restores the thread's previous mode.
#[derive(Debug)]
pub struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    /// Switches this thread to relaxed capture mode.
    pub fn enter() -> Result<Self> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid, writable mode value; the call only swaps this thread's mode.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, "cuThreadExchangeStreamCaptureMode")?;
        Ok(RelaxedCapture { previous: mode })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut mode = self.previous;
        // SAFETY: as in `enter`; restoring a mode the driver gave us cannot fail in a way we
        // could act on here.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}
