//! Windows: user device memory that every rank of a communicator registers together, so that
//! collectives on buffers inside it read and write the peers' memory in place instead of
//! copying through the workspace ([`Window`], [`Communicator::register_window`]; NCCL's
//! `ncclCommWindowRegister` with `NCCL_WIN_COLL_SYMMETRIC`).
//!
//! A window belongs to the communicator that registered it: a call of another communicator on
//! the same memory does not see it (it copies, or uses a window of its own on that memory), so
//! one buffer may be a window of two communicators over the same ranks at once and be used from
//! two streams without cross-talk (their calls use separate workspaces). A call uses a window
//! when its buffers lie inside windows of its communicator; the ranks must then call with
//! buffers at the same offset in their windows (the symmetric contract), since each rank
//! decides alone.

use std::sync::Arc;

use comm_core::bootstrap::Bootstrap as _;
use comm_core::memory::MemoryKind;
use comm_core::{Error, Result};

use crate::api::communicator::Communicator;
use crate::exec::no_gpu;
use crate::gpu::{UserRange, WindowState};

/// What the ranks promise about the calls on a window ([`Communicator::register_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowOffsets {
    /// Every rank calls with buffers at the same offset in its part (NCCL's
    /// `NCCL_WIN_COLL_SYMMETRIC`): calls on the window read and write the peers' parts in place.
    Symmetric,
    /// No promise: calls on the window copy through the workspace as on any other memory.
    Any,
}

/// Device memory registered as a window of one communicator (see the module doc). Keep it
/// while calls use it; [`Communicator::deregister_window`] ends it. Dropping it without
/// deregistering keeps the registration until the communicator goes.
#[derive(Clone)]
pub struct Window {
    state: Arc<WindowState>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.range.debug("Window", self.zero_copy(), f)
    }
}

impl Window {
    /// This rank's part: its device address.
    pub fn address(&self) -> u64 {
        self.state.range.address
    }

    /// This rank's part: its length in bytes.
    pub fn len(&self) -> usize {
        self.state.range.len
    }

    /// Whether this rank's part is empty.
    pub fn is_empty(&self) -> bool {
        self.state.range.len == 0
    }

    /// Whether calls on this window read and write peers' memory in place: every peer's part is
    /// mapped here (the direct kernels run: every peer's GPU reached through CUDA IPC, at most 8).
    pub fn zero_copy(&self) -> bool {
        !self.state.parts.is_empty()
    }

    /// The device address `offset` bytes into this rank's part, checked to leave room for
    /// `len` bytes.
    pub fn at(&self, offset: usize, len: usize) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.state.range.len => Ok(self.state.range.address + offset as u64),
            _ => Err(Error::invalid(format!(
                "window range [{offset}, +{len}) runs past the window's {} bytes",
                self.state.range.len
            ))),
        }
    }

    /// Errors unless `comm` registered this window.
    pub fn check_owner(&self, comm: &Communicator) -> Result<()> {
        self.state.range.check_owner(comm.core().id(), "window")
    }
}

impl Communicator {
    /// Collective: registers `len` bytes of this rank's device memory at `address` as a window
    /// of this communicator (lengths may differ between ranks; every rank registers its windows
    /// in the same order, with the same `offsets`). With [`WindowOffsets::Symmetric`], where the
    /// direct kernels run, every peer maps every rank's part, and device all-reduces on buffers
    /// inside windows read and write them in place ([`Window::zero_copy`]); otherwise the
    /// window is kept and calls copy as usual.
    ///
    /// The memory must come from `cudaMalloc`/`cuMemAlloc` (or libnccl's `ncclMemAlloc`), not a
    /// stream-ordered pool (`cudaMallocAsync`, cudarc's `CudaSlice`): peers map it with a CUDA
    /// IPC handle. A rank whose memory cannot be shared fails the registration on every rank.
    ///
    /// # Safety
    /// `[address, address + len)` is device memory of this rank's GPU that stays allocated until
    /// the window is deregistered (or the communicator dropped) and no call uses it.
    pub unsafe fn register_window(&self, address: u64, len: usize, offsets: WindowOffsets) -> Result<Window> {
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let mut g = gpu.try_borrow_mut().map_err(|_| crate::call::already_in_a_call())?;
        // The ranks agree on the promise first: it decides whether they register and exchange,
        // so ranks that differ would fall out of step.
        let symmetric = u8::from(offsets == WindowOffsets::Symmetric);
        let promises = self.core().abortable_bootstrap().all_gather(&[symmetric])?;
        if let Some(r) = promises.iter().position(|v| v.first() != Some(&symmetric)) {
            return Err(Error::invalid(format!(
                "register_window: rank {r} registered with other offsets than rank {} ({offsets:?} here); every \
                 rank must pass the same WindowOffsets (NCCL_WIN_COLL_SYMMETRIC on all or none)",
                self.rank()
            )));
        }
        let in_place = g.maps_every_peer() && offsets == WindowOffsets::Symmetric;
        let kind = MemoryKind::Device(g.device);
        let label = format!("weave window #{}", g.windows.registered());
        let mine = if in_place {
            self.core().register_existing(address, len, kind, &label).map(Some)
        } else if address == 0 && len > 0 {
            Err(Error::invalid("register_window: address 0"))
        } else {
            Ok(None)
        };
        // Every rank says whether its part could be registered before any waits for the
        // exchange, so one failure fails the registration everywhere, promptly.
        let agreed = self.core().abortable_bootstrap().all_gather(&[u8::from(mine.is_ok())])?;
        let mine = mine?;
        if let Some(r) = agreed.iter().position(|v| v.first() != Some(&1)) {
            return Err(Error::invalid(format!(
                "register_window: rank {r} could not register its part (see its error); no window was made"
            )));
        }
        let parts = match &mine {
            Some(m) => self.core().exchange(m)?,
            None => Vec::new(),
        };
        let range = UserRange { communicator: self.core().id(), address, len };
        let state = Arc::new(WindowState { range, parts });
        g.windows.add(state.clone());
        Ok(Window { state })
    }

    /// Local: ends `window` on this rank, after the GPU work queued on this rank's GPU finished
    /// (so no call still uses it); its memory is the caller's again once every rank
    /// deregistered (peers unmap their imports of this rank's part when they deregister).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when another communicator registered it, or it was
    /// deregistered already; a CUDA error from the wait.
    pub fn deregister_window(&self, window: Window) -> Result<()> {
        window.check_owner(self)?;
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let mut g = gpu.try_borrow_mut().map_err(|_| crate::call::already_in_a_call())?;
        g.synchronize()?;
        if !g.windows.remove(&window.state) {
            return Err(Error::invalid(format!(
                "deregister_window: the window at {:#x} was deregistered already",
                window.state.range.address
            )));
        }
        Ok(())
    }

    /// A device all-reduce of `count` elements of `dtype` from `send_offset` to `recv_offset`
    /// (bytes) of `window` (in place when they are equal), which must be a window of this
    /// communicator: every rank calls with the same offsets (where the window is
    /// [`WindowOffsets::Symmetric`], that is what lets the call use it in place). The checked form of
    /// [`all_reduce_device_raw`](Self::all_reduce_device_raw) on window memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when another communicator registered `window`, or the ranges run
    /// past it; otherwise as `all_reduce_device_raw`.
    #[allow(clippy::too_many_arguments, reason = "the raw call's arguments, with the window")]
    pub fn all_reduce_in_window(
        &self,
        window: &Window,
        send_offset: usize,
        recv_offset: usize,
        count: usize,
        dtype: crate::DataType,
        op: crate::ReduceOp,
        stream: &Arc<cudarc::driver::CudaStream>,
    ) -> Result<()> {
        window.check_owner(self)?;
        let bytes = count.checked_mul(dtype.size()).ok_or_else(|| Error::invalid("count overflows"))?;
        let send = window.at(send_offset, bytes)?;
        let recv = window.at(recv_offset, bytes)?;
        if send != recv && send.abs_diff(recv) < bytes as u64 {
            return Err(Error::invalid(
                "all_reduce_in_window: the send and receive ranges overlap without being equal",
            ));
        }
        // SAFETY: both ranges lie inside the window, whose memory the registration keeps valid
        // (register_window's contract); equal or disjoint (checked).
        unsafe { self.all_reduce_device_raw(send, recv, count, dtype, op, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(address: u64, len: usize) -> WindowState {
        WindowState { range: UserRange { communicator: 1, address, len }, parts: Vec::new() }
    }

    #[test]
    fn a_window_range_is_checked_against_its_length() {
        let w = Window { state: Arc::new(window(0x2000, 64)) };
        assert_eq!(w.at(0, 64).unwrap(), 0x2000);
        assert_eq!(w.at(60, 4).unwrap(), 0x203c);
        assert!(w.at(60, 8).is_err());
        assert!(w.at(usize::MAX, 2).is_err());
        assert!(!w.zero_copy());
        assert_eq!((w.address(), w.len(), w.is_empty()), (0x2000, 64, false));
    }
}
