//! `ncclGroupStart` / `ncclGroupEnd`, and the ordering of one communicator's calls.
//!
//! Inside a group (groups nest; only the outermost `ncclGroupEnd` acts) calls are checked and
//! queued per thread; inits started inside it run in the background, and splits, shrinks and
//! grows wait for its end (`derived.rs`). At the outermost end:
//!
//! 1. its splits, shrinks and grows are made, each parent's in the order asked, one thread per
//!    parent (so one thread may derive the communicators of several ranks of a process), while
//!    its inits run in the background (a grow's joiners among them); then the inits are waited
//!    for (a non-blocking one makes the end return `ncclInProgress`), and its window
//!    registrations run, one thread per communicator;
//! 2. the queued calls are split by communicator (the handles of a `splitShare` family are one
//!    communicator, whose calls, point-to-point ones included, every rank queues in one order:
//!    `handle.rs`), and the communicators into lanes: those whose calls share a stream of one
//!    device are one lane, run one after another in an order every rank of each communicator
//!    shares (its job key: so their work reaches the stream in the same order on every rank,
//!    whatever order each program made the calls in). One lane runs on this thread, several run
//!    on one thread each
//!    (so a process driving several GPUs cannot block itself on a collective setup step that
//!    waits for its other ranks);
//! 3. per communicator, on the first call's stream (which first waits for every other stream
//!    of the group and for the end of the communicator's previous batch, through an event:
//!    `Live::follow_on`; a batch captured into a CUDA graph waits, and marks its end, at each
//!    run of the graph, `Live::follow_in_graph`): the collectives in the order they were queued, then the sends and
//!    receives through `run_p2p`'s deadlock-free schedule; then every other stream of the
//!    group waits for that stream, and an event marks the batch's end (`Live::ran_on`).
//!
//! Every rank runs its collectives in the same order, and a group's point-to-point calls after
//! them on every rank, so the order between the two kinds inside one group cannot deadlock.
//! A call that fails its checks while queued is returned at once and again by
//! `ncclGroupEnd`, which then runs nothing (as NCCL does).

use std::cell::RefCell;
use std::sync::Arc;

use crate::abi::NcclResult;
use collectives::{Communicator, DeviceTransfer, ReduceOp};
use cudarc::driver::CudaStream;

use crate::api_window::WindowRequest;
use crate::coll::{Call, Reduction};
use crate::cuda;
use crate::derived::DerivedRequest;
use crate::error::Fail;
use crate::handle::{NcclComm, State};
use crate::premul;

/// One communicator's calls of a group, with their streams.
type Batch = (Arc<NcclComm>, Vec<(Call, usize)>);

/// A queued call.
struct Queued {
    comm: Arc<NcclComm>,
    call: Call,
    stream: usize,
}

#[derive(Default)]
struct GroupState {
    depth: usize,
    calls: Vec<Queued>,
    inits: Vec<Arc<NcclComm>>,
    /// Splits, shrinks and grows asked for inside the group (collective: they are made at its
    /// end, `derived.rs`).
    derived: Vec<DerivedRequest>,
    /// Window registrations asked for inside the group (collective: they run at its end).
    windows: Vec<WindowRequest>,
    error: Option<Fail>,
}

/// The group state of one thread. A thread that ends with a group still open gives up what the
/// group asked for: its splits', shrinks' and grows' handles fail, instead of waiting for an
/// `ncclGroupEnd` that can no longer come.
struct ThreadGroup(RefCell<GroupState>);

impl std::ops::Deref for ThreadGroup {
    type Target = RefCell<GroupState>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        let group = self.0.get_mut();
        if group.depth > 0 {
            let why = Fail::usage("the thread that opened the group ended without ncclGroupEnd: none of it ran");
            group.derived.iter().for_each(|d| d.abandon(&why));
        }
    }
}

thread_local! {
    static GROUP: ThreadGroup = ThreadGroup(RefCell::new(GroupState::default()));
}

/// True inside `ncclGroupStart` … `ncclGroupEnd` on this thread.
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// `ncclGroupStart`.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Remembers an init started inside the group.
pub fn add_init(comm: Arc<NcclComm>) {
    GROUP.with(|g| g.borrow_mut().inits.push(comm));
}

/// Remembers a split, shrink or grow asked for inside the group.
pub(crate) fn add_derived(request: DerivedRequest) {
    GROUP.with(|g| g.borrow_mut().derived.push(request));
}

/// Makes the group's derived communicators: each parent's in the order asked, on one thread per
/// parent ([`per_communicator`]). The first failure is returned once every one was made.
fn make_derived(requests: &[DerivedRequest]) -> Result<(), Fail> {
    let mut by_parent: Vec<Vec<&DerivedRequest>> = Vec::new();
    for r in requests {
        match by_parent.iter_mut().find(|v| v[0].parent.family_key() == r.parent.family_key()) {
            Some(v) => v.push(r),
            None => by_parent.push(vec![r]),
        }
    }
    per_communicator(&by_parent, |rs| {
        let mut first = Ok(());
        for r in rs {
            if let Err(fail) = r.make() {
                first = first.and(Err(fail));
            }
        }
        first
    })
}

/// Remembers a window registration asked for inside the group.
pub(crate) fn add_window(request: WindowRequest) {
    GROUP.with(|g| g.borrow_mut().windows.push(request));
}

/// Runs the group's window registrations: each communicator's in the order asked
/// ([`per_communicator`]).
fn register_windows(requests: &[WindowRequest]) -> Result<(), Fail> {
    let mut by_comm: Vec<Vec<&WindowRequest>> = Vec::new();
    for r in requests {
        match by_comm.iter_mut().find(|v| v[0].comm().family_key() == r.comm().family_key()) {
            Some(v) => v.push(r),
            None => by_comm.push(vec![r]),
        }
    }
    per_communicator(&by_comm, |rs| rs.iter().try_for_each(|r| r.register()))
}

/// Runs `work` on each communicator's share of a group: on this thread for one, on one thread
/// each for several (a process driving several GPUs cannot block itself on one communicator's
/// step that waits for its other ranks). The first error wins.
fn per_communicator<T: Sync>(shares: &[T], work: impl Fn(&T) -> Result<(), Fail> + Sync) -> Result<(), Fail> {
    if shares.len() <= 1 {
        return shares.iter().try_for_each(&work);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = shares.iter().map(|share| scope.spawn(|| work(share))).collect();
        let mut first = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|_| {
                Err(Fail::new(NcclResult::INTERNAL_ERROR, "a group worker thread panicked; please report it"))
            });
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

/// Runs `call` (a split, shrink or grow, queued inside a group) and remembers its failure in
/// the open group, as NCCL does: the group's `ncclGroupEnd` then fails too, instead of running
/// the group's other calls.
pub fn recording<T>(call: impl FnOnce() -> Result<T, Fail>) -> Result<T, Fail> {
    call().inspect_err(record_error)
}

/// Remembers a failure of a call queued in the group (returned again by `ncclGroupEnd`).
pub fn record_error(fail: &Fail) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(fail.clone());
        }
    });
}

/// Runs `calls` now as one batch (so the sends and receives among them progress together),
/// or queues them when a group is open.
pub fn submit(comm: Arc<NcclComm>, calls: &[Call], stream: usize) -> Result<(), Fail> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return false;
        }
        g.calls.extend(calls.iter().map(|&call| Queued { comm: comm.clone(), call, stream }));
        true
    });
    let batch: Vec<(Call, usize)> = calls.iter().filter(|c| !c.is_empty()).map(|&c| (c, stream)).collect();
    if queued || batch.is_empty() {
        return Ok(());
    }
    run_batch(&comm, &batch)
}

/// Closes one group level for `symbol`: the group's state once the outermost level closes,
/// `None` while an outer level stays open.
fn close_level(symbol: &str) -> Result<Option<GroupState>, Fail> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Fail::usage(format!("{symbol} without a matching ncclGroupStart")));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut *g)))
    })
}

/// Closes one group level without running its calls (`ncclGroupSimulateEnd`). At the
/// outermost level the calls are dropped and their estimated time returned in microseconds: the
/// sum over the calls of [`Communicator::estimated_time`] on each one's communicator (weave's
/// plan for the call and the α-β-γ model of `collectives::select::cost`). Inside a nested level
/// nothing closes but the level, and the estimate is 0.
pub fn simulate() -> Result<f64, Fail> {
    let Some(group) = close_level("ncclGroupSimulateEnd")? else { return Ok(0.0) };
    let nothing_runs =
        Fail::usage("ncclGroupSimulateEnd runs none of the group's calls, its splits, shrinks and grows included");
    group.derived.iter().for_each(|d| d.abandon(&nothing_runs));
    if let Some(e) = group.error {
        return Err(e);
    }
    let mut total = std::time::Duration::ZERO;
    for q in group.calls.iter().filter(|q| !q.call.is_empty()) {
        total += q.comm.with_live(|live| estimate(&live.comm, q.call))?;
    }
    Ok(total.as_secs_f64() * 1e6)
}

/// The estimated time of `call` on `comm` (see [`simulate`]).
fn estimate(comm: &Communicator, call: Call) -> Result<std::time::Duration, Fail> {
    use collectives::Collective;
    let n = comm.world_size();
    let (collective, bytes) = match call {
        Call::AllReduce { count, dtype, .. } => (Collective::AllReduce, count * dtype.size()),
        Call::AllGather { count, dtype, .. } => (Collective::AllGather, n * count * dtype.size()),
        Call::ReduceScatter { count, dtype, .. } => (Collective::ReduceScatter, n * count * dtype.size()),
        Call::Broadcast { count, dtype, .. } => (Collective::Broadcast, count * dtype.size()),
        Call::Reduce { count, dtype, .. } => (Collective::Reduce, count * dtype.size()),
        Call::AllToAll { count, dtype, .. } => (Collective::AllToAll, n * count * dtype.size()),
        Call::Send { bytes, .. } | Call::Recv { bytes, .. } => (Collective::SendRecv, bytes),
    };
    let payload = match collective {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => bytes / n.max(1),
        _ => bytes,
    };
    let shape = collectives::select::CallShape { collective, memory: collectives::MemorySpace::Device, bytes, payload };
    Ok(comm.estimated_time(shape)?)
}

/// `ncclGroupEnd`.
pub fn end() -> Result<(), Fail> {
    let Some(group) = close_level("ncclGroupEnd")? else { return Ok(()) };
    let mut in_progress = false;
    let mut first_error: Option<Fail> = group.error;
    // Derived communicators first: the group's inits run meanwhile in the background, and a
    // grow's joiners (inits) wait for its members' derivations.
    let derived = match &first_error {
        Some(e) => {
            group.derived.iter().for_each(|d| d.abandon(e));
            Ok(())
        }
        None => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| make_derived(&group.derived))).unwrap_or_else(
            |_| Err(Fail::new(NcclResult::INTERNAL_ERROR, "a split, shrink or grow panicked; please report it")),
        ),
    };
    // A derivation that did not run (a failure or panic before it) fails its handle.
    if let Err(e) = &derived {
        group.derived.iter().for_each(|d| d.abandon(e));
    }
    for c in &group.inits {
        let g = if c.blocking { c.settled()? } else { c.settle(c.lock()?) };
        match &*g {
            State::Initializing(_) => in_progress = true,
            State::Failed(f) => {
                first_error.get_or_insert_with(|| f.clone());
            }
            State::Gone => {
                first_error
                    .get_or_insert_with(|| Fail::usage("a communicator of the group was aborted while its init ran"));
            }
            State::Ready(_) | State::AwaitingGroup => {}
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    derived?;
    register_windows(&group.windows)?;
    // Split by communicator, keeping each one's order; the handles of a splitShare family run
    // as one communicator, whose calls every rank makes in one order.
    let mut batches: Vec<Batch> = Vec::new();
    for q in group.calls.into_iter().filter(|q| !q.call.is_empty()) {
        match batches.iter_mut().find(|(c, _)| c.family_key() == q.comm.family_key()) {
            Some((_, v)) => v.push((q.call, q.stream)),
            None => batches.push((q.comm, vec![(q.call, q.stream)])),
        }
    }
    let lanes = lanes(batches, stream_order_key);
    for lane in &lanes {
        let keys: Vec<String> = lane.iter().map(stream_order_key).filter(|k| !k.is_empty()).collect();
        if keys.iter().enumerate().any(|(i, k)| keys[..i].contains(k)) {
            return Err(Fail::usage(
                "a group gives two ranks of one communicator (driven by this process) calls on one stream, or one \
                 of them on the legacy default stream, which waits for every stream of its device: each rank's \
                 kernel would wait on the GPU for the other's, queued behind it; give each rank a stream of its own \
                 (not the legacy default stream)",
            ));
        }
    }
    let per_thread =
        |lane: &Vec<Batch>| lane.iter().any(|(_, calls)| calls.iter().any(|&(_, s)| s == cuda::PER_THREAD_STREAM));
    if lanes.len() > 1 && lanes.iter().any(per_thread) {
        return Err(Fail::usage(
            "a group over several communicators on different streams runs each communicator's calls on a thread \
             of its own, where cudaStreamPerThread names that thread's stream, not yours: give the group's calls an \
             explicit stream",
        ));
    }
    per_communicator(&lanes, |lane| {
        // A batch that fails on this rank does not keep the lane's later communicators from
        // their peers, which would wait for them until the timeout.
        let mut first = Ok(());
        for (comm, calls) in lane {
            let ran = run_batch(comm, calls);
            if first.is_ok() {
                first = ran;
            }
        }
        first
    })?;
    if in_progress { Err(Fail::new(NcclResult::IN_PROGRESS, "init still running")) } else { Ok(()) }
}

/// Sorts a group's communicators into lanes, each run on a thread of its own: communicators whose
/// calls share a stream of one device, directly or through others, are one lane, enqueued one
/// after another by their `order` key (the group's order among equal keys).
///
/// Enqueued from threads of their own, two communicators' work could reach a shared stream in
/// one order on one rank and in the other on another, each kernel then waiting for a peer's
/// kernel queued behind the other one's. The key is the same on every rank of a communicator,
/// so every process enqueues a shared stream's communicators in one order, whatever order its
/// program made the calls in; and since every lane of a process follows that one order, a
/// communicator's setup step that waits for its rank in another lane (one process driving
/// several GPUs) never waits for a lane that waits for it. Streams are told apart by device as
/// well: the legacy and per-thread default streams are one handle for a stream of each device.
/// The legacy default stream waits for every blocking stream of its device, and they for it:
/// it shares a lane with every stream of its device ([`share_a_queue`]).
fn lanes<K: Ord>(batches: Vec<Batch>, order: impl Fn(&Batch) -> K) -> Vec<Vec<Batch>> {
    /// A lane being made: the streams its calls use (with their devices), and its batches with
    /// their place in the group.
    type Lane = (Vec<(i32, usize)>, Vec<(usize, Batch)>);
    let mut lanes: Vec<Lane> = Vec::new();
    for (place, batch) in batches.into_iter().enumerate() {
        let device = batch.0.device;
        let mut streams: Vec<(i32, usize)> = batch.1.iter().map(|&(_, s)| (device, s)).collect();
        let (sharing, apart): (Vec<_>, Vec<_>) =
            lanes.into_iter().partition(|(used, _)| used.iter().any(|&s| streams.iter().any(|&t| share_a_queue(s, t))));
        let mut merged = vec![(place, batch)];
        for (used, batches) in sharing {
            streams.extend(used);
            merged.extend(batches);
        }
        lanes = apart;
        lanes.push((streams, merged));
    }
    lanes.sort_by_key(|(_, batches)| batches.iter().map(|&(place, _)| place).min());
    lanes
        .into_iter()
        .map(|(_, batches)| {
            let mut keyed: Vec<(K, usize, Batch)> =
                batches.into_iter().map(|(place, batch)| (order(&batch), place, batch)).collect();
            keyed.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            keyed.into_iter().map(|(_, _, batch)| batch).collect()
        })
        .collect()
}

/// Whether work on stream `a` and stream `b` (each with its device) may wait on each other on the
/// GPU: the same stream, or one of them the legacy default stream (`NULL` or `cudaStreamLegacy`),
/// which waits for every blocking stream of its device (non-blocking ones are counted too: a
/// shared lane costs only enqueueing one after another).
fn share_a_queue((device_a, a): (i32, usize), (device_b, b): (i32, usize)) -> bool {
    let legacy = |s: usize| s == 0 || s == cuda::LEGACY_STREAM;
    device_a == device_b && (a == b || legacy(a) || legacy(b))
}

/// The key that orders a communicator among those sharing a stream ([`lanes`]): its bootstrap's
/// job key, the same on all its ranks (empty where the communicator is gone: its batch fails
/// on its own).
fn stream_order_key(batch: &Batch) -> String {
    batch.0.with_live(|live| Ok(live.comm.core().bootstrap().job_key())).unwrap_or_default()
}

/// Runs one communicator's calls (see the module docs for the order).
fn run_batch(comm: &NcclComm, calls: &[(Call, usize)]) -> Result<(), Fail> {
    comm.with_live(|live| {
        if live.comm.is_revoked() {
            return Err(Fail::usage(
                "this communicator was revoked (ncclCommRevoke here or on another rank): only ncclCommShrink, \
                 ncclCommDestroy and ncclCommAbort work on it",
            ));
        }
        let ctx = live.comm.gpu_context().ok_or_else(|| {
            Fail::usage(
                "this communicator has no GPU path (every rank needs a CUDA device; run with NCCL_DEBUG=INFO or \
                 WEAVE_DEBUG=info to see why it is off)",
            )
        })?;
        ctx.bind_to_thread().map_err(|e| Fail::from(weave_cuda::driver::from_driver("bind the GPU context", e)))?;
        let exec = calls[0].1;
        let mut others: Vec<usize> = Vec::new();
        for &(_, s) in calls {
            if s != exec && !others.contains(&s) {
                others.push(s);
            }
        }
        // A batch captured into a CUDA graph is ordered with the communicator's other batches
        // as NCCL orders its graphs: each run of the graph waits for the end mark as recorded
        // when the graph is launched, and records it at its own end (external event nodes);
        // after a capture every eager batch waits for the mark. As in NCCL, a group's streams
        // are all captured or none is.
        let capturing = cuda::is_capturing(exec)?;
        for &s in &others {
            if cuda::is_capturing(s)? != capturing {
                return Err(Fail::usage(
                    "a group's calls on one communicator use streams of which some are being captured into a CUDA \
                     graph and some are not: capture all of them into one graph, or none",
                ));
            }
        }
        // The per-thread default stream is one handle for another stream on each thread: the
        // last batch's is never this thread's, whichever of this batch's streams it is.
        let per_thread = cuda::PER_THREAD_STREAM;
        if capturing {
            live.follow_in_graph(exec)?;
        } else if live.in_graphs()
            || live.stream_to_follow().is_some_and(|last| {
                (last != exec || exec == per_thread) && (last == per_thread || !others.contains(&last))
            })
        {
            live.follow_on(exec)?;
        }
        for &s in &others {
            cuda::order_after(exec, s)?;
        }
        // SAFETY: `exec` is the caller's stream (a live CUstream of this context, or the legacy
        // or per-thread default stream); the wrapper does not own it.
        let stream = unsafe { ctx.wrap_borrowed_stream(exec as _) };
        let enqueued = (|| {
            let mut p2p = Vec::new();
            for &(call, _) in calls {
                if call.is_p2p() {
                    p2p.push(call);
                } else {
                    // SAFETY: the call's buffers were checked as NCCL's rules require; the
                    // program keeps them valid until the stream reaches the call, as NCCL
                    // requires.
                    unsafe { run(&live.comm, call, &stream)? };
                }
            }
            if !p2p.is_empty() {
                // SAFETY: as above.
                unsafe { run_p2p(&live.comm, &p2p, &stream)? };
            }
            Ok::<(), Fail>(())
        })();
        // What was enqueued before a failure is ordered as a whole batch would be: the other
        // streams wait for it, and the next batch follows its end.
        let ordered = others
            .iter()
            .try_for_each(|&s| cuda::order_after(s, exec))
            .map_err(Fail::from)
            .and_then(|()| if capturing { live.ran_in_graph(exec) } else { live.ran_on(exec) });
        enqueued.and(ordered)
    })
}

fn weave(e: comm_core::Error) -> Fail {
    Fail::from(e)
}

/// Enqueues `call` on `stream` (a collective; point-to-point goes through the group schedule).
///
/// # Safety
/// The addresses in `call` must be device memory valid as NCCL's rules for the call say, until
/// the call completes on `stream`.
unsafe fn run(comm: &Communicator, call: Call, stream: &Arc<CudaStream>) -> Result<(), Fail> {
    if call.is_empty() {
        return Ok(());
    }
    let n = comm.world_size();
    // SAFETY: (every arm) forwarded from the caller; the pre-multiplied paths scale into
    // memory they own or into the receive buffer the call writes anyway.
    unsafe {
        match call {
            Call::AllReduce { send, recv, count, dtype, op: Reduction::Plain(op) } => {
                comm.all_reduce_device_raw(send, recv, count, dtype, op, stream).map_err(weave)
            }
            Call::AllReduce { send, recv, count, dtype, op: Reduction::PreMul(p) } => {
                premul::scale(p, send, recv, count, stream)?;
                comm.all_reduce_device_raw(recv, recv, count, dtype, ReduceOp::Sum, stream).map_err(weave)
            }
            Call::AllGather { send, recv, count, dtype } => {
                comm.all_gather_device_raw(send, recv, count, dtype, stream).map_err(weave)
            }
            Call::ReduceScatter { send, recv, count, dtype, op: Reduction::Plain(op) } => {
                comm.reduce_scatter_device_raw(send, recv, count, dtype, op, stream).map_err(weave)
            }
            Call::ReduceScatter { send, recv, count, dtype, op: Reduction::PreMul(p) } => {
                let total = count * n;
                // Freed on the stream after the call's work, when it drops.
                let tmp = weave_cuda::StreamMemory::alloc(total * dtype.size(), stream)?;
                premul::scale(p, send, tmp.address(), total, stream)?;
                comm.reduce_scatter_device_raw(tmp.address(), recv, count, dtype, ReduceOp::Sum, stream).map_err(weave)
            }
            Call::Broadcast { send, recv, count, dtype, root } => {
                comm.broadcast_device_raw(send, recv, count, dtype, root, stream).map_err(weave)
            }
            Call::Reduce { send, recv, count, dtype, op: Reduction::Plain(op), root } => {
                comm.reduce_device_raw(send, recv, count, dtype, op, root, stream).map_err(weave)
            }
            Call::Reduce { send, recv, count, dtype, op: Reduction::PreMul(p), root } => {
                let tmp = weave_cuda::StreamMemory::alloc(count * dtype.size(), stream)?;
                premul::scale(p, send, tmp.address(), count, stream)?;
                comm.reduce_device_raw(tmp.address(), recv, count, dtype, ReduceOp::Sum, root, stream).map_err(weave)
            }
            Call::AllToAll { send, recv, count, dtype } => {
                comm.all_to_all_device_raw(send, recv, count, dtype, stream).map_err(weave)
            }
            Call::Send { .. } | Call::Recv { .. } => run_p2p(comm, &[call], stream),
        }
    }
}

/// Runs the sends and receives of one group on `stream`, as weave's
/// `Communicator::group_device_raw` schedules them (without deadlock, every message stamped
/// with its group so that a send nobody received is found, never taken for a later one).
///
/// # Safety
/// As [`run`] for every call.
unsafe fn run_p2p(comm: &Communicator, calls: &[Call], stream: &Arc<CudaStream>) -> Result<(), Fail> {
    let ops: Vec<DeviceTransfer> = calls
        .iter()
        .filter_map(|c| match *c {
            Call::Send { buf, bytes, peer } => Some(DeviceTransfer::Send { addr: buf, bytes, peer }),
            Call::Recv { buf, bytes, peer } => Some(DeviceTransfer::Recv { addr: buf, bytes, peer }),
            _ => None,
        })
        .collect();
    // SAFETY: forwarded from the caller.
    unsafe { comm.group_device_raw(&ops, stream) }.map_err(weave)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of one send per stream of `streams`, on a communicator of its own on `device`.
    fn batch_on(device: i32, streams: &[usize]) -> Batch {
        let comm = Arc::new(NcclComm::new(0, 2, device, true, State::Gone));
        (comm, streams.iter().map(|&s| (Call::Send { buf: 0x1000, bytes: 4, peer: 1 }, s)).collect())
    }

    fn batch(streams: &[usize]) -> Batch {
        batch_on(0, streams)
    }

    /// The places in `batches` of each lane's communicators, the lanes ordered by `key` (a key
    /// per place).
    fn lane_places(batches: Vec<Batch>, key: &[u32]) -> Vec<Vec<usize>> {
        let keys: Vec<usize> = batches.iter().map(|(c, _)| c.family_key()).collect();
        let place = |b: &Batch| keys.iter().position(|&k| k == b.0.family_key()).unwrap();
        let lanes = lanes(batches, |b| key[place(b)]);
        lanes.iter().map(|lane| lane.iter().map(place).collect()).collect()
    }

    #[test]
    fn communicators_sharing_a_stream_run_in_one_lane_in_one_order() {
        let same = [0; 5];
        // Streams created by the program (handles other than the default streams' 0, 1 and 2).
        let [s1, s2, s3, s4, s5, s7, s8] = [0x11, 0x12, 0x13, 0x14, 0x15, 0x17, 0x18];
        let batches = vec![batch(&[s1]), batch(&[s2]), batch(&[s1, s3]), batch(&[s3]), batch(&[s4])];
        assert_eq!(lane_places(batches, &same), vec![vec![0, 2, 3], vec![1], vec![4]]);
        // A communicator on streams 2 and 4 joins the lanes of both, behind what came before.
        let batches = vec![batch(&[s2]), batch(&[s1]), batch(&[s4]), batch(&[s4, s2]), batch(&[s5])];
        assert_eq!(lane_places(batches, &same), vec![vec![0, 2, 3], vec![1], vec![4]]);
        // Every communicator on its own stream: a lane each.
        assert_eq!(lane_places(vec![batch(&[s7]), batch(&[s8])], &same[..2]), vec![vec![0], vec![1]]);
        // Inside a lane the key orders, whatever the group's order.
        let batches = vec![batch(&[s1]), batch(&[s1]), batch(&[s1])];
        assert_eq!(lane_places(batches, &[3, 1, 2]), vec![vec![1, 2, 0]]);
    }

    #[test]
    fn the_legacy_default_stream_shares_a_lane_with_every_stream_of_its_device() {
        let same = [0; 4];
        let legacy = [0, cuda::LEGACY_STREAM];
        for l in legacy {
            // X on the legacy stream and Y on a stream of the program, both of GPU 0: the legacy
            // stream waits for Y's, so one lane; Z on GPU 1 stays apart.
            let batches = vec![batch_on(0, &[l]), batch_on(1, &[0x21]), batch_on(0, &[0x22]), batch_on(0, &[0x23])];
            assert_eq!(lane_places(batches, &same), vec![vec![0, 2, 3], vec![1]], "legacy stream {l:#x}");
        }
        // Without the legacy stream, the three streams of GPU 0 are three lanes.
        let batches = vec![batch_on(0, &[0x21]), batch_on(0, &[0x22]), batch_on(0, &[cuda::PER_THREAD_STREAM])];
        assert_eq!(lane_places(batches, &same[..3]), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn default_streams_of_two_devices_are_two_streams_and_lanes_share_one_order() {
        // One process, GPUs 0 and 1, communicators X and Y over both, called X0, Y1, Y0, X1 on
        // each device's legacy default stream (0): a lane per device, both in the order X, Y, so
        // neither lane waits for the other in a cycle.
        let batches = vec![batch_on(0, &[0]), batch_on(1, &[0]), batch_on(0, &[0]), batch_on(1, &[0])];
        let (x, y) = (1, 2);
        assert_eq!(lane_places(batches, &[x, y, y, x]), vec![vec![0, 2], vec![3, 1]]);
    }
}
