//! The few CUDA driver calls the shim makes itself: which device the caller selected, memory
//! for `ncclMemAlloc`, device-to-device copies for sends to self, and events that order work
//! of one communicator across the caller's streams.

use std::ffi::c_void;

use comm_core::Result;
use cudarc::driver::sys::{self, CUcontext, CUdeviceptr, CUstream};
use weave_cuda::driver::{check, ensure_driver};

/// The device of the caller's current context, as the CUDA runtime's `cudaGetDevice` reports
/// it: the current context's device, or device 0 when the thread has none yet (the runtime
/// would make device 0's primary context current at its first call).
pub fn current_device() -> Result<u32> {
    ensure_driver()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle; the driver is initialized (ensure_driver).
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    if ctx.is_null() {
        return Ok(0);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device ordinal for the current (non-null) context.
    check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
    Ok(dev as u32)
}

/// The thread's current context, to put back after weave bound its own: `None` when the driver
/// is absent or not initialized (nothing to put back), else the context, null where the thread
/// had none.
pub struct SavedContext(Option<CUcontext>);

impl SavedContext {
    /// Remembers the current context.
    pub fn save() -> Self {
        if !weave_cuda::driver_available() {
            return SavedContext(None);
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle (or fails harmlessly before cuInit).
        let asked = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        SavedContext((asked == sys::CUresult::CUDA_SUCCESS).then_some(ctx))
    }
}

impl Drop for SavedContext {
    fn drop(&mut self) {
        let Some(saved) = self.0 else { return };
        let mut now: CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle; the driver was initialized when `saved` was read.
        let asked = unsafe { sys::cuCtxGetCurrent(&mut now) };
        if asked != sys::CUresult::CUDA_SUCCESS || now != saved {
            // SAFETY: `saved` was current on this thread moments ago and is still alive
            // (primary contexts live as long as the process retains them), or is null, which
            // leaves the thread without a context, as it was.
            let _ = unsafe { sys::cuCtxSetCurrent(saved) };
        }
    }
}

/// Makes device `ordinal`'s primary context current on this thread when none is (what the
/// runtime does at a thread's first call).
pub fn ensure_context() -> Result<()> {
    ensure_driver()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    if ctx.is_null() {
        weave_cuda::CudaContext::new(0)
            .and_then(|c| c.bind_to_thread())
            .map_err(|e| weave_cuda::driver::from_driver("make device 0's primary context current", e))?;
    }
    Ok(())
}

/// `cuMemAlloc` in the current context.
pub fn mem_alloc(bytes: usize) -> Result<*mut c_void> {
    ensure_context()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: writes one device address; a context is current.
    check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) }, "cuMemAlloc")?;
    Ok(p as *mut c_void)
}

/// `cuMemFree`.
pub fn mem_free(p: *mut c_void) -> Result<()> {
    ensure_context()?;
    // SAFETY: the caller passes an address from `mem_alloc`; the driver checks it.
    check(unsafe { sys::cuMemFree_v2(p as CUdeviceptr) }, "cuMemFree")
}

/// Device-to-device copy of `bytes` on `stream` (the integer value of its `CUstream` handle).
///
/// # Safety
/// Both ranges must be device memory valid for `bytes` until the copy completes.
pub unsafe fn copy_async(dst: u64, src: u64, bytes: usize, stream: usize) -> Result<()> {
    let stream = stream as CUstream;
    if bytes == 0 || dst == src {
        return Ok(());
    }
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream) }, "cuMemcpyAsync (send to self)")
}

/// Makes `waiter` wait for the work enqueued on `on` so far, through an event of its own
/// (recording and waiting are both allowed during stream capture).
pub fn order_after(waiter: usize, on: usize) -> Result<()> {
    if waiter == on {
        return Ok(());
    }
    let mark = EndMark::new()?;
    mark.record(on)?;
    mark.make_wait(waiter)
}

/// `CU_STREAM_PER_THREAD` (`cudaStreamPerThread`): the calling thread's default stream, the same
/// handle on every thread for a different stream on each.
pub const PER_THREAD_STREAM: usize = 0x2;

/// `CU_STREAM_LEGACY` (`cudaStreamLegacy`): the legacy default stream, as `NULL` names it where
/// the program is not built for per-thread default streams.
pub const LEGACY_STREAM: usize = 0x1;

/// An event that marks where a communicator's last batch of calls ends on its stream. A later
/// call on another stream waits for the event, never for that stream: the program may destroy a
/// stream once its work is done (NCCL never looks at a stream again after its call), and an
/// event recorded on it stays valid. [`order_after`] uses one for a moment to order the streams
/// of one group.
pub struct EndMark {
    event: sys::CUevent,
}

// SAFETY: a CUevent is a handle the driver accepts from any thread; the mark is used under its
// communicator's lock only.
unsafe impl Send for EndMark {}

impl EndMark {
    /// An event of the current context, without timing.
    pub fn new() -> Result<Self> {
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: writes one event handle; the caller made the communicator's context current.
        let created = unsafe { sys::cuEventCreate(&mut event, flags) };
        check(created, "cuEventCreate (an event ordering the communicator's streams)")?;
        Ok(EndMark { event })
    }

    /// Marks the end of the work enqueued on `stream` so far.
    pub fn record(&self, stream: usize) -> Result<()> {
        // SAFETY: the event is live; `stream` is the caller's live stream of this context.
        check(
            unsafe { sys::cuEventRecord(self.event, stream as CUstream) },
            "cuEventRecord (marking the end of the communicator's work on a stream)",
        )
    }

    /// Makes `waiter` wait for the work the last [`record`](Self::record) marked.
    pub fn make_wait(&self, waiter: usize) -> Result<()> {
        // SAFETY: the event is live; `waiter` is the caller's live stream of this context.
        check(
            unsafe { sys::cuStreamWaitEvent(waiter as CUstream, self.event, 0) },
            "cuStreamWaitEvent (ordering a stream after the communicator's work on another)",
        )
    }
}

impl EndMark {
    /// Inside a stream capture: a node of the graph that marks, each time the graph runs, the
    /// end of the work captured on `stream` so far (an external record, as NCCL orders its
    /// graph launches with its eager calls).
    pub fn record_in_graph(&self, stream: usize) -> Result<()> {
        let external = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: the event is live; `stream` is the caller's live stream, being captured.
        check(
            unsafe { sys::cuEventRecordWithFlags(self.event, stream as CUstream, external) },
            "cuEventRecordWithFlags (marking the end of the communicator's work in a CUDA graph)",
        )
    }

    /// Inside a stream capture: a node of the graph that makes each run of the graph wait, on
    /// `stream`, for the work the mark's latest record marks when the graph is launched (an
    /// external wait).
    pub fn make_wait_in_graph(&self, stream: usize) -> Result<()> {
        let external = sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32;
        // SAFETY: the event is live; `stream` is the caller's live stream, being captured.
        check(
            unsafe { sys::cuStreamWaitEvent(stream as CUstream, self.event, external) },
            "cuStreamWaitEvent (ordering a CUDA graph after the communicator's earlier work)",
        )
    }
}

impl Drop for EndMark {
    fn drop(&mut self) {
        // SAFETY: the event is live and dropped once; the driver frees it once pending work
        // that waits for it is done.
        unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}

/// Waits for all work of the current context (bounded: weave's kernels give up after
/// `WEAVE_TIMEOUT` or on abort).
pub fn synchronize_context(ctx: &weave_cuda::CudaContext) -> Result<()> {
    ctx.synchronize().map_err(|e| weave_cuda::driver::from_driver("cuCtxSynchronize", e))
}

/// Whether `stream` is being captured into a CUDA graph.
pub fn is_capturing(stream: usize) -> Result<bool> {
    let stream = stream as CUstream;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: writes one status value; `stream` is the caller's live stream.
    check(unsafe { sys::cuStreamIsCapturing(stream, &mut status) }, "cuStreamIsCapturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
