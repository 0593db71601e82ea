//! Device buffers across nodes: the hierarchical plan ([`super`]) as device calls of
//! the node and rail sub-communicators, queued one after another on the caller's stream. The
//! stream keeps them in order (each step reads what the step before wrote), so the caller
//! synchronizes once, as for any device call, and a CUDA graph captures every step. Inside a
//! node the steps run whatever the node communicator picks (the direct kernels where its GPUs
//! map each other), across nodes the rail's channel algorithms.
//!
//! | collective | inside the node | across nodes (the rail) | inside the node |
//! |---|---|---|---|
//! | all-reduce | reduce-scatter into this rank's shard of `recv`; all-reduce of the tail | all-reduce of the shard (and the tail, on the last local rank's rail), in place | all-gather of the shards, in place; broadcast of the tail from the last local rank |
//! | all-gather | | all-gather of `send` into staging (`[node]`) | all-gather into staging (`[local][node]`), then blocks copied into `recv` by rank |
//! | reduce-scatter | blocks of `send` copied into staging by local rank (`[local][node]`), reduce-scatter into staging | reduce-scatter into `recv` | |
//! | broadcast | | broadcast on the root's rail into `recv` | broadcast in place from the root's local rank |
//! | reduce | reduce to the root's local rank (into staging on its rail) | reduce from the staging into the root's `recv` | |
//!
//! An all-reduce's last `count % L` elements (`L` ranks per node) go as an all-reduce in the
//! node, then across the last local rank's rail in the same step as its shard (they lie next
//! to each other in `recv`), then as a broadcast from it in the node: the call crosses the
//! network once. `Avg` averages in every step — the
//! mean over the nodes of each node's mean, which is the mean over every rank because the
//! nodes hold equally many ranks; integer averages would truncate at each step, so the plan
//! keeps those flat ([`crate::select::plan_flat`]).
//!
//! The staging (`device_staging.rs`) is device memory of this communicator, kept between calls; the
//! block reorderings are strided device-to-device copies queued on the caller's stream between
//! the steps. Every step's buffers are distinct from its other buffers (the sub-communicators'
//! in-place forms are used only where the all-reduce and broadcast used them before), so a
//! caller's in-place call reads all of `send` in the first step or copy and writes `recv` only
//! in the last.
//!
//! The node and rail communicators are split from this one at its first hierarchical call
//! (host or device), which every rank makes at the same point because every rank plans the
//! same call alike. That split allocates GPU memory for the sub-communicators, so the first
//! hierarchical device call must not be inside a stream capture.

use std::cell::{RefCell, RefMut};
use std::sync::Arc;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaStream};

use super::{Hierarchy, StepRunner};
use crate::call::DeviceCall;
use crate::call::already_in_a_call;
use crate::device_staging::{BlockGrid, DeviceStaging, transpose_blocks};
use crate::dtype::DataType;
use crate::op::ReduceOp;
use crate::table::Collective::{self, AllGather, AllReduce, Broadcast, Reduce, ReduceScatter};

/// What a hierarchical device call moves: device addresses, elements of `dtype`, the stream.
#[derive(Clone, Copy)]
struct Buffers<'a> {
    send: u64,
    recv: u64,
    count: usize,
    dtype: DataType,
    stream: &'a Arc<CudaStream>,
}

/// Where a hierarchical device call may allocate staging and copy: the parent communicator's
/// core (whose registration path allocates), its GPU's ordinal and context, and its GPU
/// engine's staging.
pub(crate) struct Device<'a> {
    pub(crate) core: &'a CoreCommunicator,
    pub(crate) ordinal: u32,
    pub(crate) ctx: &'a Arc<CudaContext>,
    pub(crate) staging: &'a RefCell<DeviceStaging>,
}

/// One device step of `collective` on `comm` (the node or the rail), as the raw device call of
/// that collective would queue it.
///
/// # Safety
/// As [`StepRunner::device_step`].
#[allow(clippy::too_many_arguments)]
unsafe fn step<C: StepRunner>(
    comm: &C,
    collective: Collective,
    op: Option<ReduceOp>,
    buffers: (u64, u64),
    count: usize,
    dtype: DataType,
    root: usize,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    let call = DeviceCall::sized(collective, dtype, op, buffers, count, root, comm.world_size());
    // SAFETY: forwarded from the caller.
    unsafe { comm.device_step(call, stream) }
}

impl Buffers<'_> {
    /// Bytes of `blocks` blocks of the call's count of elements, or an error naming the overflow.
    fn bytes(&self, blocks: usize) -> Result<usize> {
        self.count.checked_mul(blocks).and_then(|e| e.checked_mul(self.dtype.size())).ok_or_else(|| {
            Error::invalid(format!(
                "a hierarchical device call of {blocks} blocks of {} {} elements overflows",
                self.count,
                self.dtype.name()
            ))
        })
    }
}

/// What a call that reorders blocks between its steps works with: the grid's ranks per node
/// (`l`) and nodes, the bytes of one block of the call's count and of one block per rank, and
/// the communicator's device staging.
struct Reordering<'a> {
    l: usize,
    nodes: usize,
    block: usize,
    by_rank: usize,
    staging: RefMut<'a, DeviceStaging>,
}

impl<C: StepRunner> Hierarchy<C> {
    /// The grid, block sizes and staging of `call` (see [`Reordering`]); the staging is this
    /// call's until it returns.
    fn reordering<'d>(&self, call: &Buffers<'_>, gpu: &'d Device<'_>) -> Result<Reordering<'d>> {
        let grid = self.grid();
        let (l, nodes) = (grid.ranks_per_node, grid.nodes);
        let (block, by_rank) = (call.bytes(1)?, call.bytes(l * nodes)?);
        let staging = gpu.staging.try_borrow_mut().map_err(|_| already_in_a_call())?;
        Ok(Reordering { l, nodes, block, by_rank, staging })
    }

    /// All-reduce of the call's elements from `send` into `recv` (may be equal), as steps on
    /// its stream (see the module doc).
    ///
    /// # Safety
    /// As `Communicator::all_reduce_device_raw`.
    unsafe fn all_reduce_device(&self, call: &Buffers<'_>, op: ReduceOp) -> Result<()> {
        let Buffers { send, recv, count, dtype, stream } = *call;
        let l = self.grid().ranks_per_node;
        let (shard, size) = (count / l, dtype.size() as u64);
        let main = shard * l;
        let tail = count - main;
        let at = |base: u64, elements: usize| base + elements as u64 * size;
        let mine = at(recv, self.local() * shard);
        // The last local rank's rail carries its shard and the tail, which lie next to each
        // other in `recv`: one crossing of the network per call.
        let last = l - 1;
        let across = if self.local() == last { shard + tail } else { shard };
        let (intra, rail) = (self.intra(), self.rail());
        let (tail_send, tail_recv) = (at(send, main), at(recv, main));
        // Every step is queued even when it has no elements, as on the host: every rank of a
        // sub-communicator makes the same calls.
        // SAFETY: (every step) the shard, the main part and the tail lie inside `send` and
        // `recv`, which the caller keeps valid until the stream has run the steps; the in-place
        // forms are the ones each call documents.
        unsafe {
            step(intra, ReduceScatter, Some(op), (send, mine), shard, dtype, 0, stream)?;
            step(intra, AllReduce, Some(op), (tail_send, tail_recv), tail, dtype, 0, stream)?;
            step(rail, AllReduce, Some(op), (mine, mine), across, dtype, 0, stream)?;
            step(intra, AllGather, None, (mine, recv), shard, dtype, 0, stream)?;
            step(intra, Broadcast, None, (tail_recv, tail_recv), tail, dtype, last, stream)
        }
    }

    /// All-gather of the call's `count` elements per rank from `send` into `recv` (`world ×
    /// count`; in place where `send` is this rank's block of `recv`), as steps and copies on its
    /// stream (see the module doc).
    ///
    /// # Safety
    /// As `Communicator::all_gather_device_raw`.
    unsafe fn all_gather_device(&self, call: &Buffers<'_>, gpu: &Device<'_>) -> Result<()> {
        let Buffers { send, recv, count, dtype, stream } = *call;
        let Reordering { l, nodes, block, by_rank, mut staging } = self.reordering(call, gpu)?;
        // Across the rail, this rank's block from every node ([node]); then inside the node,
        // those of every local rank ([local][node]).
        let (across, inside) = staging.areas(gpu.core, gpu.ordinal, block * nodes, by_rank)?;
        let max_pitch = staging.max_pitch(gpu.ctx)?;
        // SAFETY: the staging areas hold `nodes` and `world` blocks and live as long as the
        // communicator; `send` and `recv` are the caller's (valid until the stream has run
        // the steps); each step's buffers are disjoint.
        unsafe {
            step(self.rail(), AllGather, None, (send, across), count, dtype, 0, stream)?;
            step(self.intra(), AllGather, None, (across, inside), count * nodes, dtype, 0, stream)?;
            // [local][node] to [node][local], the rank order of `recv`.
            transpose_blocks(inside, recv, BlockGrid { rows: l, cols: nodes, block }, max_pitch, stream)
        }
    }

    /// Reduce-scatter of the call's `world × count` elements at `send` into this rank's
    /// `count` at `recv` (in place where `recv` is this rank's block of `send`), as copies and
    /// steps on its stream (see the module doc).
    ///
    /// # Safety
    /// As `Communicator::reduce_scatter_device_raw`.
    unsafe fn reduce_scatter_device(&self, call: &Buffers<'_>, op: ReduceOp, gpu: &Device<'_>) -> Result<()> {
        let Buffers { send, recv, count, dtype, stream } = *call;
        let Reordering { l, nodes, block, by_rank, mut staging } = self.reordering(call, gpu)?;
        let (by_local, node_sums) = staging.areas(gpu.core, gpu.ordinal, by_rank, block * nodes)?;
        let max_pitch = staging.max_pitch(gpu.ctx)?;
        // SAFETY: as in `all_gather_device`: the staging holds `world` and `nodes` blocks.
        unsafe {
            // `send` from [node][local] to [local][node], so that the node step hands each
            // local rank the blocks of its rail.
            transpose_blocks(send, by_local, BlockGrid { rows: nodes, cols: l, block }, max_pitch, stream)?;
            step(self.intra(), ReduceScatter, Some(op), (by_local, node_sums), count * nodes, dtype, 0, stream)?;
            step(self.rail(), ReduceScatter, Some(op), (node_sums, recv), count, dtype, 0, stream)
        }
    }

    /// Reduce of the call's `count` elements to rank `root`'s `recv`, as steps on its stream
    /// (see the module doc).
    ///
    /// # Safety
    /// As `Communicator::reduce_device_raw`.
    unsafe fn reduce_device(&self, call: &Buffers<'_>, op: ReduceOp, root: usize, gpu: &Device<'_>) -> Result<()> {
        let Buffers { send, recv, count, dtype, stream } = *call;
        let grid = self.grid();
        let (root_node, root_local) = (grid.node_of(root), grid.local_of(root));
        if self.local() != root_local {
            // SAFETY: forwarded from the caller (`recv` is not used off the root).
            return unsafe { step(self.intra(), Reduce, Some(op), (send, recv), count, dtype, root_local, stream) };
        }
        // The node's partial result, in staging on every rank of the root's rail (the root's
        // too, so that no step reduces in place).
        let mut staging = gpu.staging.try_borrow_mut().map_err(|_| already_in_a_call())?;
        let (partial, _) = staging.areas(gpu.core, gpu.ordinal, call.bytes(1)?, 0)?;
        // SAFETY: the staging holds `count` elements; the rail step reads it and writes `recv`
        // on the root only.
        unsafe {
            step(self.intra(), Reduce, Some(op), (send, partial), count, dtype, root_local, stream)?;
            step(self.rail(), Reduce, Some(op), (partial, recv), count, dtype, root_node, stream)
        }
    }

    /// Broadcast of the call's elements from rank `root`'s `send` into every rank's `recv`, as
    /// steps on its stream (see the module doc).
    ///
    /// # Safety
    /// As `Communicator::broadcast_device_raw`.
    unsafe fn broadcast_device(&self, call: &Buffers<'_>, root: usize) -> Result<()> {
        let Buffers { send, recv, count, dtype, stream } = *call;
        let grid = self.grid();
        let (root_node, root_local) = (grid.node_of(root), grid.local_of(root));
        // SAFETY: (both steps) forwarded from the caller; the second step is in place in `recv`,
        // which the first one filled on the root's rail (the other ranks of a node wait for
        // their rail's rank in the node step).
        unsafe {
            if self.local() == root_local {
                step(self.rail(), Broadcast, None, (send, recv), count, dtype, root_node, stream)?;
            }
            step(self.intra(), Broadcast, None, (recv, recv), count, dtype, root_local, stream)
        }
    }
}

impl<C: StepRunner> Hierarchy<C> {
    /// Runs a device call that the plan gave to the hierarchical executor, as steps on
    /// `stream`; `device` is the parent communicator's GPU.
    ///
    /// # Safety
    /// As the raw device call it stands for: `send` and `recv` valid device memory for the
    /// call until it completes on `stream`.
    pub(crate) unsafe fn run_device(
        &self,
        call: &DeviceCall,
        device: &Device<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        // The copies between the steps are driver calls of this thread: its context current.
        device
            .ctx
            .bind_to_thread()
            .map_err(|e| Error::Cuda { operation: "bind context".into(), message: e.to_string() })?;
        let buffers = Buffers { send: call.send, recv: call.recv, count: call.count, dtype: call.dtype, stream };
        // SAFETY: forwarded from the caller.
        unsafe {
            match (call.collective, call.op) {
                (AllReduce, Some(op)) => self.all_reduce_device(&buffers, op),
                (AllGather, _) => self.all_gather_device(&buffers, device),
                (ReduceScatter, Some(op)) => self.reduce_scatter_device(&buffers, op, device),
                (Broadcast, _) => self.broadcast_device(&buffers, call.root),
                (Reduce, Some(op)) => self.reduce_device(&buffers, op, call.root, device),
                (c, _) => Err(Error::Unsupported(format!("{c} on device buffers has no hierarchical steps"))),
            }
        }
    }
}
