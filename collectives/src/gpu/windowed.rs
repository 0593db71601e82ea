//! The windows of a communicator as its GPU engine keeps them ([`Windows`]; `api/window.rs`
//! registers them), and the all-reduce that uses them in place ([`WindowedCall`], the kernel in
//! `kernels/cuda/windowed.cu`): a device all-reduce whose input lies in a symmetric window of its
//! communicator reads every rank's input there, and two-shot writes every rank's output there.
//! Registered buffers (`registered.rs`) launch the same kernel with published addresses.

use std::sync::Arc;

use comm_core::Result;
use comm_core::memory::RegisteredMemory;
use cudarc::driver::CudaStream;

use super::{DirectKernel, DirectKernels, GpuCollectiveArgs, MAX_GPU_RANKS, UserRange};
use crate::call::DeviceCall;
use crate::op::ReduceOp;
use crate::select::device::{WINDOWED_ALL_REDUCE_FAMILY, WindowedForm, windowed_form};

/// A window as the communicator's GPU engine keeps it.
pub(crate) struct WindowState {
    /// This rank's part, and the communicator that registered it.
    pub(crate) range: UserRange,
    /// Every rank's part as mapped on this GPU (this rank's own at its rank), where the direct
    /// kernels run (every peer's GPU memory mapped here) and the offsets are symmetric; empty
    /// elsewhere.
    pub(crate) parts: Vec<RegisteredMemory>,
}

impl WindowState {
    /// Every rank's address at `offset` into its part (as mapped here), 0 past the last rank.
    fn addresses_at(&self, offset: u64) -> [u64; MAX_GPU_RANKS] {
        let mut at = [0; MAX_GPU_RANKS];
        for (a, p) in at.iter_mut().zip(&self.parts) {
            *a = p.as_ptr() as u64 + offset;
        }
        at
    }
}

/// A communicator's windows, in registration order.
#[derive(Default)]
pub(crate) struct Windows {
    list: Vec<Arc<WindowState>>,
    /// Windows registered so far (numbering their labels alike on every rank).
    registered: u64,
}

impl Windows {
    /// Windows registered so far.
    pub(crate) fn registered(&self) -> u64 {
        self.registered
    }

    /// Keeps a window the ranks just registered.
    pub(crate) fn add(&mut self, window: Arc<WindowState>) {
        self.list.push(window);
        self.registered += 1;
    }

    /// Drops `window`; false when it is not here (deregistered already).
    pub(crate) fn remove(&mut self, window: &Arc<WindowState>) -> bool {
        let before = self.list.len();
        self.list.retain(|w| !Arc::ptr_eq(w, window));
        self.list.len() < before
    }

    /// The window in place whose part holds `[address, address + len)`, and the offset there.
    fn in_place(&self, address: u64, len: usize) -> Option<(&WindowState, u64)> {
        self.list
            .iter()
            .filter(|w| !w.parts.is_empty())
            .find_map(|w| w.range.offset_of(address, len).map(|o| (&**w, o)))
    }

    /// The windowed form of an all-reduce `call` when its input lies in a window used in place
    /// (and, two-shot, its output too); the kernel needs a reducing type.
    pub(crate) fn all_reduce(&self, call: &DeviceCall) -> Option<WindowedCall> {
        if self.list.is_empty() || !in_place_kind(call) {
            return None;
        }
        let (input, at) = self.in_place(call.send, call.bytes)?;
        let output = self.in_place(call.recv, call.bytes);
        let form = windowed_form(call.bytes, output.is_some(), call.send == call.recv);
        let recvs = match (form, output) {
            (WindowedForm::TwoShot, Some((w, o))) => w.addresses_at(o),
            _ => [0; MAX_GPU_RANKS],
        };
        Some(WindowedCall { form, sends: input.addresses_at(at), recvs, published: false })
    }
}

/// Whether the windowed kernel can run `call` (windows or registrations): a non-empty
/// reduction of a type the kernel reduces itself (FP8 is carried in a wider type).
pub(super) fn in_place_kind(call: &DeviceCall) -> bool {
    call.bytes > 0 && call.op.is_some() && call.dtype.reduced_in() == call.dtype
}

/// A device all-reduce whose buffers lie in windows of its communicator, ready to launch.
pub(crate) struct WindowedCall {
    form: WindowedForm,
    /// Every rank's input as mapped here.
    sends: [u64; MAX_GPU_RANKS],
    /// Every rank's output as mapped here (two-shot; zeros one-shot).
    recvs: [u64; MAX_GPU_RANKS],
    /// Whether `sends` and `recvs` are instead this rank's buffers as each rank maps them, which
    /// the kernel publishes to the peers (registered buffers, `registered.rs`).
    published: bool,
}

/// The kernel's `aux[1]` for published addresses (`WINDOWED_PUBLISHED` in windowed.cu).
const WINDOWED_PUBLISHED: u64 = 1;

impl WindowedCall {
    /// An all-reduce on registered buffers: `sends[q]` / `recvs[q]` are this rank's input /
    /// output as rank q maps them.
    pub(crate) fn published(form: WindowedForm, sends: [u64; MAX_GPU_RANKS], recvs: [u64; MAX_GPU_RANKS]) -> Self {
        WindowedCall { form, sends, recvs, published: true }
    }

    /// Whether the buffers are registrations (published addresses) rather than windows.
    pub(crate) fn is_registered(&self) -> bool {
        self.published
    }

    /// One-shot or two-shot.
    pub(crate) fn form(&self) -> WindowedForm {
        self.form
    }

    /// Launches the all-reduce over windows for `call` (the ledger's call `call_number`) on
    /// `stream`.
    ///
    /// # Safety
    /// `call`'s addresses are valid device memory for the call until it completes on `stream`.
    pub(crate) unsafe fn launch(
        &self,
        d: &mut DirectKernels,
        call_number: u64,
        call: &DeviceCall,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let mut args: GpuCollectiveArgs = d.args(call_number);
        args.send = call.send;
        args.recv = call.recv;
        args.count = call.count as u64;
        args.op = call.op.map_or(0, ReduceOp::kernel_code);
        args.aux[0] = self.form as u64;
        args.aux[1] = if self.published { WINDOWED_PUBLISHED } else { 0 };
        args.win_send = self.sends;
        args.win_recv = self.recvs;
        let kernel = DirectKernel::typed(WINDOWED_ALL_REDUCE_FAMILY, call.dtype.rust_name());
        let blocks = d.blocks_for(call.bytes);
        // SAFETY: forwarded from the caller; the windows' parts are mapped while registered.
        unsafe { d.launcher.launch(kernel, &args, blocks, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_without_parts_maps_no_rank() {
        let w = WindowState { range: UserRange { communicator: 1, address: 0x1000, len: 256 }, parts: Vec::new() };
        assert_eq!(w.addresses_at(8), [0; MAX_GPU_RANKS], "no parts mapped");
    }
}
