//! Launching kernels: [`launch_with_args`] starts a kernel that takes one argument block by
//! value, on a grid of [`LaunchShape`], optionally overlapped with the kernel before it; and
//! comm-core device handles passed as kernel arguments.
//!
//! cudarc launches take arguments that implement its `DeviceRepr`; the orphan rule forbids
//! implementing it here for comm-core's types, so [`KernelArg`] wraps them: a
//! `#[repr(transparent)]` newtype whose bytes are exactly the handle's, for the handle types
//! listed by [`DeviceHandle`].
//!
//! ```ignore
//! let status = KernelArg(status_handle);
//! let mut launch = stream.launch_builder(&function);
//! launch.arg(&status);
//! ```

use std::sync::Arc;

use comm_core::device::{DeviceSemaphoreHandle, DeviceStatusHandle, MemoryChannelDeviceHandle};
use comm_core::fifo::FifoDeviceHandle;
use comm_core::port_channel::PortChannelDeviceHandle;
use comm_core::{Error, Result};
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

/// The grid of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    /// Thread blocks (at least one is launched).
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
    /// Programmatic stream serialization: the GPU may start the kernel while the one before it
    /// on the stream still runs. Only for kernels that wait for their predecessor in their first
    /// instruction (every direct collective kernel on sm_90 and later does).
    pub overlapped: bool,
}

/// Launches `f(args)` on `stream`: one argument block, passed by value.
///
/// # Safety
/// `f` must take exactly one parameter whose device type has `A`'s layout (and, when
/// `shape.overlapped`, begin by waiting for its predecessor); every device address inside
/// `args` must be valid for what the kernel does with it until it completes on `stream`.
pub unsafe fn launch_with_args<A: DeviceRepr>(
    f: &CudaFunction,
    args: &A,
    shape: LaunchShape,
    stream: &Arc<CudaStream>,
    name: &dyn std::fmt::Display,
) -> Result<()> {
    if shape.overlapped {
        // SAFETY: forwarded from the caller.
        return unsafe { launch_overlapped(f, args, shape, stream) }
            .map_err(|e| Error::Cuda { operation: format!("launch {name} (overlapped)"), message: e });
    }
    let cfg =
        LaunchConfig { grid_dim: (shape.blocks.max(1), 1, 1), block_dim: (shape.threads, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(f);
    launch.arg(args);
    // SAFETY: the kernel's one parameter has `A`'s layout and the caller guarantees the
    // addresses inside it.
    unsafe { launch.launch(cfg) }
        .map(|_| ())
        .map_err(|e| Error::Cuda { operation: format!("launch {name}"), message: e.to_string() })
}

/// [`launch_with_args`] with programmatic stream serialization, through `cuLaunchKernelEx`.
///
/// # Safety
/// As [`launch_with_args`].
unsafe fn launch_overlapped<A: DeviceRepr>(
    f: &CudaFunction,
    args: &A,
    shape: LaunchShape,
    stream: &Arc<CudaStream>,
) -> std::result::Result<(), String> {
    use cudarc::driver::sys;
    stream.context().bind_to_thread().map_err(|e| e.to_string())?;
    let mut attribute = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    };
    attribute.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: shape.blocks.max(1),
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: shape.threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream.cu_stream(),
        attrs: &mut attribute,
        numAttrs: 1,
    };
    let mut params = [std::ptr::from_ref(args).cast_mut().cast::<std::ffi::c_void>()];
    // SAFETY: config and params outlive the call (the driver copies the parameter block); the
    // caller guarantees the kernel's signature and the addresses inside `args`.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(|e| e.to_string())
}

/// A comm-core `#[repr(C)]` handle with a C++ mirror in `weave/handles.cuh` that kernels take by
/// value.
///
/// # Safety
///
/// The type is `#[repr(C)]` plain data (no pointers the host owns, no padding that matters)
/// and has the same size, alignment and field offsets as its C++ mirror, which the generated
/// layout checks verify on every compile.
pub unsafe trait DeviceHandle: Copy + 'static {}

// SAFETY: each is a #[repr(C)] struct of u64/u32 fields, mirrored field for field in
// weave/handles.cuh and checked against comm_core::device::LAYOUTS at every compile.
unsafe impl DeviceHandle for DeviceSemaphoreHandle {}
// SAFETY: as above.
unsafe impl DeviceHandle for MemoryChannelDeviceHandle {}
// SAFETY: as above.
unsafe impl DeviceHandle for DeviceStatusHandle {}
// SAFETY: as above.
unsafe impl DeviceHandle for FifoDeviceHandle {}
// SAFETY: as above.
unsafe impl DeviceHandle for PortChannelDeviceHandle {}

/// A device handle as a kernel argument (see the [module docs](self)).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelArg<T: DeviceHandle>(pub T);

// SAFETY: KernelArg is repr(transparent) over a DeviceHandle, whose contract is that its bytes
// are exactly what the kernel's by-value parameter of the mirrored C++ type expects.
unsafe impl<T: DeviceHandle> DeviceRepr for KernelArg<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapper_is_transparent() {
        assert_eq!(std::mem::size_of::<KernelArg<PortChannelDeviceHandle>>(), 64);
        assert_eq!(std::mem::size_of::<KernelArg<MemoryChannelDeviceHandle>>(), 56);
        assert_eq!(std::mem::align_of::<KernelArg<DeviceStatusHandle>>(), 8);
    }
}
