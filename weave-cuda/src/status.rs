//! The device status words: where kernels report that they gave up, where the host asks them
//! to stop, and how far the GPU got in a communicator's device calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use comm_core::device::{DeviceError, DeviceStatusHandle};
use comm_core::error::Result;
use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute;

use crate::driver;
use crate::host_memory::PinnedHostMemory;

/// Bytes of pinned memory behind a [`DeviceStatus`]: the error word at 0, the abort word at
/// [`ABORT_OFFSET`] (its own cache line, so kernels polling it do not share the error's line),
/// the progress word at [`PROGRESS_OFFSET`] (a line of its own too).
const STATUS_BYTES: usize = 192;
const ABORT_OFFSET: usize = 64;
const PROGRESS_OFFSET: usize = 128;
/// Assumed SM clock when the driver reports none (kHz).
const FALLBACK_CLOCK_KHZ: u64 = 2_000_000;

/// Where kernels report that they gave up, where the host asks them to stop, and where they
/// say which call has started: two `u32` words and a `u64` in pinned host memory mapped into
/// the device ([`PinnedHostMemory`]), readable by the host at any time without synchronizing.
pub struct DeviceStatus {
    words: PinnedHostMemory,
    clock_khz: u64,
}

impl std::fmt::Debug for DeviceStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStatus")
            .field("device_ptr", &format_args!("{:#x}", self.words.device_ptr()))
            .field("clock_khz", &self.clock_khz)
            .field("error_code", &self.error_code())
            .field("aborted", &self.is_aborted())
            .field("started_call", &self.started_call())
            .finish()
    }
}

/// `timeout` in cycles of a `clock_khz` clock, saturating at `u64::MAX`.
pub(crate) fn timeout_cycles(clock_khz: u64, timeout: Duration) -> u64 {
    let cycles = u128::from(clock_khz) * 1000 * timeout.as_nanos() / 1_000_000_000;
    u64::try_from(cycles).unwrap_or(u64::MAX)
}

impl DeviceStatus {
    /// Allocates the status words for kernels running on `ctx`'s device (all start at 0).
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let clock_khz = match driver::attribute(ctx.cu_device(), CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE) {
            Ok(k) if k > 0 => k as u64,
            _ => FALLBACK_CLOCK_KHZ,
        };
        let words = PinnedHostMemory::new(ctx, STATUS_BYTES)?;
        Ok(DeviceStatus { words, clock_khz })
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offset is 0 or ABORT_OFFSET, inside the STATUS_BYTES block, 4-byte aligned (the
        // block is page-aligned); the block lives as long as `self`, and kernels only access
        // these words with atomic or volatile 4-byte operations.
        unsafe { AtomicU32::from_ptr(self.words.host_ptr().add(offset).cast::<u32>()) }
    }

    /// The handle a kernel receives: the device addresses of both words and `timeout` in GPU
    /// clock cycles (at the device's reported clock, `CU_DEVICE_ATTRIBUTE_CLOCK_RATE`;
    /// saturating).
    /// Kernels given it report no progress; [`handle_for_call`](Self::handle_for_call) gives
    /// the handle of a collective's launch.
    pub fn handle(&self, timeout: Duration) -> DeviceStatusHandle {
        DeviceStatusHandle {
            error: self.words.device_ptr(),
            abort: self.words.device_ptr() + ABORT_OFFSET as u64,
            timeout_cycles: timeout_cycles(self.clock_khz, timeout),
            progress: 0,
            call: 0,
        }
    }

    /// [`handle`](Self::handle) for a launch of call `call` (the ledger's number of the latest
    /// collective begun): its kernel stores `call` into the progress word when it starts (see
    /// [`started_call`](Self::started_call)).
    pub fn handle_for_call(&self, timeout: Duration, call: u64) -> DeviceStatusHandle {
        DeviceStatusHandle { progress: self.words.device_ptr() + PROGRESS_OFFSET as u64, call, ..self.handle(timeout) }
    }

    /// The latest call whose kernel has started on the GPU (0 before the first): behind the
    /// latest call launched while the GPU is still on work queued before it. A CUDA graph
    /// replays the call numbers it captured.
    pub fn started_call(&self) -> u64 {
        self.progress_word().load(Ordering::Acquire)
    }

    fn progress_word(&self) -> &AtomicU64 {
        // SAFETY: PROGRESS_OFFSET is 8-byte aligned inside the STATUS_BYTES block (page-aligned),
        // which lives as long as `self`; kernels only store to it with 8-byte atomic stores.
        unsafe { AtomicU64::from_ptr(self.words.host_ptr().add(PROGRESS_OFFSET).cast::<u64>()) }
    }

    /// The raw error word (0 = no error).
    pub fn error_code(&self) -> u32 {
        self.word(0).load(Ordering::Acquire)
    }

    /// What a kernel reported, if anything (`None` also for codes this build does not know;
    /// [`error_code`](Self::error_code) shows those).
    pub fn error(&self) -> Option<DeviceError> {
        DeviceError::from_code(self.error_code())
    }

    /// Resets the error and abort words (between launches, with no kernel using them).
    pub fn clear(&self) {
        self.word(0).store(0, Ordering::Release);
        self.word(ABORT_OFFSET).store(0, Ordering::Release);
    }

    /// Asks running kernels to stop: their spins see the abort word and return.
    pub fn abort(&self) {
        self.word(ABORT_OFFSET).store(1, Ordering::Release);
    }

    /// True once [`abort`](Self::abort) was called (and not cleared).
    pub fn is_aborted(&self) -> bool {
        self.word(ABORT_OFFSET).load(Ordering::Acquire) != 0
    }

    /// The device clock rate used for cycle budgets, in kHz.
    pub fn clock_khz(&self) -> u64 {
        self.clock_khz
    }
}

/// The ledger reads how far the GPU got from the progress word.
impl comm_core::ledger::DeviceProgress for DeviceStatus {
    fn started_call(&self) -> u64 {
        DeviceStatus::started_call(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_saturate_and_scale() {
        assert_eq!(timeout_cycles(1_000_000, Duration::from_secs(1)), 1_000_000_000);
        assert_eq!(timeout_cycles(1_980_000, Duration::from_millis(500)), 990_000_000);
        assert_eq!(timeout_cycles(2_000_000, Duration::from_secs(u64::MAX)), u64::MAX);
        assert_eq!(timeout_cycles(0, Duration::from_secs(5)), 0);
    }
}
