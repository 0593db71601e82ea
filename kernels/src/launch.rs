//! Passing comm-core device handles to kernels.
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

use comm_core::device::{DeviceSemaphoreHandle, DeviceStatusHandle, MemoryChannelDeviceHandle};
use comm_core::fifo::FifoDeviceHandle;
use comm_core::port_channel::PortChannelDeviceHandle;
use cudarc::driver::DeviceRepr;

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
