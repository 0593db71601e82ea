//! # weave-cuda
//!
//! The CUDA layer every GPU part of weave shares, so GPU transports do not depend on each
//! other: `transport-cudaipc` today, the network transports staging GPU memory later, and the
//! GPU executors of `collectives`, which build the handles the kernels receive. It owns:
//!
//! - [`driver`]: checked wrappers over the driver calls made outside cudarc's safe API, the
//!   driver probe ([`driver_available`]) and version check, and the error mapping (every driver
//!   failure is an [`Error::Cuda`] naming the call);
//! - [`CudaDevice`]: one device's primary context, what it supports (cuMem allocations
//!   exportable as POSIX file descriptors, GPUDirect RDMA on them), its granularity, PCI bus id
//!   and NVLink reachability of other devices;
//! - [`DeviceRegion`]: device memory registered with a communicator, either a cuMem allocation
//!   made here ([`DeviceAllocation`]: pinned, exportable, RDMA-capable where the device is,
//!   mapped by a [`VmmMapping`], zeroed) or memory a transport keeps mapped
//!   ([`RegionBacking`]: a peer's memory it imported, user memory it registered);
//! - [`PinnedHostMemory`]: pinned host memory mapped into the device;
//! - [`DeviceStatus`]: the device error and abort words kernels report into and poll;
//! - [`StreamMemory`]: a temporary of one call, allocated and freed in stream order;
//! - [`PrivateStream`]: a stream of weave's own, made without synchronizing the context;
//! - the device-handle builders [`device_semaphore`] and [`memory_channel_handle`] (with
//!   [`PacketBuffers`]), which check every address against the [`DeviceRegion`]s behind the
//!   registrations.
//!
//! What is particular to one transport stays there: how memory is exported and imported
//! between processes (file-descriptor passing, legacy IPC handles, the import cache, and
//! their driver calls), its endpoint, connections (for CUDA IPC: copy-engine streams) and
//! backend. A transport hands this crate's types what it mapped by implementing
//! [`RegionBacking`], so the handle builders accept memory from any GPU transport.
//!
//! The driver is loaded at run time (cudarc's dynamic loading): this crate builds and runs on
//! hosts without CUDA. [`driver_available`] probes for the driver without touching a driver
//! symbol (with dynamic loading, calling a missing symbol panics); everything that calls the
//! driver goes through [`driver::ensure_driver`] or a [`CudaContext`] first.

pub mod driver;

mod allocation;
mod device;
mod fifo_storage;
mod handles;
mod host_memory;
mod private_stream;
mod region;
mod status;
mod stream_memory;

use comm_core::error::{Error, Result};

pub use crate::allocation::{DeviceAllocation, VmmMapping};
pub use crate::device::{CudaDevice, bind};
pub use crate::fifo_storage::PinnedFifoStorage;
pub use crate::handles::{PacketBuffers, device_semaphore, memory_channel_handle};
pub use crate::host_memory::PinnedHostMemory;
pub use crate::private_stream::PrivateStream;
pub use crate::region::{DeviceRegion, RegionBacking};
pub use crate::status::DeviceStatus;
pub use crate::stream_memory::StreamMemory;
pub use cudarc::driver::CudaContext;

/// Whether a CUDA driver library can be loaded here. Probes once per process by trying to open
/// `libcuda`, without calling into it; `false` on CPU-only hosts.
pub fn driver_available() -> bool {
    driver::driver_present()
}

/// Number of CUDA devices this process sees: 0 when there is no driver or the driver finds no
/// device; [`Error::Cuda`] when the driver fails otherwise.
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Ok(0);
    }
    match driver::ensure_driver() {
        Ok(()) => driver::device_count(),
        Err(Error::Unsupported(m)) if m.starts_with("no CUDA device") => Ok(0),
        // An old driver still counts its devices.
        Err(Error::Unsupported(_)) => driver::device_count(),
        Err(e) => Err(e),
    }
}
