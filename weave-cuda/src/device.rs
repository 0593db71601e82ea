//! One CUDA device as weave uses it: its primary context, what it supports (cuMem allocations
//! exportable as POSIX file descriptors, GPUDirect RDMA on them), its allocation granularity and
//! PCI bus id.

use std::sync::Arc;

use comm_core::error::{Error, Result};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute;

use crate::driver;
use crate::region::DeviceRegion;
use crate::status::DeviceStatus;

/// A CUDA device opened for weave: the primary context of one device ordinal, checked to
/// support virtual memory management with allocations exportable as POSIX file descriptors.
/// Every allocation made through it ([`allocate`](Self::allocate)) is pinned, exportable,
/// granularity-rounded and, where the device supports GPUDirect RDMA on cuMem memory, requested
/// RDMA-capable (so a NIC may register it later).
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    ordinal: u32,
    rdma_capable: bool,
    granularity: usize,
    pci_bus_id: String,
}

comm_core::debug_fields!(CudaDevice { ordinal, pci_bus_id, rdma_capable, granularity });

impl CudaDevice {
    /// Opens device `ordinal` (as this process numbers its visible devices): loads and checks
    /// the driver ([`driver::ensure_driver`]), retains the primary context and reads what the
    /// device supports. [`Error::Unsupported`] when there is no driver or no device, the driver
    /// is older than CUDA 12, or the device lacks cuMem allocations exportable as POSIX file
    /// descriptors; [`Error::Cuda`] naming the call for other driver failures.
    pub fn open(ordinal: u32) -> Result<Self> {
        driver::ensure_driver()?;
        let ctx = CudaContext::new(ordinal as usize).map_err(|e| driver::from_driver("cuDevicePrimaryCtxRetain", e))?;
        let dev = ctx.cu_device();
        let supported = |attr| driver::attribute(dev, attr).map(|v| v != 0);
        if !supported(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? {
            return Err(Error::Unsupported(format!(
                "CUDA device {ordinal} does not support virtual memory management (cuMem)"
            )));
        }
        if !supported(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? {
            return Err(Error::Unsupported(format!(
                "CUDA device {ordinal} cannot export allocations as POSIX file descriptors"
            )));
        }
        let rdma_capable =
            supported(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED).unwrap_or(false);
        let granularity = driver::granularity(&driver::allocation_prop(ordinal, rdma_capable))?;
        let pci_bus_id = driver::pci_bus_id(dev)?;
        Ok(CudaDevice { ctx, ordinal, rdma_capable, granularity, pci_bus_id })
    }

    /// The device's primary context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device ordinal, as this process numbers its visible devices.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The PCI bus id of the device (`domain:bus:device.function`).
    pub fn pci_bus_id(&self) -> &str {
        &self.pci_bus_id
    }

    /// The allocation granularity: device allocations are rounded up to a multiple of it.
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// Whether allocations are requested GPUDirect-RDMA-capable (the device supports RDMA on
    /// cuMem memory).
    pub fn rdma_capable(&self) -> bool {
        self.rdma_capable
    }

    /// Makes the device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        bind(&self.ctx)
    }

    /// Whether this device reaches the device at PCI bus id `peer_bus_id` over NVLink, judged
    /// by native peer atomics, which NVLink has and PCIe peer access has not. False when this
    /// process does not see that device, so callers that need NVLink stay on the safe side.
    pub fn nvlink_with(&self, peer_bus_id: &str) -> Result<bool> {
        Ok(driver::native_atomics_with(self.ctx.cu_device(), peer_bus_id)?.unwrap_or(false))
    }

    /// Allocates `len` bytes (at least one granule) of device memory, pinned and exportable,
    /// mapped read/write for this device and zeroed. `owner` tags the allocation with whoever
    /// asked for it (a transport backend's id), so that one exports only its own allocations.
    pub fn allocate(&self, len: usize, owner: u64) -> Result<DeviceRegion> {
        self.bind()?;
        let prop = driver::allocation_prop(self.ordinal, self.rdma_capable);
        DeviceRegion::allocate(&self.ctx, self.ordinal, len, &prop, self.granularity, owner)
    }

    /// Host-visible status words for kernels on this device.
    pub fn device_status(&self) -> Result<DeviceStatus> {
        DeviceStatus::new(&self.ctx)
    }
}

/// Makes `ctx` current on the calling thread.
pub fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().map_err(|e| driver::from_driver("cuCtxSetCurrent (bind device context)", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_driver_is_unsupported_and_never_panics() {
        let r = CudaDevice::open(0);
        if !crate::driver_available() {
            println!("branch: no CUDA driver here; open must be Unsupported");
            assert!(matches!(&r, Err(Error::Unsupported(m)) if m.contains("no CUDA driver")), "{:?}", r.err());
            assert_eq!(crate::device_count().unwrap(), 0);
        } else {
            println!("branch: a CUDA driver is present; open(0) gave {:?}", r.as_ref().err());
            // With a driver, open either works or says why not.
            match r {
                Ok(d) => assert!(d.granularity().is_power_of_two() && d.ordinal() == 0),
                Err(e) => assert!(matches!(e, Error::Unsupported(_) | Error::Cuda { .. }), "{e}"),
            }
        }
    }
}
