//! Device buffers across nodes: the hierarchical plan ([`crate::hierarchy`]) as device calls of
//! the node and rail sub-communicators, queued one after another on the caller's stream. The
//! stream keeps them in order (each step reads what the step before wrote), so the caller
//! synchronizes once, as for any device call, and a CUDA graph captures every step. Inside a
//! node the steps run whatever the node communicator picks (the direct kernels where its GPUs
//! map each other), across nodes the rail's channel algorithms.
//!
//! | collective | inside the node | across nodes (the rail) | inside the node |
//! |---|---|---|---|
//! | all-reduce | reduce-scatter into this rank's shard of `recv` | all-reduce of the shard, in place | all-gather of the shards, in place |
//! | broadcast | | broadcast on the root's rail into `recv` | broadcast in place from the root's local rank |
//!
//! An all-reduce's last `count % L` elements (`L` ranks per node) go as an all-reduce in the
//! node, then one across the rail, both in place in `recv`. `Avg` averages in every step — the
//! mean over the nodes of each node's mean, which is the mean over every rank because the
//! nodes hold equally many ranks; integer averages would truncate at each step, so the plan
//! keeps those flat ([`crate::select::plan_flat`]). All-gather, reduce-scatter and reduce would
//! need device staging to reorder blocks or hold a node's partial result, and stay flat.
//!
//! The node and rail communicators are split from this one at its first hierarchical call
//! (host or device), which every rank makes at the same point because every rank plans the
//! same call alike. That split allocates GPU memory for the sub-communicators, so the first
//! hierarchical device call must not be inside a stream capture.

use std::sync::Arc;

use comm_core::{Error, Result};
use cudarc::driver::CudaStream;

use crate::communicator::Communicator;
use crate::dtype::DataType;
use crate::hierarchy::Hierarchy;
use crate::op::ReduceOp;

/// What a hierarchical device call moves: device addresses, elements of `dtype`, the stream.
#[derive(Clone, Copy)]
struct Buffers<'a> {
    send: u64,
    recv: u64,
    count: usize,
    dtype: DataType,
    stream: &'a Arc<CudaStream>,
}

impl Hierarchy {
    /// All-reduce of the call's elements from `send` into `recv` (may be equal), as steps on
    /// its stream (see the module doc).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_device_raw`].
    unsafe fn all_reduce_device(&self, call: &Buffers<'_>, op: ReduceOp) -> Result<()> {
        let Buffers { send, recv, count, dtype, stream } = *call;
        let l = self.grid().ranks_per_node;
        let (shard, size) = (count / l, dtype.size() as u64);
        let main = shard * l;
        let tail = count - main;
        let at = |base: u64, elements: usize| base + elements as u64 * size;
        let mine = at(recv, self.local() * shard);
        let (intra, rail) = (self.intra(), self.rail());
        // Every step is queued even when it has no elements, as on the host: every rank of a
        // sub-communicator makes the same calls.
        // SAFETY: (every step) the shard, the main part and the tail lie inside `send` and
        // `recv`, which the caller keeps valid until the stream has run the steps; the in-place
        // forms are the ones each call documents.
        unsafe {
            intra.reduce_scatter_device_raw(send, mine, shard, dtype, op, stream)?;
            rail.all_reduce_device_raw(mine, mine, shard, dtype, op, stream)?;
            intra.all_gather_device_raw(mine, recv, shard, dtype, stream)?;
            let (s, r) = (at(send, main), at(recv, main));
            intra.all_reduce_device_raw(s, r, tail, dtype, op, stream)?;
            rail.all_reduce_device_raw(r, r, tail, dtype, op, stream)
        }
    }

    /// Broadcast of the call's elements from rank `root`'s `send` into every rank's `recv`, as
    /// steps on its stream (see the module doc).
    ///
    /// # Safety
    /// As [`Communicator::broadcast_device_raw`].
    unsafe fn broadcast_device(&self, call: &Buffers<'_>, root: usize) -> Result<()> {
        let Buffers { send, recv, count, dtype, stream } = *call;
        let grid = self.grid();
        let (root_node, root_local) = (grid.node_of(root), grid.local_of(root));
        // SAFETY: (both steps) forwarded from the caller; the second step is in place in `recv`,
        // which the first one filled on the root's rail (the other ranks of a node wait for
        // their rail's rank in the node step).
        unsafe {
            if self.local() == root_local {
                self.rail().broadcast_device_raw(send, recv, count, dtype, root_node, stream)?;
            }
            self.intra().broadcast_device_raw(recv, recv, count, dtype, root_local, stream)
        }
    }
}

impl Communicator {
    /// Runs a device call that the plan gave to the hierarchical executor.
    ///
    /// # Safety
    /// As the raw device call it stands for: `send` and `recv` valid device memory for the
    /// call until it completes on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn hierarchical_device_call(
        &self,
        collective: crate::table::Collective,
        buffers: (u64, u64),
        count: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let h = self.hierarchy()?;
        let call = Buffers { send: buffers.0, recv: buffers.1, count, dtype, stream };
        // SAFETY: forwarded from the caller.
        unsafe {
            match (collective, op) {
                (crate::table::Collective::AllReduce, Some(op)) => h.all_reduce_device(&call, op),
                (crate::table::Collective::Broadcast, _) => h.broadcast_device(&call, root),
                (c, _) => Err(Error::Unsupported(format!("{c} on device buffers has no hierarchical steps"))),
            }
        }
    }
}
