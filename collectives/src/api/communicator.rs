//! The user-facing communicator: collectives and point-to-point on host memory. How one is
//! built and assembled from its parts is `builder.rs`.

use std::cell::{Cell, OnceCell, RefCell};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use comm_core::bootstrap::Bootstrap;
use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::config::Config;
use comm_core::ledger::{CallKind, CallSignature};
use comm_core::notice::NoticeService;
use comm_core::resilience::Resilience;
use comm_core::transport::TransportFactory;
use comm_core::{Error, Result};

use crate::api::abort::AbortHandle;
use crate::api::arguments::{check_v, divisible, same_len};
use crate::api::buffer::SharedBuffer;
use crate::call::CollectiveCall;
use crate::channel::{AllToAllvCounts, ChannelEngine};
use crate::dtype::Element;
use crate::hierarchy::Hierarchy;
use crate::host::{self, AllToAllv, HostEngine};
use crate::op::ReduceOp;
use crate::select::cost::{self, LinkCost};
use crate::select::{CallShape, Plan, plan};
use crate::table::MemorySpace;
use crate::table::{Algorithm, AlgorithmTable, Collective};

/// One rank's handle on a group of ranks for collectives and point-to-point calls.
///
/// Every collective is called by every rank of the communicator in the same order; a rank that
/// passes different counts, operators or roots gets [`Error::InvalidArgument`] on every rank,
/// and a lost peer gives an error within the timeout, never a hang.
///
/// A communicator is used from one thread at a time, as an NCCL communicator is: it is `Send`
/// (move it to the thread that makes the calls) but not `Sync`, so a call takes no lock — a
/// lock's atomic instruction would make the processor wait for the call's stores to peers'
/// memory, which doubles the cost of a small eager call. Share one between threads inside a
/// `Mutex`; stop one from another thread with an [`AbortHandle`].
pub struct Communicator {
    /// The transport layer. The first field, so it drops first: its connections finish what
    /// this rank posted before the engines below release the memory peers write into
    /// (`Connection::finish_before_release`).
    pub(crate) core: CoreCommunicator,
    #[cfg(feature = "cuda")]
    pub(crate) gpu: Option<RefCell<crate::gpu::GpuEngine>>,
    /// The GPU engine's status words, for [`AbortHandle`]s.
    #[cfg(feature = "cuda")]
    pub(crate) gpu_status: Option<Arc<weave_cuda::DeviceStatus>>,
    /// The GPU knobs this communicator was built with (its splits get them too).
    #[cfg(feature = "cuda")]
    pub(crate) gpu_config: crate::gpu::GpuConfig,
    /// The direct host executor; `None` where some peer's memory is not mapped here.
    pub(crate) host: Option<RefCell<HostEngine>>,
    pub(crate) channel: RefCell<ChannelEngine>,
    pub(crate) table: AlgorithmTable,
    /// The plan of the last host call, and its shape: back-to-back calls of one shape (the
    /// common loop) skip the table.
    pub(crate) last_host_plan: Cell<Option<(CallShape, Plan)>>,
    /// The node and rail sub-communicators of hierarchical calls (built at the first).
    pub(crate) hierarchy: OnceCell<Box<Hierarchy<Communicator>>>,
    /// Steps of hierarchical calls this communicator (a node or rail one) has run so far.
    pub(crate) steps_run: Cell<u64>,
    pub(crate) factories: Vec<Arc<dyn TransportFactory>>,
    pub(crate) config: Config,
    pub(crate) root: Arc<dyn Bootstrap>,
    pub(crate) namespace: u64,
    pub(crate) root_ranks: Vec<usize>,
    /// Splits and shrinks made so far (numbering their namespaces).
    pub(crate) splits: AtomicU64,
    /// Revocation and failure agreements of this communicator.
    pub(crate) resilience: Arc<Resilience>,
    /// The root bootstrap's notice service.
    pub(crate) notices: Arc<NoticeService>,
    /// Agreements run so far (failed ranks learned from them stay known).
    pub(crate) known_failed: RefCell<std::collections::BTreeSet<usize>>,
    /// Per peer: groups of this rank that sent to it and received from it (`crate::matching`).
    pub(crate) pair_exchanges: RefCell<crate::matching::Exchanges>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.core.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.core.world_size()
    }

    /// The primitives layer (registered memory, channels) under this communicator.
    pub fn core(&self) -> &CoreCommunicator {
        &self.core
    }

    /// The algorithm table in force (after `WEAVE_ALGO` and builder overrides).
    pub fn algorithm_table(&self) -> &AlgorithmTable {
        &self.table
    }

    /// How many steps this communicator's hierarchical calls on host memory have run so far
    /// inside the node and across the rail, in that order (`None` before its first
    /// hierarchical call): how a test sees which steps a call took, e.g. that an all-reduce
    /// crosses the network once.
    pub fn hierarchical_steps(&self) -> Option<(u64, u64)> {
        self.hierarchy.get().map(|h| (h.intra().steps_run.get(), h.rail().steps_run.get()))
    }

    /// The algorithm this communicator would run for a call of `bytes` bytes on host memory.
    pub fn algorithm_for(&self, collective: Collective, bytes: usize) -> Result<Algorithm> {
        Ok(self.plan(CallShape::host(collective, bytes))?.algorithm)
    }

    /// The plan this communicator would run for `call` (see [`plan`]).
    pub fn plan(&self, call: CallShape) -> Result<Plan> {
        #[cfg(feature = "cuda")]
        if call.memory == MemorySpace::Device {
            let caps = self.gpu_caps()?;
            return plan(&self.table, call, self.core.topology(), Some(&caps));
        }
        plan(&self.table, call, self.core.topology(), None)
    }

    /// About how long `call` takes on this communicator, by the α-β-γ model of
    /// [`select::cost`](crate::select::cost): the plan [`plan`](Self::plan) picks, its steps
    /// and the bytes on its critical path, over NVLink ([`cost::NVLINK_H200`]) for device
    /// buffers and shared memory ([`cost::SHARED_MEMORY`]) for host buffers inside a node, and
    /// [`cost::NETWORK`] between nodes. A hierarchical plan counts a two-phase step inside the
    /// node and a ring across the nodes on its share of the data. An estimate from constants,
    /// not a measurement of this machine.
    pub fn estimated_time(&self, call: CallShape) -> Result<Duration> {
        let algorithm = self.plan(call)?.algorithm;
        let topology = self.core.topology();
        let inside: &LinkCost = match call.memory {
            MemorySpace::Device => &cost::NVLINK_H200,
            _ => &cost::SHARED_MEMORY,
        };
        let (n, nodes) = (self.world_size(), topology.node_count().max(1));
        let link = if nodes > 1 { &cost::NETWORK } else { inside };
        if let Some(t) = cost::estimated_time(call.collective, algorithm, n, call.bytes, link) {
            return Ok(t);
        }
        let per_node = topology.max_ranks_per_node().max(1);
        let node_step = cost::estimated_time(call.collective, Algorithm::TwoPhase, per_node, call.bytes, inside);
        let rail_step = cost::estimated_time(call.collective, Algorithm::Ring, nodes, call.bytes / per_node, link);
        match (node_step, rail_step) {
            (Some(a), Some(b)) => Ok(a + b),
            _ => Err(Error::Unsupported(format!("{}: no estimate for the plan {algorithm}", call.collective))),
        }
    }

    /// Collective: allocates `len` zeroed elements of shared memory on every rank (see
    /// [`SharedBuffer`]). Collectives whose input lies in one read it in place.
    pub fn alloc_shared<T: Element>(&self, len: usize) -> Result<SharedBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::invalid(format!("alloc_shared: {len} elements overflow")))?;
        let mut e = self.engine()?;
        let memory = e.alloc_shared(&self.core, bytes)?;
        Ok(SharedBuffer::new(memory, len))
    }

    /// Makes every current and future wait of this communicator fail with [`Error::Aborted`]
    /// (running GPU kernels of it stop too). From another thread, use an
    /// [`abort_handle`](Self::abort_handle).
    pub fn abort(&self) {
        self.abort_handle().abort();
    }

    /// A handle that aborts this communicator from any thread (a watchdog, a signal handler
    /// thread), as [`abort`](Self::abort) does; it may outlive the communicator.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle::new(
            Arc::downgrade(&self.resilience),
            #[cfg(feature = "cuda")]
            self.gpu_status.clone(),
        )
    }

    /// Picks the algorithm, serializes the call, and runs `call` on the executor the plan names
    /// — or, when `validation` failed, takes part in one step that tells every peer, and returns
    /// the local error.
    #[inline]
    fn collective<T: Element>(&self, bytes: usize, validation: Result<()>, call: CollectiveCall<T>) -> Result<()> {
        let signature = CallSignature::host(call.collective().0.call_kind(), bytes, call.root());
        self.ledgered(signature, || {
            // Nothing to move: done, as in NCCL and MPI (a rank that passes a non-zero count
            // while the others pass zero gets a timeout naming the peer instead of a mismatch
            // error).
            if bytes == 0 && validation.is_ok() {
                return Ok(());
            }
            self.step_as(bytes, validation, call, 0)
        })
    }

    fn bytes<T: Element>(count: usize) -> usize {
        count.saturating_mul(std::mem::size_of::<T>())
    }

    /// Sums (or applies `op` to) `send` across all ranks into `recv`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let check = same_len("all_reduce", "send", send.len(), "recv", recv.len());
        let (s, r, count) = (send.as_ptr(), recv.as_mut_ptr(), send.len());
        // The call: both slices hold `count` elements (checked) and are distinct borrows.
        let ch = CollectiveCall::AllReduce { send: s, recv: r, count, op };
        self.collective(Self::bytes::<T>(count), check, ch)
    }

    /// [`all_reduce`](Self::all_reduce) with the result written over the input.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (p, count) = (buf.as_mut_ptr(), buf.len());
        // The call: the buffer holds `count` elements; input and output are the same range.
        let ch = CollectiveCall::AllReduce { send: p, recv: p, count, op };
        self.collective(Self::bytes::<T>(count), Ok(()), ch)
    }

    /// Concatenates every rank's `send` into `recv` (rank r's block at `r * send.len()`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.world_size();
        let check = same_len("all_gather", "recv", recv.len(), "world_size × send", send.len().saturating_mul(n));
        let (s, r, count) = (send.as_ptr(), recv.as_mut_ptr(), send.len());
        // The call: send holds count, recv n × count elements (checked); distinct borrows.
        let ch = CollectiveCall::AllGather { send: s, recv: r, count };
        self.collective(Self::bytes::<T>(recv.len()), check, ch)
    }

    /// All-gather where this rank's contribution is already in its block of `buf`
    /// (`buf.len() / world_size` elements at `rank * buf.len() / world_size`).
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.world_size();
        let check = divisible("all_gather_in_place", buf.len(), n);
        let count = buf.len() / n;
        let p = buf.as_mut_ptr();
        let me = self.rank();
        // The call: the buffer holds n × count elements; the send block is this rank's block.
        // SAFETY: `me * count` lies inside the buffer once the check passed (else count is 0).
        let ch = CollectiveCall::AllGather { send: unsafe { p.add(me * count) }, recv: p, count };
        self.collective(Self::bytes::<T>(buf.len()), check, ch)
    }

    /// Reduces every rank's `send` (`world_size` blocks of `recv.len()`) and leaves block
    /// `rank` of the result in `recv`.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.world_size();
        let check = same_len("reduce_scatter", "send", send.len(), "world_size × recv", recv.len().saturating_mul(n));
        let (s, r, count) = (send.as_ptr(), recv.as_mut_ptr(), recv.len());
        // The call: send holds n × count, recv count elements (checked); distinct borrows.
        let ch = CollectiveCall::ReduceScatter { send: s, recv: r, count, op };
        self.collective(Self::bytes::<T>(send.len()), check, ch)
    }

    /// Reduce-scatter whose result lands in block `rank` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.world_size();
        let check = divisible("reduce_scatter_in_place", buf.len(), n);
        let count = buf.len() / n;
        let p = buf.as_mut_ptr();
        let me = self.rank();
        // The call: the buffer holds n × count elements; the result block is inside it.
        // SAFETY: `me * count` lies inside the buffer once the check passed (else count is 0).
        let ch = CollectiveCall::ReduceScatter { send: p, recv: unsafe { p.add(me * count) }, count, op };
        self.collective(Self::bytes::<T>(buf.len()), check, ch)
    }

    /// Copies `root`'s `send` into every rank's `recv`. `send` is read on the root only (other
    /// ranks may pass an empty slice).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let me = self.rank();
        let check = self.check_root("broadcast", root).and_then(|_| {
            if me == root { same_len("broadcast", "send", send.len(), "recv", recv.len()) } else { Ok(()) }
        });
        let (s, r, count) = (send.as_ptr(), recv.as_mut_ptr(), recv.len());
        // The call: recv holds count elements; on the root send does too (checked).
        let ch = CollectiveCall::Broadcast { send: s, recv: r, count, root };
        self.collective(Self::bytes::<T>(count), check, ch)
    }

    /// Broadcast from `root` in place.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let check = self.check_root("broadcast", root);
        let (p, count) = (buf.as_mut_ptr(), buf.len());
        // The call: the buffer holds count elements.
        let ch = CollectiveCall::Broadcast { send: p, recv: p, count, root };
        self.collective(Self::bytes::<T>(count), check, ch)
    }

    /// Reduces every rank's `send` into `recv` on `root`. `recv` is written on the root only
    /// (other ranks may pass an empty slice).
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let me = self.rank();
        let check = self
            .check_root("reduce", root)
            .and_then(|_| if me == root { same_len("reduce", "send", send.len(), "recv", recv.len()) } else { Ok(()) });
        let (s, r, count) = (send.as_ptr(), recv.as_mut_ptr(), send.len());
        // The call: send holds count elements; on the root recv does too (checked).
        let ch = CollectiveCall::Reduce { send: s, recv: r, count, op, root };
        self.collective(Self::bytes::<T>(count), check, ch)
    }

    /// Reduce to `root` in place (the root's `buf` receives the result; others keep theirs).
    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let check = self.check_root("reduce", root);
        let (p, count) = (buf.as_mut_ptr(), buf.len());
        // The call: the buffer holds count elements.
        let ch = CollectiveCall::Reduce { send: p, recv: p, count, op, root };
        self.collective(Self::bytes::<T>(count), check, ch)
    }

    /// Sends block q of `send` to rank q and receives rank p's block for this rank into block p
    /// of `recv` (blocks of `send.len() / world_size` elements).
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.world_size();
        let check = same_len("all_to_all", "send", send.len(), "recv", recv.len())
            .and_then(|_| divisible("all_to_all", send.len(), n));
        let (s, r, count) = (send.as_ptr(), recv.as_mut_ptr(), send.len() / n);
        // The call: both slices hold n × count elements (checked); distinct borrows.
        let ch = CollectiveCall::AllToAll { send: s, recv: r, count };
        self.collective(Self::bytes::<T>(send.len()), check, ch)
    }

    /// All-to-all in place.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = self.world_size();
        let check = divisible("all_to_all_in_place", buf.len(), n);
        let (p, count) = (buf.as_mut_ptr(), buf.len() / n);
        // The call: the buffer holds n × count elements.
        let ch = CollectiveCall::AllToAll { send: p, recv: p, count };
        self.collective(Self::bytes::<T>(buf.len()), check, ch)
    }

    /// All-to-all with per-peer counts and displacements (in elements): `send_counts[q]`
    /// elements at `send_displs[q]` go to rank q; rank p's data for this rank lands at
    /// `recv_displs[p]` (`recv_counts[p]` elements, which must equal what p sends).
    pub fn all_to_allv<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let n = self.world_size();
        let check = check_v("send", send.len(), send_counts, send_displs, n, false)
            .and_then(|_| check_v("recv", recv.len(), recv_counts, recv_displs, n, true));
        let (s, r) = (send.as_ptr(), recv.as_mut_ptr());
        let bytes = Self::bytes::<T>(send.len());
        let through_links = |e: &mut ChannelEngine, _, invalid| {
            let v = AllToAllvCounts { send_counts, send_displs, recv_counts, recv_displs };
            // SAFETY: as below; an invalid rank moves no data.
            unsafe { crate::channel::all_to_allv(e, &self.core, s, r, v, invalid) }
        };
        let on_host = |e: &mut HostEngine, a| {
            let v = AllToAllv { send_counts, send_displs, recv_counts, recv_displs };
            // SAFETY: every block lies inside its slice and receive blocks do not overlap
            // (checked); send and recv are distinct borrows.
            unsafe { host::all_to_allv(e, a, s, r, v) }
        };
        let in_steps = |_: &Hierarchy<Communicator>, _| {
            Err(Error::Unsupported("all_to_allv has no hierarchical algorithm; the plan never picks one".into()))
        };
        let signature = CallSignature::host(CallKind::AllToAllv, bytes, None);
        self.ledgered(signature, || {
            self.run_planned::<T>(Collective::AllToAllv, None, bytes, check, through_links, on_host, in_steps)
        })
    }

    #[inline(always)]
    fn check_root(&self, what: &str, root: usize) -> Result<()> {
        let n = self.world_size();
        if root >= n {
            return Err(root_outside(what, root, n));
        }
        Ok(())
    }
}

/// The error of a root that is no rank of an `n`-rank communicator, kept off the path of every
/// call.
#[cold]
#[inline(never)]
fn root_outside(what: &str, root: usize, n: usize) -> Error {
    Error::invalid(format!("{what}: root {root} is not a rank of this {n}-rank communicator"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use comm_core::loopback::{LoopbackBootstrap, LoopbackTransport};

    use super::*;

    /// Four thread ranks on host memory: every rank estimates the same time for a call, the
    /// model's time of the algorithm the plan picks over shared memory, more for more bytes.
    #[test]
    fn estimates_follow_the_plan_and_the_model() {
        const N: usize = 4;
        let group = LoopbackBootstrap::group(N, Duration::from_secs(20));
        std::thread::scope(|s| {
            let handles: Vec<_> = group
                .into_iter()
                .map(|b| {
                    s.spawn(move || {
                        let comm = Communicator::builder(b).with_transport(LoopbackTransport).build().expect("build");
                        let mut times = Vec::new();
                        for bytes in [8, 64 << 10, 64 << 20] {
                            let shape = CallShape::host(Collective::AllReduce, bytes);
                            let t = comm.estimated_time(shape).expect("an estimate");
                            let algorithm = comm.plan(shape).expect("a plan").algorithm;
                            let model =
                                cost::estimated_time(Collective::AllReduce, algorithm, N, bytes, &cost::SHARED_MEMORY);
                            assert_eq!(Some(t), model, "{bytes} B by {algorithm}");
                            times.push(t);
                        }
                        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
                        times
                    })
                })
                .collect();
            let all: Vec<_> = handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect();
            assert!(all.iter().all(|t| *t == all[0]), "ranks disagree: {all:?}");
        });
    }
}
