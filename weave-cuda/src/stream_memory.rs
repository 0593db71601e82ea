//! Device memory in stream order: [`StreamMemory`].

use std::sync::Arc;

use comm_core::error::Result;
use cudarc::driver::CudaStream;
use cudarc::driver::sys::{self, CUdeviceptr};

use crate::driver::{check, from_driver};

/// Device memory allocated on a stream (`cuMemAllocAsync`, from the device's default pool) and
/// freed on it when dropped (`cuMemFreeAsync`): usable by the work queued on the stream after
/// the allocation, returned to the pool after the work queued before the drop. Both are stream
/// work, so a stream being captured into a CUDA graph captures them too. For temporaries of one
/// call, which no other stream touches.
#[derive(Debug)]
pub struct StreamMemory {
    address: CUdeviceptr,
    bytes: usize,
    stream: Arc<CudaStream>,
}

impl StreamMemory {
    /// Allocates `bytes` (at least one) on `stream`.
    pub fn alloc(bytes: usize, stream: &Arc<CudaStream>) -> Result<Self> {
        stream.context().bind_to_thread().map_err(|e| from_driver("bind the stream's context", e))?;
        let mut address: CUdeviceptr = 0;
        // SAFETY: writes one device address; the stream is live (held by the Arc).
        let r = unsafe { sys::cuMemAllocAsync(&mut address, bytes.max(1), stream.cu_stream()) };
        check(r, &format!("cuMemAllocAsync of {bytes} bytes (stream-ordered temporary)"))?;
        Ok(StreamMemory { address, bytes, stream: stream.clone() })
    }

    /// The device address of the first byte (aligned as `cuMemAllocAsync` aligns: 256 bytes or
    /// more).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Bytes allocated.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True when zero bytes were asked for (one is allocated all the same).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for StreamMemory {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: `address` came from cuMemAllocAsync on this stream; the work using it was
        // queued on the stream before this point, and the free waits for it in stream order.
        let r = unsafe { sys::cuMemFreeAsync(self.address, self.stream.cu_stream()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(
                target: comm_core::diagnostics::KERNELS,
                "cuMemFreeAsync of a {} B stream-ordered temporary failed: {}",
                self.bytes,
                crate::driver::describe(r)
            );
        }
    }
}
