//! The `wide` scenario's hierarchical part: on a grid of several (posed) nodes of several ranks,
//! every collective the table runs as node and rail steps on device buffers must plan those
//! steps, and each one's results are checked against the host reference — out of place and in
//! place, element sizes of 1, 2, 4 and 8 bytes, odd counts (none a multiple of the ranks per
//! node), every root of a reduce. Each dtype's calls are queued back to back on the stream and
//! synchronized once, so a call's staging copies must be ordered after the step before them and
//! before the next call's steps; a smaller call after the larger ones reuses the staging. Off a
//! grid the f32 calls run flat and are checked alike.
//!
//! `WEAVE_TEST_SYNC_EACH=1` makes the section diagnosable: every call is printed (collective,
//! type, count, operator, root, in place or not) to stderr before it is queued, and the stream
//! is synchronized after it, so a call that hangs or fails is the last one printed.

use collectives::select::{CallShape, Executor};
use collectives::{Collective, Element, MemorySpace, ReduceOp, f16};
use comm_core::{Error, Result};
use cudarc::driver::CudaSlice;
use weave_tests::matrix::{compare, fill, input, reference};

use super::Gpu;

/// The collectives with hierarchical device steps.
const STEPPED: [Collective; 5] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
    Collective::Reduce,
];

/// Checks the plans, then every stepped collective's results; returns the device calls checked.
pub(super) fn hierarchical_calls(g: &Gpu) -> Result<usize> {
    // 16,385 f32 per rank: every collective at least 64 KiB on 4 ranks (where the all-gather
    // and reduce-scatter rows start), so all of them take steps on a grid.
    let steps = expect_plans(g, 16_385 * 4)?;
    let mut checked = calls_of::<f32>(g, &[16_385, 50_001], &[ReduceOp::Sum, ReduceOp::Avg])?;
    if !steps {
        // Flat calls: the rest of the scenario checks them in every type.
        return Ok(checked);
    }
    checked += calls_of::<f16>(g, &[8_193], &[ReduceOp::Max])?;
    checked += calls_of::<u8>(g, &[16_387], &[ReduceOp::Min])?;
    checked += calls_of::<f64>(g, &[2_049], &[ReduceOp::Prod])?;
    // An integer average runs flat even on a grid (each step would truncate).
    checked += calls_of::<i32>(g, &[16_385], &[ReduceOp::Avg])?;
    checked += calls_of::<f32>(g, &[16_383], &[ReduceOp::Max])?;
    Ok(checked)
}

/// Every stepped collective whose per-rank block is `block` bytes must plan node and rail steps
/// exactly where the communicator's nodes form a grid of several nodes of several ranks;
/// returns whether they do.
fn expect_plans(g: &Gpu, block: usize) -> Result<bool> {
    let grid = g.comm.core().topology().node_grid();
    let steps = grid.is_some_and(|grid| grid.nodes > 1 && grid.ranks_per_node > 1);
    let n = g.comm.world_size();
    for c in STEPPED {
        let bytes = match c {
            Collective::AllGather | Collective::ReduceScatter => block * n,
            _ => block,
        };
        let plan = g.comm.plan(CallShape { collective: c, memory: MemorySpace::Device, bytes, payload: block })?;
        if (plan.executor == Executor::Hierarchical) != steps {
            return Err(Error::protocol(format!("a {bytes} B device {c} on {grid:?} plans {plan:?}")));
        }
    }
    Ok(steps)
}

/// Whether `WEAVE_TEST_SYNC_EACH=1` asks for a printed, synchronized call at a time.
fn sync_each() -> bool {
    std::env::var("WEAVE_TEST_SYNC_EACH").is_ok_and(|v| v == "1")
}

/// One call as [`queued`] prints it: collective, type, count, operator, root, in place or not.
fn describe(
    collective: &str,
    d: collectives::DataType,
    count: usize,
    op: Option<ReduceOp>,
    root: Option<usize>,
    in_place: bool,
) -> String {
    let op = op.map_or(String::new(), |op| format!(" {}", op.name()));
    let root = root.map_or(String::new(), |r| format!(" to/from root {r}"));
    let place = if in_place { "in place" } else { "out of place" };
    format!("{collective} {} count {count}{op}{root} {place}", d.name())
}

/// Queues one call (`queue`) described by `what`; with [`sync_each`], prints `what` first and
/// synchronizes after it, naming the call in any error.
fn queued(g: &Gpu, each: bool, what: &str, queue: impl FnOnce() -> Result<()>) -> Result<()> {
    let me = g.comm.rank();
    if each {
        eprintln!("hierarchical_calls rank {me}: {what} ...");
    }
    let done = queue().and_then(|()| if each { g.sync() } else { Ok(()) });
    if each && done.is_ok() {
        eprintln!("hierarchical_calls rank {me}: {what} done");
    }
    done.map_err(|e| Error::protocol(format!("{what} (rank {me}): {e}")))
}

/// What one queued call left to check once the stream has run it.
struct Check {
    what: String,
    buffer: CudaSlice<u8>,
    /// Elements of `buffer` to compare, from `from`.
    from: usize,
    len: usize,
    want: Box<dyn Fn(usize) -> f64>,
}

/// Queues every stepped collective of `T` at each count and operator (out of place and in place,
/// a reduce to every root), synchronizes once, then checks every result.
fn calls_of<T: Element + 'static>(g: &Gpu, counts: &[usize], ops: &[ReduceOp]) -> Result<usize> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let d = T::DTYPE;
    let sz = std::mem::size_of::<T>();
    let mut checks: Vec<Check> = Vec::new();
    let mut keep: Vec<CudaSlice<u8>> = Vec::new();
    let mut check = |what: String, buffer: CudaSlice<u8>, from: usize, len: usize, want: Box<dyn Fn(usize) -> f64>| {
        checks.push(Check { what, buffer, from, len, want });
    };
    let each = sync_each();
    for &count in counts {
        for &op in ops {
            let call = |c: &str, root: Option<usize>, in_place: bool| describe(c, d, count, Some(op), root, in_place);
            let tag =
                |c: &str| format!("hierarchical {c} {} {} count {count} on {n} GPUs (rank {me})", d.name(), op.name());
            let all = move |i: usize| reference::<T>(op, (0..n).map(|r| input(d, op, r, i)));
            // all_reduce (a tail of count % L elements).
            let send = g.upload(&fill::<T>(d, op, me, count))?;
            let recv = g.zeros(count * sz)?;
            // SAFETY: both hold count elements and live until after the sync below.
            queued(g, each, &call("all_reduce", None, false), || unsafe {
                g.comm.all_reduce_device_raw(g.addr(&send), g.addr(&recv), count, d, op, &g.stream)
            })?;
            check(tag("all_reduce"), recv, 0, count, Box::new(all));
            keep.push(send);
            // reduce_scatter out of place: the input must stay as it was.
            let send = g.upload(&fill::<T>(d, op, me, n * count))?;
            let recv = g.zeros(count * sz)?;
            // SAFETY: send holds n × count, recv count elements.
            queued(g, each, &call("reduce_scatter", None, false), || unsafe {
                g.comm.reduce_scatter_device_raw(g.addr(&send), g.addr(&recv), count, d, op, &g.stream)
            })?;
            check(tag("reduce_scatter"), recv, 0, count, Box::new(move |i| all(me * count + i)));
            let own = move |i: usize| T::from_f64(input(d, op, me, i)).to_f64();
            check(tag("reduce_scatter's input"), send, 0, n * count, Box::new(own));
            // reduce_scatter in place: the result lands in block `me` of the input.
            let buf = g.upload(&fill::<T>(d, op, me, n * count))?;
            let block = g.addr(&buf) + (me * count * sz) as u64;
            // SAFETY: buf holds n × count elements; block `me` is inside it.
            queued(g, each, &call("reduce_scatter", None, true), || unsafe {
                g.comm.reduce_scatter_device_raw(g.addr(&buf), block, count, d, op, &g.stream)
            })?;
            check(tag("reduce_scatter in place"), buf, me * count, count, Box::new(move |i| all(me * count + i)));
            // reduce out of place to every root (three in a wide world): the root's recv holds
            // the result, every other rank's recv is untouched.
            let roots: Vec<usize> = if n <= 8 { (0..n).collect() } else { vec![0, n / 2, n - 1] };
            for root in roots {
                let send = g.upload(&fill::<T>(d, op, me, count))?;
                let recv = g.zeros(count * sz)?;
                // SAFETY: both hold count elements.
                queued(g, each, &call("reduce", Some(root), false), || unsafe {
                    g.comm.reduce_device_raw(g.addr(&send), g.addr(&recv), count, d, op, root, &g.stream)
                })?;
                let want: Box<dyn Fn(usize) -> f64> = if me == root { Box::new(all) } else { Box::new(|_| 0.0) };
                check(tag(&format!("reduce to {root}")), recv, 0, count, want);
                keep.push(send);
            }
            // reduce in place, to the last rank (another node than rank 0's).
            let buf = g.upload(&fill::<T>(d, op, me, count))?;
            // SAFETY: count elements, in place.
            queued(g, each, &call("reduce", Some(n - 1), true), || unsafe {
                g.comm.reduce_device_raw(g.addr(&buf), g.addr(&buf), count, d, op, n - 1, &g.stream)
            })?;
            if me == n - 1 {
                check(tag("reduce in place"), buf, 0, count, Box::new(all));
            } else {
                keep.push(buf);
            }
        }
        // Data movement, once per count.
        let op = ops[0];
        let tag = |c: &str| format!("hierarchical {c} {} count {count} on {n} GPUs (rank {me})", d.name());
        let call = |c: &str, root: Option<usize>, in_place: bool| describe(c, d, count, None, root, in_place);
        let own = move |r: usize, i: usize| T::from_f64(input(d, op, r, i)).to_f64();
        let send = g.upload(&fill::<T>(d, op, me, count))?;
        let recv = g.zeros(n * count * sz)?;
        // SAFETY: send count, recv n × count elements.
        queued(g, each, &call("all_gather", None, false), || unsafe {
            g.comm.all_gather_device_raw(g.addr(&send), g.addr(&recv), count, d, &g.stream)
        })?;
        check(tag("all_gather"), recv, 0, n * count, Box::new(move |j| own(j / count, j % count)));
        keep.push(send);
        // In place: this rank's block already sits in its place of the output.
        let mut staged = vec![T::default(); n * count];
        staged[me * count..(me + 1) * count].copy_from_slice(&fill::<T>(d, op, me, count));
        let buf = g.upload(&staged)?;
        let block = g.addr(&buf) + (me * count * sz) as u64;
        // SAFETY: buf holds n × count elements; the send block is block `me` of it.
        queued(g, each, &call("all_gather", None, true), || unsafe {
            g.comm.all_gather_device_raw(block, g.addr(&buf), count, d, &g.stream)
        })?;
        check(tag("all_gather in place"), buf, 0, n * count, Box::new(move |j| own(j / count, j % count)));
        // broadcast from a root on the last node, in place.
        let root = n - 1;
        let buf = if me == root { g.upload(&fill::<T>(d, op, me, count))? } else { g.zeros(count * sz)? };
        // SAFETY: count elements, in place.
        queued(g, each, &call("broadcast", Some(root), true), || unsafe {
            g.comm.broadcast_device_raw(g.addr(&buf), g.addr(&buf), count, d, root, &g.stream)
        })?;
        check(tag("broadcast"), buf, 0, count, Box::new(move |i| own(root, i)));
    }
    g.sync().map_err(|e| {
        Error::protocol(format!(
            "{} queued hierarchical calls of {} (rank {me}): {e}; WEAVE_TEST_SYNC_EACH=1 names the call",
            checks.len(),
            d.name()
        ))
    })?;
    drop(keep);
    let checked = checks.len();
    for c in checks {
        let got = g.download::<T>(&c.buffer, c.from + c.len)?;
        compare(&c.what, &got[c.from..], &c.want)?;
    }
    Ok(checked)
}
