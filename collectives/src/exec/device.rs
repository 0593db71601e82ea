//! The road of a call on device buffers: plans it (`crate::select`) and launches the kernel the
//! plan names — one of the GPU engine's direct kernels, or its channel kernels (`gpu/`).

use std::sync::Arc;

use comm_core::diagnostics;
use comm_core::{Error, Result};
use cudarc::driver::CudaStream;
use kernels::convert::{Direction, Fp8Format};

use crate::api::communicator::Communicator;
use crate::call::{CallSpec, DeviceCall, DeviceTransfer, already_in_a_call};
use crate::dtype::DataType;
use crate::gpu::channels::{DeviceCollectiveCall, DeviceSendRecv};
use crate::gpu::{DirectKernel, GpuCollectiveArgs, WorkspaceArea};
use crate::matching::GroupStamps;
use crate::op::ReduceOp;
use crate::select::device::{CountUnit, Grid, SENDRECV_KERNEL, WINDOWED_ALL_REDUCE_FAMILY};
use crate::select::{CallShape, Executor};
use crate::table::{Collective, MemorySpace};

/// Calls on device buffers: the plan's executor, one kernel per call.
impl Communicator {
    /// # Safety
    /// The addresses in `call` must be valid device memory for the call until it completes on
    /// `stream`.
    pub(crate) unsafe fn device_call(&self, call: DeviceCall, stream: &Arc<CudaStream>) -> Result<()> {
        if self.is_revoked() {
            return Err(crate::health::revoked());
        }
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let n = self.world_size();
        if call.root >= n {
            return Err(Error::invalid(format!("{}: root {} is not a rank of {n}", call.collective, call.root)));
        }
        // Every size below is `count` elements (or blocks of them per rank): checked once here.
        if call.count.checked_mul(call.dtype.size()).and_then(|b| b.checked_mul(n)).is_none() {
            return Err(Error::invalid(format!(
                "{}: {} elements of {} on {n} ranks do not fit in memory",
                call.collective,
                call.count,
                call.dtype.rust_name()
            )));
        }
        if n == 1 && call.collective != Collective::AllToAllv {
            // SAFETY: forwarded from the caller.
            return unsafe { self.device_call_alone(&call, stream) };
        }
        if call.op.is_some() && call.dtype.reduced_in() != call.dtype {
            // SAFETY: forwarded from the caller.
            return unsafe { self.device_call_widened(call, stream) };
        }
        let mut g = gpu.try_borrow_mut().map_err(|_| already_in_a_call())?;
        let in_place = match call.collective {
            Collective::AllReduce => match g.windows.all_reduce(&call) {
                Some(w) => Some(w),
                None => g.registrations.all_reduce(&call, self.core())?,
            },
            _ => None,
        };
        if let Some(windowed) = in_place {
            tracing::info!(
                target: diagnostics::PLAN,
                rank = self.rank(),
                "{} of {} B on {n} GPUs -> {} {:?}{} ({WINDOWED_ALL_REDUCE_FAMILY}_{})",
                call.collective,
                call.bytes,
                if windowed.is_registered() { "registered" } else { "windowed" },
                windowed.form(),
                if call.send == call.recv { ", in place" } else { "" },
                call.dtype.rust_name(),
            );
            let call_number = g.current_call();
            let d = g.direct_with(self.core(), WorkspaceArea::Control)?;
            // SAFETY: forwarded from the caller.
            return unsafe { windowed.launch(d, call_number, &call, stream) };
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
                // SAFETY: forwarded from the caller.
                return unsafe { self.hierarchical_device_call(&call, stream) };
            }
            // An integer average would truncate in every step (see hierarchy/device.rs).
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
        let d = g.direct_with(self.core(), crate::gpu::area_of(&k))?;
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
        args.op = call.op.map_or(0, ReduceOp::kernel_code);
        args.aux = call.aux;
        if let Some(steps) = steps {
            // The pipelined kernels read their steps-per-block target from aux[0] and their
            // schedule from aux[1] (the broadcasts have one schedule and ignore it).
            args.aux[0] = u64::from(steps);
            args.aux[1] = u64::from(overlapped);
        }
        // SAFETY: forwarded from the caller; the workspace addresses come from live mappings.
        unsafe { d.launcher.launch(kernel, &args, blocks, stream) }
    }

    /// A collective of one rank (all-to-all-v aside, whose counts are on the device): the result
    /// is this rank's block — a reduction of one value is that value, exactly, in every type and
    /// operator —, copied on `stream` without a kernel, so a one-rank communicator needs no
    /// workspace.
    ///
    /// # Safety
    /// As for [`device_call`](Self::device_call).
    unsafe fn device_call_alone(&self, call: &DeviceCall, stream: &Arc<CudaStream>) -> Result<()> {
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        gpu.try_borrow_mut().map_err(|_| already_in_a_call())?.check()?;
        let bytes = call.count * call.dtype.size();
        if call.send != call.recv && bytes > 0 {
            // SAFETY: both ranges valid for `bytes` (caller), ordered on `stream`.
            unsafe { cudarc::driver::result::memcpy_dtod_async(call.recv, call.send, bytes, stream.cu_stream()) }
                .map_err(|e| Error::Cuda {
                    operation: format!("cuMemcpyDtoDAsync ({} of one rank)", call.collective),
                    message: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// A reduction of device elements carried in a wider type (FP8, see `crate::fp8`): three
    /// launches on `stream` — the inputs widened into a stream-ordered temporary, the call on the
    /// wide elements (planned for them), the result narrowed once into the receive buffer.
    ///
    /// # Safety
    /// As for [`device_call`](Self::device_call).
    unsafe fn device_call_widened(&self, call: DeviceCall, stream: &Arc<CudaStream>) -> Result<()> {
        let format = match call.dtype {
            DataType::F8E4M3 => Fp8Format::E4M3,
            DataType::F8E5M2 => Fp8Format::E5M2,
            other => {
                return Err(Error::invalid(format!(
                    "{}: {} is not carried in a wider type",
                    call.collective,
                    other.name()
                )));
            }
        };
        let (n, me) = (self.world_size(), self.rank());
        let (send_len, recv_len) = crate::widen::reduced_lengths(call.collective, call.count, call.root, n, me)
            .ok_or_else(|| Error::invalid(format!("{}: nothing to widen (or too many elements)", call.collective)))?;
        let converter =
            self.gpu.as_ref().ok_or_else(no_gpu)?.try_borrow_mut().map_err(|_| already_in_a_call())?.converter()?;
        let wide = format.wide_bytes();
        // The wide receive buffer starts on a 256-byte boundary, as an allocation would.
        let too_large =
            || Error::invalid(format!("{}: {send_len} FP8 elements are too many to widen", call.collective));
        let recv_offset =
            send_len.checked_mul(wide).and_then(|b| b.checked_next_multiple_of(256)).ok_or_else(too_large)?;
        let total = recv_len.checked_mul(wide).and_then(|b| b.checked_add(recv_offset)).ok_or_else(too_large)?;
        let wide_bytes = call.bytes.checked_mul(wide).ok_or_else(too_large)?;
        let temporary = weave_cuda::StreamMemory::alloc(total, stream)?;
        let (wide_send, wide_recv) = (temporary.address(), temporary.address() + recv_offset as u64);
        // SAFETY: the caller vouches for `send_len` elements at `call.send` and `recv_len` at
        // `call.recv`; the temporary holds both wide ranges, disjoint, until the queued work ends.
        unsafe {
            converter.launch(format, Direction::Widen, call.send, wide_send, send_len, stream)?;
            let wide_call = DeviceCall {
                dtype: call.dtype.reduced_in(),
                send: wide_send,
                recv: wide_recv,
                bytes: wide_bytes,
                ..call
            };
            self.device_call(wide_call, stream)?;
            converter.launch(format, Direction::Narrow, wide_recv, call.recv, recv_len, stream)
        }
    }

    /// Runs a device call that the plan gave to the hierarchical executor: its steps on the
    /// node and rail communicators, queued on `stream`.
    ///
    /// # Safety
    /// As for [`device_call`](Self::device_call).
    unsafe fn hierarchical_device_call(&self, call: &DeviceCall, stream: &Arc<CudaStream>) -> Result<()> {
        let h = self.hierarchy()?;
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        // Held through the steps, which run on the node's and the rail's GPU engines.
        let g = gpu.try_borrow().map_err(|_| already_in_a_call())?;
        let device = crate::hierarchy::Device {
            core: self.core(),
            ordinal: g.device,
            ctx: g.context(),
            staging: &g.hierarchy_staging,
        };
        // SAFETY: forwarded from the caller.
        unsafe { h.run_device(call, &device, stream) }
    }

    /// A group of device transfers (`group_device_raw`, inside the ledger): sends to this rank
    /// itself as copies, then one kernel per round of peers.
    ///
    /// # Safety
    /// As for `group_device_raw`.
    pub(crate) unsafe fn device_group_steps(&self, ops: &[DeviceTransfer], stream: &Arc<CudaStream>) -> Result<()> {
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
        let bytes =
            send.map_or(0, |s| s.1.saturating_mul(esz)).saturating_add(recv.map_or(0, |r| r.1.saturating_mul(esz)));
        let shape = CallShape { collective: Collective::SendRecv, memory: MemorySpace::Device, bytes, payload: bytes };
        let plan = crate::select::plan(self.algorithm_table(), shape, self.core().topology(), Some(&g.caps()))?;
        if plan.executor == Executor::GpuChannel {
            let call = DeviceSendRecv { send, recv, dtype, stamps };
            // SAFETY: forwarded from the caller.
            return g.on_channels(self.core(), |channels, status| unsafe {
                channels.sendrecv(self.core(), call, status, stream)
            });
        }
        let family = plan.kernel.map_or(SENDRECV_KERNEL, |k| k.family);
        let call_number = g.current_call();
        let d = g.direct_with(self.core(), WorkspaceArea::Control)?;
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
        unsafe { d.launcher.launch(DirectKernel::untyped(family), &args, blocks, stream) }
    }
}

/// The error of a device call on a communicator without a GPU path.
pub(crate) fn no_gpu() -> Error {
    Error::Unsupported(
        "this communicator has no GPU path: build with the `cuda` feature, give every rank a CUDA device, and \
         leave WEAVE_GPU unset or on"
            .into(),
    )
}
