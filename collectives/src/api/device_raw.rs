//! The device-buffer collectives of [`Communicator`]: raw device-address calls (for any CUDA
//! framework; the typed calls over cudarc buffers in `typed.rs` and `device_group.rs` build on
//! them). Every call is stream-ordered on the given stream and returns without waiting for the
//! GPU.

use std::sync::Arc;

use comm_core::ledger::{CallKind, CallSignature};
use comm_core::{Error, Result};
use cudarc::driver::CudaStream;

use crate::api::communicator::Communicator;
use crate::call::already_in_a_call;
use crate::call::{DeviceCall, DeviceTransfer};
use crate::dtype::DataType;
use crate::exec::no_gpu;
use crate::op::ReduceOp;
use crate::table::Collective;

impl Communicator {
    /// True when this communicator runs collectives on device buffers (every rank has a GPU
    /// reachable through CUDA IPC).
    pub fn has_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// The CUDA context of this rank's GPU, when [`has_gpu`](Self::has_gpu).
    pub fn gpu_context(&self) -> Option<Arc<cudarc::driver::CudaContext>> {
        self.gpu.as_ref().and_then(|g| g.try_borrow().ok().map(|g| g.context().clone()))
    }

    /// The capabilities every rank's GPU agreed on, for the plan.
    pub(crate) fn gpu_caps(&self) -> Result<crate::select::device::GpuCaps> {
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        Ok(gpu.try_borrow().map_err(|_| already_in_a_call())?.caps())
    }

    /// Errors if an earlier device call failed on the GPU (a peer stopped, a wait timed out).
    /// Call it after synchronizing the stream to learn how the calls before went.
    pub fn check_gpu(&self) -> Result<()> {
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let checked = gpu.try_borrow_mut().map_err(|_| already_in_a_call())?.check();
        checked.map_err(|e| self.judged(e))
    }

    /// [`device_call`](Self::device_call) under the ledger: the call is recorded, and a failure
    /// judged, as every collective's is.
    ///
    /// # Safety
    /// As for [`device_call`](Self::device_call).
    unsafe fn ledgered_device_call(&self, call: DeviceCall, stream: &Arc<CudaStream>) -> Result<()> {
        self.ledgered(call.signature(), || {
            // SAFETY: forwarded from the caller.
            unsafe { self.device_call(call, stream) }
        })
    }

    /// All-reduce of `count` elements of `dtype` at device address `send` into `recv` (may be
    /// equal), on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of this rank's GPU valid for `count` elements
    /// until the call completes on `stream`.
    pub unsafe fn all_reduce_device_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let call = DeviceCall::sized(Collective::AllReduce, dtype, Some(op), (send, recv), count, 0, self.world_size());
        // SAFETY: forwarded from the caller.
        unsafe { self.ledgered_device_call(call, stream) }
    }

    /// All-gather: `count` elements per rank from `send` into `recv` (`world × count`).
    ///
    /// # Safety
    /// As [`all_reduce_device_raw`](Self::all_reduce_device_raw), for `count` elements at
    /// `send` and `world × count` at `recv` (in place: `send == recv + rank × count × size`).
    pub unsafe fn all_gather_device_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let call = DeviceCall::sized(Collective::AllGather, dtype, None, (send, recv), count, 0, self.world_size());
        // SAFETY: forwarded from the caller.
        unsafe { self.ledgered_device_call(call, stream) }
    }

    /// Reduce-scatter: `send` holds `world × count` elements; `recv` gets this rank's block.
    ///
    /// # Safety
    /// As [`all_reduce_device_raw`](Self::all_reduce_device_raw), for `world × count` elements
    /// at `send` and `count` at `recv` (in place: `recv == send + rank × count × size`).
    pub unsafe fn reduce_scatter_device_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n = self.world_size();
        let call = DeviceCall::sized(Collective::ReduceScatter, dtype, Some(op), (send, recv), count, 0, n);
        // SAFETY: forwarded from the caller.
        unsafe { self.ledgered_device_call(call, stream) }
    }

    /// Broadcast of `count` elements from `root`'s `send` into every rank's `recv`.
    ///
    /// # Safety
    /// As [`all_reduce_device_raw`](Self::all_reduce_device_raw); `send` is read on the root only.
    pub unsafe fn broadcast_device_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let call = DeviceCall::sized(Collective::Broadcast, dtype, None, (send, recv), count, root, self.world_size());
        // SAFETY: forwarded from the caller.
        unsafe { self.ledgered_device_call(call, stream) }
    }

    /// Reduce of `count` elements to `root` (`recv` written on the root only).
    ///
    /// # Safety
    /// As [`all_reduce_device_raw`](Self::all_reduce_device_raw); `recv` is used on the root only.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_device_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let n = self.world_size();
        let call = DeviceCall::sized(Collective::Reduce, dtype, Some(op), (send, recv), count, root, n);
        // SAFETY: forwarded from the caller.
        unsafe { self.ledgered_device_call(call, stream) }
    }

    /// All-to-all with `count` elements per (sender, receiver) block.
    ///
    /// # Safety
    /// As [`all_reduce_device_raw`](Self::all_reduce_device_raw), for `world × count` elements
    /// at `send` and at `recv` (equal or disjoint).
    pub unsafe fn all_to_all_device_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let call = DeviceCall::sized(Collective::AllToAll, dtype, None, (send, recv), count, 0, self.world_size());
        // SAFETY: forwarded from the caller.
        unsafe { self.ledgered_device_call(call, stream) }
    }

    /// All-to-all-v with counts and displacements (in elements) in device memory:
    /// `counts = [send_counts, send_displs, recv_counts, recv_displs]`, each a device array of
    /// `world` u64. The GPU reads them (no host synchronization); pairs whose counts disagree
    /// make the kernel report a device error (see [`check_gpu`](Self::check_gpu)).
    ///
    /// # Safety
    /// The four arrays and every block they describe must be valid device memory until the call
    /// completes on `stream`; receive blocks must not overlap.
    pub unsafe fn all_to_allv_device_raw(
        &self,
        send: u64,
        recv: u64,
        counts: [u64; 4],
        dtype: DataType,
        max_bytes_hint: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let call = DeviceCall {
            aux: counts,
            ..DeviceCall::new(Collective::AllToAllv, dtype, None, (send, recv), 0, max_bytes_hint)
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.ledgered_device_call(call, stream) }
    }

    /// Point-to-point on device buffers: sends `send_count` elements at `send` to `to` and
    /// receives `recv_count` elements from `from` into `recv`, progressing both in one kernel
    /// (so a ring shift cannot deadlock). Either side may be `None`. The matching call on the
    /// peer must use the same element count; a mismatch, or a send of an earlier call that
    /// nobody received, is reported by [`check_gpu`](Self::check_gpu) and revokes the
    /// communicator (see [`group`](Self::group) for the rule). A group of one send and one
    /// receive, as [`group_device_raw`](Self::group_device_raw) runs it.
    ///
    /// # Safety
    /// `send` valid for `send_count` elements and `recv` for `recv_count` until the call
    /// completes on `stream`.
    pub unsafe fn sendrecv_device_raw(
        &self,
        send: Option<(u64, usize, usize)>,
        recv: Option<(u64, usize, usize)>,
        dtype: DataType,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let bytes = |count: usize| {
            count.checked_mul(dtype.size()).ok_or_else(|| {
                Error::invalid(format!(
                    "sendrecv_device_raw: {count} elements of {} do not fit in memory",
                    dtype.rust_name()
                ))
            })
        };
        let send = send.map(|(addr, count, peer)| Ok(DeviceTransfer::Send { addr, bytes: bytes(count)?, peer }));
        let recv = recv.map(|(addr, count, peer)| Ok(DeviceTransfer::Recv { addr, bytes: bytes(count)?, peer }));
        let ops = send.into_iter().chain(recv).collect::<Result<Vec<DeviceTransfer>>>()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.group_device_raw(&ops, stream) }
    }

    /// A group of device sends and receives (bytes at device addresses) on `stream`, enqueued
    /// without deadlock whatever their order; nothing waits for the GPU.
    ///
    /// The schedule (every rank follows it): sends to this rank itself pair, in order, with
    /// its receives from itself (a device copy). Then for d = 1..n, step d pairs this rank's
    /// sends to `rank + d` with its receives from `rank − d` (mod n), the k-th of each in the
    /// k-th kernel of the step (one kernel progresses one send and one receive). Rank
    /// `rank + d`'s step d receives from this rank in the same order, so the k-th kernel of
    /// step d on every rank waits only for kernels (d, k) of its two partners, each of which
    /// comes after (d', k') < (d, k) there: by induction every kernel completes.
    ///
    /// Transfers of zero bytes move nothing and are left out on both sides. Every message
    /// carries the group's pair stamp (see [`group`](Self::group) for the matching rule): a
    /// mismatch is reported by [`check_gpu`](Self::check_gpu) and revokes the communicator.
    ///
    /// # Safety
    /// Every address valid for its bytes (reads for sends, writes for receives) until the
    /// group completes on `stream`; receive ranges disjoint from each other and from sends.
    pub unsafe fn group_device_raw(&self, ops: &[DeviceTransfer], stream: &Arc<CudaStream>) -> Result<()> {
        let bytes = ops.iter().map(DeviceTransfer::bytes).fold(0usize, usize::saturating_add);
        let first_peer = ops.first().map(DeviceTransfer::peer);
        let signature = CallSignature { device: true, ..CallSignature::host(CallKind::Group, bytes, first_peer) };
        // SAFETY: forwarded from the caller.
        self.ledgered(signature, || unsafe { self.device_group_steps(ops, stream) })
    }
}
