//! A stream of weave's own: [`PrivateStream`].

use std::sync::Arc;

use comm_core::error::Result;
use cudarc::driver::sys::{self, CUstream};
use cudarc::driver::{CudaContext, CudaStream};

use crate::driver::{check, from_driver};

/// A non-blocking stream weave makes for work of its own (filling a table, zeroing a buffer),
/// made without cudarc's synchronization of the whole context at a context handle's first
/// stream: that would wait for every stream of the program, and is not allowed while one of
/// them is being captured into a CUDA graph (a communicator's first call may be). Its work
/// is ordered with nothing else; [`stream`](Self::stream) hands out a cudarc wrapper for it.
///
/// The stream is destroyed when this drops: whatever holds the wrapper (buffers allocated on
/// it) must drop first, as a field declared before this one does.
pub struct PrivateStream {
    stream: Arc<CudaStream>,
    raw: CUstream,
}

// SAFETY: a CUstream is a handle the driver accepts from any thread; the wrapper is Send + Sync.
unsafe impl Send for PrivateStream {}
// SAFETY: as above; nothing is mutated through a shared reference.
unsafe impl Sync for PrivateStream {}

impl PrivateStream {
    /// A new non-blocking stream of `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread().map_err(|e| from_driver("bind the context of a stream of weave's own", e))?;
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: writes one stream handle; the context is bound.
        check(unsafe { sys::cuStreamCreate(&mut raw, flags) }, "cuStreamCreate (a stream of weave's own)")?;
        // SAFETY: `raw` is a live stream of `ctx`, destroyed only when this drops, after the
        // holders of the wrapper (see the type's doc); work through it is ordered by its users.
        let stream = unsafe { ctx.wrap_borrowed_stream(raw) };
        Ok(PrivateStream { stream, raw })
    }

    /// The stream, as cudarc's wrapper.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Drop for PrivateStream {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: the stream is live and destroyed once; work still queued on it completes
        // before the driver releases it.
        let r = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(target: comm_core::diagnostics::KERNELS, "cuStreamDestroy of a stream of weave's own failed: {r:?}");
        }
    }
}
