//! The device-buffer collectives of [`Communicator`]: raw device-address calls (for any CUDA
//! framework; the typed calls over cudarc buffers in `typed.rs` and `device_group.rs` build on
//! them). Every call is stream-ordered on the given stream and returns without waiting for the
//! GPU.

use std::sync::Arc;

use comm_core::diagnostics;
use comm_core::ledger::{CallKind, CallSignature};
use comm_core::{Error, Result};
use cudarc::driver::CudaStream;

use super::{DirectKernel, GpuCollectiveArgs};
use crate::channel::CallSpec;
use crate::channel::gpu::{DeviceCollectiveCall, DeviceSendRecv};
use crate::communicator::{Communicator, already_in_a_call};
use crate::dtype::DataType;
use crate::matching::GroupStamps;
use crate::op::ReduceOp;
use crate::select::device::{CountUnit, Grid};
use crate::select::{CallShape, Executor};
use crate::table::{Collective, MemorySpace};

/// What one device call asks for.
struct DeviceCall {
    collective: Collective,
    dtype: DataType,
    op: Option<ReduceOp>,
    send: u64,
    recv: u64,
    /// Elements (reducing kernels) — converted to bytes for data kernels.
    count: usize,
    root: usize,
    aux: [u64; 4],
    /// Bytes of the call, as the algorithm table measures them.
    bytes: usize,
}

impl DeviceCall {
    /// A call with root 0 and no counts arrays; `bytes` is what the algorithm table sees.
    fn new(
        collective: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        (send, recv): (u64, u64),
        count: usize,
        bytes: usize,
    ) -> Self {
        DeviceCall { collective, dtype, op, send, recv, count, root: 0, aux: [0; 4], bytes }
    }

    /// The call in the ledger (queued on a stream: finished there once queued).
    fn signature(&self) -> CallSignature {
        let rooted = matches!(self.collective, Collective::Broadcast | Collective::Reduce);
        let root = rooted.then_some(self.root);
        CallSignature { device: true, ..CallSignature::host(self.collective.call_kind(), self.bytes, root) }
    }
}

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

    /// Bytes of a call that moves `count` elements of `dtype` per rank, from or to every rank.
    fn world_bytes(&self, count: usize, dtype: DataType) -> usize {
        count * dtype.size() * self.world_size()
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

    /// # Safety
    /// The addresses in `call` must be valid device memory for the call until it completes on
    /// `stream`.
    unsafe fn device_call(&self, call: DeviceCall, stream: &Arc<CudaStream>) -> Result<()> {
        if self.is_revoked() {
            return Err(crate::health::revoked());
        }
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let mut g = gpu.try_borrow_mut().map_err(|_| already_in_a_call())?;
        let n = self.world_size();
        if call.root >= n {
            return Err(Error::invalid(format!("{}: root {} is not a rank of {n}", call.collective, call.root)));
        }
        let esz = call.dtype.size();
        let shape = CallShape {
            collective: call.collective,
            memory: MemorySpace::Device,
            bytes: call.bytes,
            payload: call.count * esz,
        };
        let (table, topology, caps) = (self.algorithm_table(), self.core().topology(), g.caps());
        let mut plan = crate::select::plan(table, shape, topology, Some(&caps))?;
        if plan.executor == Executor::Hierarchical {
            if call.op != Some(ReduceOp::Avg) || call.dtype.is_float() {
                drop(g);
                let c = call.collective;
                tracing::info!(target: diagnostics::PLAN, rank = self.rank(), "{c} of {} B on {n} GPUs -> hierarchical (node, rail steps)", call.bytes);
                let buffers = (call.send, call.recv);
                // SAFETY: forwarded from the caller.
                return unsafe {
                    self.hierarchical_device_call(
                        call.collective,
                        buffers,
                        call.count,
                        call.dtype,
                        call.op,
                        call.root,
                        stream,
                    )
                };
            }
            // An integer average would truncate in every step (see gpu/hierarchy.rs).
            plan = crate::select::plan_flat(table, shape, topology, Some(&caps))?;
        }
        let (algo, k) = match plan.kernel {
            Some(k) => (plan.algorithm, k),
            None => return Err(Error::Unsupported(format!("{}: no kernel for {}", call.collective, plan.algorithm))),
        };
        if tracing::enabled!(target: diagnostics::PLAN, tracing::Level::INFO) {
            let typed = if k.typed { format!("_{}", call.dtype.rust_name()) } else { String::new() };
            tracing::info!(
                target: diagnostics::PLAN,
                rank = self.rank(),
                "{} of {} B on {n} GPUs -> {algo} ({}{typed})",
                call.collective,
                call.bytes,
                k.family
            );
        }
        if plan.executor == Executor::GpuChannel {
            let spec = CallSpec {
                collective: call.collective,
                algorithm: algo,
                dtype: call.dtype,
                op: call.op,
                count: call.count,
                root: call.root,
                invalid: false,
                variant: 0,
            };
            let channel_call = DeviceCollectiveCall { spec, send: call.send, recv: call.recv, aux: call.aux };
            // SAFETY: forwarded from the caller.
            return g.on_channels(self.core(), |channels, status| unsafe {
                channels.launch(self.core(), channel_call, &k, status, stream)
            });
        }
        let kernel = if k.typed {
            DirectKernel::typed(k.family, call.dtype.rust_name())
        } else {
            DirectKernel::untyped(k.family)
        };
        let call_number = g.current_call();
        let d = g.direct()?;
        let count = match k.count {
            CountUnit::Elements => call.count,
            CountUnit::Bytes => call.count * esz,
            CountUnit::ElementSize => esz,
        };
        let packets = (call.count * esz).div_ceil(8);
        let (blocks, steps, overlapped) = match k.grid {
            Grid::Packets => (d.packet_blocks(packets), None, false),
            Grid::Lines => (d.packet_blocks(d.layout().ll128_two_shot_threads(call.count * esz)), None, false),
            Grid::Pipelined { min_steps, overlapped } => {
                (d.pipeline_blocks(call.bytes), Some(d.pipeline_steps().max(min_steps)), overlapped)
            }
            Grid::Flags | Grid::Channel => (d.blocks_for(call.bytes), None, false),
        };
        let mut args: GpuCollectiveArgs = d.args(call_number);
        args.send = call.send;
        args.recv = call.recv;
        args.count = count as u64;
        args.root = call.root as u32;
        args.op = call.op.map_or(0, super::op_code);
        args.aux = call.aux;
        if let Some(steps) = steps {
            // The pipelined kernels read their steps-per-block target from aux[0] and their
            // schedule from aux[1] (the broadcasts have one schedule and ignore it).
            args.aux[0] = u64::from(steps);
            args.aux[1] = u64::from(overlapped);
        }
        // SAFETY: forwarded from the caller; the workspace addresses come from live mappings.
        unsafe { d.launch(kernel, args, blocks, stream) }
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
        let call = DeviceCall::new(Collective::AllReduce, dtype, Some(op), (send, recv), count, count * dtype.size());
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
        let call =
            DeviceCall::new(Collective::AllGather, dtype, None, (send, recv), count, self.world_bytes(count, dtype));
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
        let bytes = self.world_bytes(count, dtype);
        let call = DeviceCall::new(Collective::ReduceScatter, dtype, Some(op), (send, recv), count, bytes);
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
        let call = DeviceCall {
            root,
            ..DeviceCall::new(Collective::Broadcast, dtype, None, (send, recv), count, count * dtype.size())
        };
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
        let call = DeviceCall {
            root,
            ..DeviceCall::new(Collective::Reduce, dtype, Some(op), (send, recv), count, count * dtype.size())
        };
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
        let call =
            DeviceCall::new(Collective::AllToAll, dtype, None, (send, recv), count, self.world_bytes(count, dtype));
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
        let esz = dtype.size();
        let send = send.map(|(addr, count, peer)| DeviceTransfer::Send { addr, bytes: count * esz, peer });
        let recv = recv.map(|(addr, count, peer)| DeviceTransfer::Recv { addr, bytes: count * esz, peer });
        let ops: Vec<DeviceTransfer> = send.into_iter().chain(recv).collect();
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
        let bytes = ops.iter().map(DeviceTransfer::bytes).sum();
        let first_peer = ops.first().map(DeviceTransfer::peer);
        let signature = CallSignature { device: true, ..CallSignature::host(CallKind::Group, bytes, first_peer) };
        // SAFETY: forwarded from the caller.
        self.ledgered(signature, || unsafe { self.device_group_steps(ops, stream) })
    }

    /// [`group_device_raw`](Self::group_device_raw) inside the ledger.
    ///
    /// # Safety
    /// As for `group_device_raw`.
    unsafe fn device_group_steps(&self, ops: &[DeviceTransfer], stream: &Arc<CudaStream>) -> Result<()> {
        let (me, n) = (self.rank(), self.world_size());
        if let Some(op) = ops.iter().find(|op| op.peer() >= n) {
            return Err(Error::invalid(format!(
                "device point-to-point: rank {} is not a rank of this {n}-rank communicator",
                op.peer()
            )));
        }
        let lists = |send: bool, peer: usize| -> Vec<(u64, usize)> {
            ops.iter()
                .filter(|op| op.peer() == peer && op.is_send() == send && op.bytes() > 0)
                .map(|op| (op.addr(), op.bytes()))
                .collect()
        };
        let (to_self, from_self) = (lists(true, me), lists(false, me));
        if to_self.len() != from_self.len() || to_self.iter().zip(&from_self).any(|(a, b)| a.1 != b.1) {
            return Err(Error::invalid(format!(
                "a device group sends {} message(s) to this rank itself and receives {}: they must pair up, one to \
                 one and of equal sizes",
                to_self.len(),
                from_self.len()
            )));
        }
        if self.is_revoked() {
            return Err(crate::health::revoked());
        }
        for (&(src, bytes), &(dst, _)) in to_self.iter().zip(&from_self) {
            if src != dst {
                // SAFETY: both ranges valid for `bytes` (caller), ordered on `stream`.
                unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }.map_err(
                    |e| Error::Cuda { operation: "cuMemcpyDtoDAsync (send to self)".into(), message: e.to_string() },
                )?;
            }
        }
        let stamps = {
            // Zero-byte transfers move nothing and are left out (as the schedule below does).
            let transfers = ops.iter().filter(|op| op.bytes() > 0).map(|op| (op.peer(), op.is_send(), op.bytes()));
            let ledger = self.resilience.ledger();
            let mut exchanges = self.pair_exchanges.borrow_mut();
            GroupStamps::new(transfers, me, ledger.groups_begun(), ledger.collectives_begun(), &mut exchanges)
        };
        for d in 1..n {
            let (to, from) = ((me + d) % n, (me + n - d) % n);
            let (s, r) = (lists(true, to), lists(false, from));
            for k in 0..s.len().max(r.len()) {
                let send = s.get(k).map(|&(addr, bytes)| (addr, bytes, to));
                let recv = r.get(k).map(|&(addr, bytes)| (addr, bytes, from));
                let stamps = (
                    send.map_or(Ok(0), |_| stamps.sending_to(to).map(|st| st.digest()))?,
                    recv.map_or(Ok(0), |_| stamps.receiving_from(from).map(|st| st.digest()))?,
                );
                // SAFETY: forwarded from the caller; counts are bytes of U8.
                unsafe { self.sendrecv_on_device(send, recv, DataType::U8, stamps, stream)? };
            }
        }
        Ok(())
    }

    /// One kernel of a device group: a send and a receive (bytes of `dtype`), carrying and
    /// checking the pair stamps `stamps` (the send's digest, the one the receive expects).
    ///
    /// # Safety
    /// As for `group_device_raw`.
    unsafe fn sendrecv_on_device(
        &self,
        send: Option<(u64, usize, usize)>,
        recv: Option<(u64, usize, usize)>,
        dtype: DataType,
        stamps: (u32, u32),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if self.is_revoked() {
            return Err(crate::health::revoked());
        }
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let mut g = gpu.try_borrow_mut().map_err(|_| already_in_a_call())?;
        let (me, n) = (self.rank(), self.world_size());
        for (what, peer) in [("send to", send.map(|s| s.2)), ("receive from", recv.map(|r| r.2))] {
            if let Some(p) = peer
                && (p >= n || p == me)
            {
                return Err(Error::invalid(format!(
                    "device point-to-point: cannot {what} rank {p} (rank {me} of {n})"
                )));
            }
        }
        if send.is_none() && recv.is_none() {
            return Ok(());
        }
        let esz = dtype.size();
        let bytes = send.map_or(0, |s| s.1 * esz) + recv.map_or(0, |r| r.1 * esz);
        let shape = CallShape { collective: Collective::SendRecv, memory: MemorySpace::Device, bytes, payload: bytes };
        let plan = crate::select::plan(self.algorithm_table(), shape, self.core().topology(), Some(&g.caps()))?;
        if plan.executor == Executor::GpuChannel {
            let call = DeviceSendRecv { send, recv, dtype, stamps };
            // SAFETY: forwarded from the caller.
            return g.on_channels(self.core(), |channels, status| unsafe {
                channels.sendrecv(self.core(), call, status, stream)
            });
        }
        let family = plan.kernel.map_or("weave_sendrecv", |k| k.family);
        let call_number = g.current_call();
        let d = g.direct()?;
        let mut args: GpuCollectiveArgs = d.args(call_number);
        args.root = u32::MAX;
        args.aux[1] = u64::MAX;
        if let Some((addr, count, to)) = send {
            args.send = addr;
            args.count = (count * esz) as u64;
            args.root = to as u32;
        }
        if let Some((addr, count, from)) = recv {
            args.recv = addr;
            args.aux[0] = (count * esz) as u64;
            args.aux[1] = from as u64;
        }
        args.aux[3] = u64::from(stamps.0) | u64::from(stamps.1) << 32;
        let blocks = d.blocks_for(bytes).max(if send.is_some() && recv.is_some() { 2 } else { 1 });
        // SAFETY: forwarded from the caller; the workspace addresses come from live mappings.
        unsafe { d.launch(DirectKernel::untyped(family), args, blocks, stream) }
    }
}

/// One transfer of a device group ([`Communicator::group_device_raw`]): bytes at a device
/// address, sent to or received from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceTransfer {
    /// Send `bytes` at `addr` to `peer`.
    Send {
        /// Device address of the data.
        addr: u64,
        /// Bytes to send.
        bytes: usize,
        /// The rank to send to.
        peer: usize,
    },
    /// Receive exactly `bytes` from `peer` into `addr`.
    Recv {
        /// Device address to write.
        addr: u64,
        /// Bytes to receive.
        bytes: usize,
        /// The rank to receive from.
        peer: usize,
    },
}

impl DeviceTransfer {
    /// The peer.
    pub fn peer(&self) -> usize {
        match *self {
            DeviceTransfer::Send { peer, .. } | DeviceTransfer::Recv { peer, .. } => peer,
        }
    }

    /// The bytes moved.
    pub fn bytes(&self) -> usize {
        match *self {
            DeviceTransfer::Send { bytes, .. } | DeviceTransfer::Recv { bytes, .. } => bytes,
        }
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        match *self {
            DeviceTransfer::Send { addr, .. } | DeviceTransfer::Recv { addr, .. } => addr,
        }
    }

    /// Whether it is a send.
    pub fn is_send(&self) -> bool {
        matches!(self, DeviceTransfer::Send { .. })
    }
}

/// The error of a device call on a communicator without a GPU path.
pub(super) fn no_gpu() -> Error {
    Error::Unsupported(
        "this communicator has no GPU path: build with the `cudaipc` feature and give every rank a CUDA device".into(),
    )
}
