//! The hierarchical executor: a collective of a job that spans several nodes, run as steps
//! inside each node and across nodes, so that every byte crosses the network once.
//!
//! The nodes must form a grid ([`NodeGrid`]: the same number `L` of consecutive ranks on every
//! node, as launchers place them). Two sub-communicators carry the steps, both split from the
//! communicator at its first hierarchical call: the **node** (the `L` ranks of this rank's
//! node, ordered by local rank, where shared memory reaches every peer) and the **rail** (the
//! ranks of this rank's local rank on every node, ordered by node, reached over the network).
//! Each step is an ordinary collective of its sub-communicator, so it runs whatever that
//! communicator's table picks for it (direct or eager inside a node, channel algorithms across).
//!
//! | collective | inside the node | across nodes (the rail) | inside the node |
//! |---|---|---|---|
//! | all-reduce | reduce-scatter into this rank's shard; all-reduce of the tail | all-reduce of the shard (and the tail, on the last local rank's rail) | all-gather of the shards; broadcast of the tail from the last local rank |
//! | all-reduce, small | reduce to the last local rank | all-reduce on its rail | broadcast from it |
//! | all-gather | | all-gather of this rank's block | all-gather, then blocks reordered |
//! | all-gather, small | all-gather of the node's blocks | all-gather of them on the last local rank's rail | broadcast from the last local rank |
//! | reduce-scatter | blocks reordered, reduce-scatter | reduce-scatter | |
//! | broadcast | | broadcast on the root's rail | broadcast from the root's local rank |
//! | reduce | reduce to the root's local rank | reduce on the root's rail | |
//!
//! **All-reduce.** From 64 KiB, the `count` elements split into a main part of `L` shards of
//! `count / L` elements and a tail of the last `count % L`. Six steps, in this order:
//!
//! 1. reduce-scatter of the main part in the node, into this rank's shard of `recv`;
//! 2. all-reduce of the tail in the node;
//! 3. one all-reduce across the rail, in place: of the shard, and on the last local rank
//!    (`L - 1`) of its shard and the tail together, which lie next to each other in `recv`;
//! 4. `Avg` divides what that step summed;
//! 5. all-gather of the shards in the node;
//! 6. broadcast of the tail in the node from the last local rank.
//!
//! So a call crosses the network once, in one step per rail, all rails at once: a TCP exchange
//! costs more than the node steps around it, and a second rail step (the tail's, once run on
//! its own) doubled the latency of small calls. Each rail is its own communicator, so the
//! counts agree within a rail although the last one carries more.
//!
//! A call of less than 64 KiB in all (`select::forms::HIERARCHY_ONE_RAIL_BYTES`) keeps no shards and runs three steps:
//! a reduce to the last local rank in the node, an all-reduce on that rank's rail, and a
//! broadcast from it in the node. The other rails stay quiet: one network message per node
//! beats `L` smaller ones with a reduce-scatter and an all-gather around them, and an empty
//! step on every other rail still cost each of them a message across.
//!
//! A main part of at least 8 MiB runs steps 1, 3 and 5 in chunks instead, the rail step of one
//! chunk beside the node steps of the next and the previous ([`pipeline`]), and then its tail
//! as an all-reduce in the node and one across the rail. `Avg` sums through the steps and
//! divides once its elements hold the sum over every rank, as the flat algorithms do.
//!
//! Every step a rank runs is one its peers in that step run too, whatever the counts: steps
//! go even with no elements (they still exchange their headers), so ranks whose counts differ
//! meet in a step that reports it rather than one rank waiting in a step the others skipped.
//! (In an all-reduce, two counts that differ differ in the shard, which steps 1 and 5 and every
//! rail compare, or in the last rail's elements; a small all-reduce's first step in the node
//! and its one rail compare the counts.) The exceptions are the steps that depend on what
//! ranks must agree on: a broadcast's or reduce's root picks the rail that runs, and an
//! all-reduce's or all-gather's size whether the other rails run. Where nodes disagree on those, a rank may
//! wait in a rail step its peer skipped until its timeout, as a rank that passes a non-zero
//! count where the others pass zero does. An all-reduce small on one node and sharded on
//! another still fails on the last rail, whose steps carry their form (`ONE_RAIL`,
//! `EVERY_RAIL`) in the header: the small node's ranks and the sharded node's last rank
//! report the mismatch, the sharded node's other ranks time out. Small all-gathers likewise.
//!
//! **Agreement.** A step that finds a mismatch (or a rank whose own arguments were invalid)
//! makes the rank take part in its later steps as an invalid rank, so the error travels on to
//! every rank those steps reach: in an all-reduce, all-gather and reduce-scatter that is every
//! rank. A broadcast or reduce tells the ranks its steps receive at, as its flat algorithms
//! do (small steps run eagerly, whose senders hear of nothing).

#[cfg(feature = "cuda")]
mod device;
mod pipeline;

use std::cell::RefCell;
#[cfg(feature = "cuda")]
use std::sync::Arc;

use comm_core::topology::NodeGrid;
use comm_core::{Error, Result};
#[cfg(feature = "cuda")]
use cudarc::driver::CudaStream;

use crate::call::CollectiveCall;
#[cfg(feature = "cuda")]
use crate::call::DeviceCall;
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::reduce_raw;
use crate::select::forms::{HIERARCHY_ONE_RAIL_BYTES, HIERARCHY_PIPELINE_BYTES};
#[cfg(feature = "cuda")]
pub(crate) use device::Device;

/// The forms of a rail step, carried in its headers: of a small call, which crosses the network
/// on the last local rank's rail alone, and of a larger one, which runs every rail. A call small
/// on one node and larger on another (counts that differ) would otherwise meet on the last rail
/// with counts that may agree, and compute a wrong result without a word.
const ONE_RAIL: u8 = 1;
const EVERY_RAIL: u8 = 2;

/// What the hierarchical executor needs of the communicators its steps run on: the node and
/// the rail, both split from the communicator the call was made on. `exec/` implements it
/// for the communicator; the hierarchy names no communicator type.
///
/// # Safety
/// A pipelined all-reduce lends the rail to a second thread for the length of one call
/// (`pipeline.rs`) while the calling thread runs the node's steps: an implementor must allow a
/// `&Self` to be used from another thread while no other thread uses the same value — its
/// state that is not `Sync` belongs to that value alone, and what it shares with other values
/// (bootstrap, transports, registries) is `Sync`.
pub(crate) unsafe trait StepRunner: Sized {
    /// This rank in the step's communicator.
    fn rank(&self) -> usize;

    /// Ranks of the step's communicator.
    fn world_size(&self) -> usize;

    /// Collective: the communicator of the ranks that pass this `color`, ordered by `key` (a
    /// node or a rail of this one).
    fn split_for_steps(&self, color: usize, key: usize) -> Result<Option<Self>>;

    /// Counts one step of a hierarchical call run on this communicator.
    fn count_step(&self);

    /// One step on host memory in form `variant` of its collective (see [`ONE_RAIL`]): a
    /// collective even when it moves nothing (the ranks still exchange what they called), or —
    /// when `valid` holds this rank's failed check — one that tells every peer, returning the
    /// local error.
    fn step_as<T: Element>(&self, bytes: usize, valid: Result<()>, call: CollectiveCall<T>, variant: u8) -> Result<()>;

    /// One step on device buffers, queued on `stream`, as the raw device call it stands for.
    ///
    /// # Safety
    /// The addresses in `call` valid device memory for the call until it completes on `stream`.
    #[cfg(feature = "cuda")]
    unsafe fn device_step(&self, call: DeviceCall, stream: &Arc<CudaStream>) -> Result<()>;
}

/// The sub-communicators and staging of a communicator's hierarchical calls.
pub(crate) struct Hierarchy<C> {
    grid: NodeGrid,
    /// This rank's node index.
    node: usize,
    /// This rank's local rank on its node (and its rail).
    local: usize,
    /// The ranks of this rank's node, by local rank.
    intra: C,
    /// The ranks with this rank's local rank on every node, by node.
    rail: C,
    /// Staging for the steps that reorder blocks or hold a node's partial result, kept
    /// between calls (words, so that every element type is aligned in it).
    scratch: RefCell<Vec<u64>>,
}

impl<C: StepRunner> Hierarchy<C> {
    /// Collective over `parent`: splits it into its nodes and rails (every rank of `parent`
    /// calls this at the same call). `grid` is the parent's node grid.
    pub(crate) fn new(parent: &C, grid: NodeGrid) -> Result<Self> {
        let me = parent.rank();
        let (node, local) = (grid.node_of(me), grid.local_of(me));
        let missing = |what: &str| Error::protocol(format!("rank {me} got no {what} communicator from its split"));
        let intra = parent.split_for_steps(node, local)?.ok_or_else(|| missing("node"))?;
        let rail = parent.split_for_steps(local, node)?.ok_or_else(|| missing("rail"))?;
        let (l, n) = (grid.ranks_per_node, grid.nodes);
        if intra.world_size() != l || rail.world_size() != n || intra.rank() != local || rail.rank() != node {
            return Err(Error::protocol(format!(
                "rank {me}: the node and rail communicators have {} and {} ranks (rank {} and {}) where the node grid \
                 says {l} and {n} (rank {local} and {node})",
                intra.world_size(),
                rail.world_size(),
                intra.rank(),
                rail.rank()
            )));
        }
        Ok(Hierarchy { grid, node, local, intra, rail, scratch: RefCell::new(Vec::new()) })
    }

    /// The node's grid.
    #[cfg(feature = "cuda")]
    pub(crate) fn grid(&self) -> NodeGrid {
        self.grid
    }

    /// This rank's local rank on its node.
    #[cfg(feature = "cuda")]
    pub(crate) fn local(&self) -> usize {
        self.local
    }

    /// The ranks of this rank's node, by local rank.
    pub(crate) fn intra(&self) -> &C {
        &self.intra
    }

    /// The ranks with this rank's local rank on every node, by node.
    pub(crate) fn rail(&self) -> &C {
        &self.rail
    }

    /// Runs `call` as steps (see the module doc); `validation` is this rank's own check of its
    /// arguments, whose error it returns after taking part in every step without data.
    ///
    /// # Safety
    /// `call` as the user API builds it: pointers valid for their counts where this rank reads
    /// or writes them, receive ranges writable and identical to or disjoint from send ranges.
    pub(crate) unsafe fn run<T: Element>(&self, call: CollectiveCall<T>, validation: Result<()>) -> Result<()> {
        let mut steps = Steps { problem: validation.err() };
        // SAFETY: (every arm) forwarded from the caller.
        unsafe {
            match call {
                CollectiveCall::AllReduce { send, recv, count, op } => {
                    self.all_reduce(&mut steps, Part { send, recv, count }, op)?
                }
                CollectiveCall::AllGather { send, recv, count } => {
                    self.all_gather(&mut steps, Part { send, recv, count })?
                }
                CollectiveCall::ReduceScatter { send, recv, count, op } => {
                    self.reduce_scatter(&mut steps, Part { send, recv, count }, op)?
                }
                CollectiveCall::Broadcast { send, recv, count, root } => {
                    self.broadcast(&mut steps, Part { send, recv, count }, root)?
                }
                CollectiveCall::Reduce { send, recv, count, op, root } => {
                    self.reduce(&mut steps, Part { send, recv, count }, op, root)?
                }
                CollectiveCall::AllToAll { .. } => {
                    return Err(Error::Unsupported(
                        "all_to_all has no hierarchical algorithm (its channel rows already cross the network once \
                         per byte)"
                            .into(),
                    ));
                }
            }
        }
        steps.finish()
    }

    /// # Safety
    /// As [`run`](Self::run) for an all-reduce of `count` elements.
    unsafe fn all_reduce<T: Element>(&self, steps: &mut Steps, part: Part<T>, op: ReduceOp) -> Result<()> {
        let Part { send, recv, count } = part;
        let l = self.grid.ranks_per_node;
        let size = std::mem::size_of::<T>();
        let step_op = summing(op);
        if count.saturating_mul(size) < HIERARCHY_ONE_RAIL_BYTES {
            // SAFETY: forwarded from the caller.
            return unsafe { self.all_reduce_small(steps, part, op) };
        }
        let shard = count / l;
        let main = shard * l;
        let tail = count - main;
        // SAFETY: main + tail = count: inside both buffers.
        let (s, r) = unsafe { (send.add(main), recv.add(main)) };
        let tail_in_node = CollectiveCall::AllReduce { send: s, recv: r, count: tail, op: step_op };
        if main * size >= HIERARCHY_PIPELINE_BYTES {
            // SAFETY: forwarded from the caller; main <= count.
            unsafe { self.all_reduce_pipelined(steps, send, recv, main, op)? };
            steps.run(&self.intra, tail * size, tail_in_node)?;
            let tail_across = CollectiveCall::AllReduce { send: r, recv: r, count: tail, op: step_op };
            steps.run(&self.rail, tail * size, tail_across)?;
            // SAFETY: the tail holds the sum over every rank.
            unsafe { self.finish_avg(steps, op, r, tail) };
            return Ok(());
        }
        // The same six steps for every count of this size, even an empty tail: a mismatched
        // count changes the shard (compared by the node steps and every rail) or the last
        // rail's elements, so some step fails on some rank, and the node steps after the rail
        // step carry that to the rest.
        // The last local rank's rail carries its shard and the tail, contiguous in recv.
        let across = if self.local == l - 1 { shard + tail } else { shard };
        // SAFETY: local·shard + across <= count: inside recv.
        let mine = unsafe { recv.add(self.local * shard) };
        let rs = CollectiveCall::ReduceScatter { send, recv: mine, count: shard, op: step_op };
        steps.run(&self.intra, main * size, rs)?;
        steps.run(&self.intra, tail * size, tail_in_node)?;
        let ar = CollectiveCall::AllReduce { send: mine, recv: mine, count: across, op: step_op };
        steps.run_as(&self.rail, across * size, ar, EVERY_RAIL)?;
        // SAFETY: the rail step's range holds the sum over every rank.
        unsafe { self.finish_avg(steps, op, mine, across) };
        steps.run(&self.intra, main * size, CollectiveCall::AllGather { send: mine, recv, count: shard })?;
        let root = l - 1;
        steps.run(&self.intra, tail * size, CollectiveCall::Broadcast { send: r, recv: r, count: tail, root })
    }

    /// A small all-reduce: a reduce to the last local rank in the node, an all-reduce on that
    /// rank's rail, a broadcast from it in the node. The other rails stay quiet, so the network
    /// carries one message per node and step instead of one per rank.
    ///
    /// # Safety
    /// As [`run`](Self::run) for an all-reduce of `count` elements.
    unsafe fn all_reduce_small<T: Element>(&self, steps: &mut Steps, part: Part<T>, op: ReduceOp) -> Result<()> {
        let Part { send, recv, count } = part;
        let root = self.grid.ranks_per_node - 1;
        let bytes = count * std::mem::size_of::<T>();
        let step_op = summing(op);
        steps.run(&self.intra, bytes, CollectiveCall::Reduce { send, recv, count, op: step_op, root })?;
        if self.local == root {
            let across = CollectiveCall::AllReduce { send: recv, recv, count, op: step_op };
            steps.run_as(&self.rail, bytes, across, ONE_RAIL)?;
            // SAFETY: recv holds the sum over every rank.
            unsafe { self.finish_avg(steps, op, recv, count) };
        }
        steps.run(&self.intra, bytes, CollectiveCall::Broadcast { send: recv, recv, count, root })
    }

    /// # Safety
    /// As [`run`](Self::run) for an all-gather of `count` elements per rank.
    unsafe fn all_gather<T: Element>(&self, steps: &mut Steps, part: Part<T>) -> Result<()> {
        let Part { send, recv, count } = part;
        let (l, nodes) = (self.grid.ranks_per_node, self.grid.nodes);
        let n = l * nodes;
        let size = std::mem::size_of::<T>();
        if n.saturating_mul(count).saturating_mul(size) < HIERARCHY_ONE_RAIL_BYTES {
            // SAFETY: forwarded from the caller.
            return unsafe { self.all_gather_small(steps, part) };
        }
        let mut scratch = self.scratch.borrow_mut();
        // Across the rail, this rank's block from every node ([node]); then inside the node,
        // those of every local rank ([local][node]); then reordered into rank order.
        let (across, inside) = staging::<T>(&mut scratch, nodes * count, n * count)?;
        let on_rail = CollectiveCall::AllGather { send, recv: across, count };
        steps.run_as(&self.rail, nodes * count * size, on_rail, EVERY_RAIL)?;
        steps.run(
            &self.intra,
            n * count * size,
            CollectiveCall::AllGather { send: across, recv: inside, count: nodes * count },
        )?;
        if steps.ok() {
            // SAFETY: the staging and recv each hold n·count elements; the staging is private.
            unsafe { transpose_blocks(inside, recv, l, nodes, count) };
        }
        Ok(())
    }

    /// A small all-gather: in the node, into the node's place in `recv` (its ranks' blocks
    /// lie there in rank order); across the last local rank's rail, node blocks in node order,
    /// which is rank order; a broadcast of the whole from that rank in the node. The other
    /// rails stay quiet, as in [`all_reduce_small`](Self::all_reduce_small).
    ///
    /// # Safety
    /// As [`run`](Self::run) for an all-gather of `count` elements per rank.
    unsafe fn all_gather_small<T: Element>(&self, steps: &mut Steps, part: Part<T>) -> Result<()> {
        let Part { send, recv, count } = part;
        let (l, nodes) = (self.grid.ranks_per_node, self.grid.nodes);
        let (root, size) = (l - 1, std::mem::size_of::<T>());
        // SAFETY: node·l·count + l·count <= n·count: inside recv.
        let node_blocks = unsafe { recv.add(self.node * l * count) };
        let inside = CollectiveCall::AllGather { send, recv: node_blocks, count };
        steps.run(&self.intra, l * count * size, inside)?;
        let all = nodes * l * count;
        if self.local == root {
            let across = CollectiveCall::AllGather { send: node_blocks, recv, count: l * count };
            steps.run_as(&self.rail, all * size, across, ONE_RAIL)?;
        }
        steps.run(&self.intra, all * size, CollectiveCall::Broadcast { send: recv, recv, count: all, root })
    }

    /// # Safety
    /// As [`run`](Self::run) for a reduce-scatter into `count` elements per rank.
    unsafe fn reduce_scatter<T: Element>(&self, steps: &mut Steps, part: Part<T>, op: ReduceOp) -> Result<()> {
        let Part { send, recv, count } = part;
        let (l, nodes) = (self.grid.ranks_per_node, self.grid.nodes);
        let n = l * nodes;
        let size = std::mem::size_of::<T>();
        let step_op = summing(op);
        let mut scratch = self.scratch.borrow_mut();
        let (by_local, node_sums) = staging::<T>(&mut scratch, n * count, nodes * count)?;
        if steps.ok() {
            // The input reordered to [local][node], so that the node step hands each local rank
            // the blocks of its rail.
            // SAFETY: send and the staging each hold n·count elements; the staging is private.
            unsafe { transpose_blocks(send, by_local, nodes, l, count) };
        }
        let inside =
            CollectiveCall::ReduceScatter { send: by_local, recv: node_sums, count: nodes * count, op: step_op };
        steps.run(&self.intra, n * count * size, inside)?;
        let across = CollectiveCall::ReduceScatter { send: node_sums, recv, count, op: step_op };
        steps.run(&self.rail, nodes * count * size, across)?;
        // SAFETY: recv holds the sum over every rank.
        unsafe { self.finish_avg(steps, op, recv, count) };
        Ok(())
    }

    /// # Safety
    /// As [`run`](Self::run) for a broadcast of `count` elements from `root`.
    unsafe fn broadcast<T: Element>(&self, steps: &mut Steps, part: Part<T>, root: usize) -> Result<()> {
        let Part { send, recv, count } = part;
        let (root_node, root_local) = (self.grid.node_of(root), self.grid.local_of(root));
        let bytes = count * std::mem::size_of::<T>();
        if self.local == root_local {
            steps.run(&self.rail, bytes, CollectiveCall::Broadcast { send, recv, count, root: root_node })?;
        }
        steps.run(&self.intra, bytes, CollectiveCall::Broadcast { send: recv, recv, count, root: root_local })
    }

    /// # Safety
    /// As [`run`](Self::run) for a reduce of `count` elements to `root`.
    unsafe fn reduce<T: Element>(&self, steps: &mut Steps, part: Part<T>, op: ReduceOp, root: usize) -> Result<()> {
        let Part { send, recv, count } = part;
        let (root_node, root_local) = (self.grid.node_of(root), self.grid.local_of(root));
        let bytes = count * std::mem::size_of::<T>();
        let step_op = summing(op);
        if self.local != root_local {
            return steps.run(
                &self.intra,
                bytes,
                CollectiveCall::Reduce { send, recv, count, op: step_op, root: root_local },
            );
        }
        // The node's partial result: in recv on the root, in the staging on the other ranks of
        // its rail.
        let mut scratch = self.scratch.borrow_mut();
        let partial = if self.node == root_node { recv } else { staging::<T>(&mut scratch, count, 0)?.0 };
        steps.run(
            &self.intra,
            bytes,
            CollectiveCall::Reduce { send, recv: partial, count, op: step_op, root: root_local },
        )?;
        let across = CollectiveCall::Reduce { send: partial, recv: partial, count, op: step_op, root: root_node };
        steps.run(&self.rail, bytes, across)?;
        if self.node == root_node {
            // SAFETY: the root's recv holds the sum over every rank.
            unsafe { self.finish_avg(steps, op, recv, count) };
        }
        Ok(())
    }

    /// Divides `len` elements at `data`, which hold a sum over every rank, by the rank count
    /// when the call's operator is `Avg` (and every step so far went well).
    ///
    /// # Safety
    /// `data` valid for `len` reads and writes.
    unsafe fn finish_avg<T: Element>(&self, steps: &Steps, op: ReduceOp, data: *mut T, len: usize) {
        if op == ReduceOp::Avg && steps.ok() {
            let n = self.grid.nodes * self.grid.ranks_per_node;
            // SAFETY: one source, the output itself (exact aliasing is allowed), len elements.
            unsafe { reduce_raw(ReduceOp::Avg, n, data, &[data.cast_const()], len) };
        }
    }
}

/// This rank's buffers of a call and its element count, as the collective defines it.
#[derive(Clone, Copy)]
struct Part<T> {
    send: *const T,
    recv: *mut T,
    count: usize,
}

/// Copies the `rows × cols` blocks of `count` elements at `src` (row-major: block (r, c) at
/// `(r·cols + c)·count`) to `dst` in column-major order (block (r, c) at `(c·rows + r)·count`).
///
/// # Safety
/// `src` valid for `rows·cols·count` reads, `dst` for as many writes, the two disjoint.
unsafe fn transpose_blocks<T>(src: *const T, dst: *mut T, rows: usize, cols: usize, count: usize) {
    for r in 0..rows {
        for c in 0..cols {
            // SAFETY: both blocks lie inside their rows·cols·count elements (caller).
            unsafe {
                std::ptr::copy_nonoverlapping(src.add((r * cols + c) * count), dst.add((c * rows + r) * count), count)
            };
        }
    }
}

/// The operator of the steps: `Avg` sums, and the last step divides.
fn summing(op: ReduceOp) -> ReduceOp {
    if op == ReduceOp::Avg { ReduceOp::Sum } else { op }
}

/// Two staging areas of `a` and `b` elements of `T` in `scratch` (grown as needed, aligned for
/// every element type), valid until `scratch` is next borrowed.
fn staging<T: Element>(scratch: &mut Vec<u64>, a: usize, b: usize) -> Result<(*mut T, *mut T)> {
    let words = |elems: usize| {
        elems.checked_mul(std::mem::size_of::<T>()).map(|bytes| bytes.div_ceil(8)).ok_or_else(|| {
            Error::invalid(format!("a hierarchical call of {elems} elements overflows the staging size"))
        })
    };
    let (wa, wb) = (words(a)?, words(b)?);
    let total = wa.checked_add(wb).ok_or_else(|| Error::invalid("hierarchical staging overflows"))?;
    if scratch.len() < total {
        scratch.try_reserve_exact(total - scratch.len()).map_err(|e| {
            Error::Unsupported(format!("cannot allocate {} bytes of hierarchical staging: {e}", total * 8))
        })?;
        scratch.resize(total, 0);
    }
    let base = scratch.as_mut_ptr();
    // SAFETY: wa <= total words: inside the vector.
    Ok((base.cast::<T>(), unsafe { base.add(wa) }.cast::<T>()))
}

/// The steps of one hierarchical call on this rank: the first problem it found or was told of.
struct Steps {
    problem: Option<Error>,
}

impl Steps {
    /// Whether no step (and not this rank's own check) has found a problem.
    fn ok(&self) -> bool {
        self.problem.is_none()
    }

    /// Runs one step on `comm`, `bytes` as its table measures the call. A mismatch it reports
    /// (or an earlier one) makes this rank take part without data, so every rank of `comm`
    /// hears of it; other errors (a lost peer, a timeout) end the call.
    fn run<T: Element>(&mut self, comm: &impl StepRunner, bytes: usize, call: CollectiveCall<T>) -> Result<()> {
        self.run_as(comm, bytes, call, 0)
    }

    /// [`run`](Self::run) in form `variant` of its collective (see [`ONE_RAIL`]).
    fn run_as<T: Element>(
        &mut self,
        comm: &impl StepRunner,
        bytes: usize,
        call: CollectiveCall<T>,
        variant: u8,
    ) -> Result<()> {
        let validation = match self.problem {
            Some(_) => Err(Error::invalid("an earlier step of this hierarchical call failed")),
            None => Ok(()),
        };
        comm.count_step();
        match comm.step_as(bytes, validation, call, variant) {
            Ok(()) => Ok(()),
            Err(e @ Error::InvalidArgument(_)) => {
                self.problem.get_or_insert(e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The call's result: its first problem, if any.
    fn finish(self) -> Result<()> {
        self.problem.map_or(Ok(()), Err)
    }
}
