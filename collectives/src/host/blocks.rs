//! Host collectives that move blocks: all-gather, reduce-scatter, broadcast, all-to-all and
//! all-to-all-v.

use comm_core::{Error, Result};

use super::{
    Agree, HostEngine, call_publication, capacity, chunks, in_chunks, reduce_scratch, ring, scratch, stage_chunk,
};
use crate::call::Buffers;
use crate::copy::copy;
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::table::{Algorithm, Collective};

const EQUAL: Agree = Agree { count: true, root: false };

/// Smallest block for which all-gather reads peers' buffers with cross-memory attach.
const CMA_MIN_BYTES: usize = 64 << 10;
/// Publication source marking "read my send buffer at `source_offset` with process_vm_readv".
const CMA_SOURCE: u64 = u64::MAX;

/// All-gather: every rank contributes `count` elements; `recv` gets `n * count`, rank r's at
/// `r * count`.
///
/// # Safety
/// `send` valid for `count` reads, `recv` for `n * count` writes; `send` is either disjoint
/// from `recv` or exactly `recv + rank * count` (in place).
pub(crate) unsafe fn all_gather<T: Element>(
    e: &mut HostEngine,
    algo: Algorithm,
    Buffers { send, recv, count }: Buffers<T>,
) -> Result<()> {
    let (n, me) = (e.ws.world_size(), e.ws.rank());
    let publication = call_publication::<T>(Collective::AllGather, None, algo, count, 0);
    let sz = std::mem::size_of::<T>();
    // Large blocks, direct algorithm, cross-memory attach available on every rank (the same
    // decision everywhere: it depends only on agreed values): each rank reads every peer's
    // block straight from the peer's send buffer into its output — one copy, as Open MPI's
    // single-copy path does — then all wait until everyone has read before returning.
    if algo == Algorithm::Direct
        && count * sz >= CMA_MIN_BYTES
        && let Some(pids) = e.cma.clone()
    {
        let mut p = publication;
        p.source = CMA_SOURCE;
        p.source_offset = send as u64;
        e.step("all_gather", p, EQUAL)?;
        let mut failure = None;
        for k in 1..n {
            let q = (me + k) % n;
            let pq = e.ws.publication(q);
            // SAFETY: recv holds n × count elements; block q is exclusively ours to write.
            let out = unsafe { std::slice::from_raw_parts_mut(recv.add(q * count).cast::<u8>(), count * sz) };
            if pq.source != CMA_SOURCE {
                failure = Some(Error::protocol(format!("rank {q} did not publish its all_gather buffer")));
                break;
            }
            if let Err(err) = super::cma_read(pids[q], pq.source_offset, out) {
                failure = Some(err);
                break;
            }
        }
        // SAFETY: the own block: send (count elements) into block `me` of recv (no-op in place).
        unsafe { copy(send, recv.add(me * count), count) };
        // Peers may still be reading this rank's send buffer: wait for everyone.
        e.phase("all_gather done")?;
        e.ws.finish_step();
        return failure.map_or(Ok(()), Err);
    }
    let by_ring = algo == Algorithm::Ring;
    let cap = if by_ring { capacity::<T>(&e.ws) / n } else { capacity::<T>(&e.ws) };
    // With the ring, rank q's segment lies in every rank's scratch at `q * k` (back to back, so
    // a small call touches few scratch pages); without, at the start of rank q's scratch.
    let segment = move |q: usize, k: usize| if by_ring { (me, q * k) } else { (q, 0) };
    // SAFETY: o + k <= count; scratch holds the segment.
    let stage = |e: &mut HostEngine, o, k| unsafe { stage_chunk(e, send, o, k, segment(me, k).1) };
    in_chunks(e, chunks(count, cap), "all_gather", publication, EQUAL, stage, |e, o, k| {
        if by_ring {
            // Each rank starts with its own segment: the left neighbour's comes first.
            ring::all_gather::<T>(e, (me + n - 1) % n, |q| (segment(q, k).1, k), "all_gather ring")?;
        }
        for q in 0..n {
            let (holder, at) = segment(q, k);
            // SAFETY: rank q's chunk, complete where `segment` says; recv + q*count + o valid
            // for k writes.
            unsafe { copy(scratch::<T>(&e.ws, holder, at, k)?, recv.add(q * count + o), k) };
        }
        Ok(())
    })
}

/// Reduce-scatter: `send` holds `n * count` elements; rank r gets the reduction of every rank's
/// block r in `recv` (`count` elements).
///
/// # Safety
/// `send` valid for `n * count` reads, `recv` for `count` writes; `recv` is disjoint from
/// `send` or exactly `send + rank * count` (in place).
pub(crate) unsafe fn reduce_scatter<T: Element>(
    e: &mut HostEngine,
    algo: Algorithm,
    Buffers { send, recv, count }: Buffers<T>,
    op: ReduceOp,
) -> Result<()> {
    let (n, me) = (e.ws.world_size(), e.ws.rank());
    let publication = call_publication::<T>(Collective::ReduceScatter, Some(op), algo, count, 0);
    let chunks = chunks(count, capacity::<T>(&e.ws) / n);
    // SAFETY: send holds n blocks of count elements.
    let stage = |e: &mut HostEngine, o, k| unsafe { stage_blocks(e, send, count, o, k) };
    in_chunks(e, chunks, "reduce_scatter", publication, EQUAL, stage, |e, o, k| {
        if algo == Algorithm::Ring {
            // Block c is segment c; after the pass segment `me` is complete here.
            ring::reduce_scatter::<T>(e, op, me, |c| (c * k, k), "reduce_scatter ring")?;
            // SAFETY: segment `me` holds the result.
            unsafe { copy(scratch::<T>(&e.ws, me, me * k, k)?, recv.add(o), k) };
            Ok(())
        } else {
            // SAFETY: every rank staged its block for this rank there; recv + o valid for k
            // writes and disjoint from scratch.
            unsafe { reduce_scratch(e, op, me * k, k, recv.add(o)) }
        }
    })
}

/// Stages chunk `[o, o + k)` of each of the world's blocks of `count` elements at `send` into
/// this rank's scratch, block q's at `q * k`: back to back, so a small call touches few scratch
/// pages.
///
/// # Safety
/// `send` valid for `n * count` reads; `o + k <= count`.
unsafe fn stage_blocks<T: Element>(e: &HostEngine, send: *const T, count: usize, o: usize, k: usize) -> Result<()> {
    for q in 0..e.ws.world_size() {
        // SAFETY: block q, chunk [o, o+k) of the send buffer.
        unsafe { stage_chunk(e, send, q * count + o, k, q * k)? };
    }
    Ok(())
}

/// Broadcast of `count` elements from `root`'s `send` into every rank's `recv`.
///
/// # Safety
/// On the root `send` valid for `count` reads; everywhere `recv` valid for `count` writes.
/// `send` and `recv` identical or disjoint.
pub(crate) unsafe fn broadcast<T: Element>(
    e: &mut HostEngine,
    algo: Algorithm,
    Buffers { send, recv, count }: Buffers<T>,
    root: usize,
) -> Result<()> {
    let me = e.ws.rank();
    let publication = call_publication::<T>(Collective::Broadcast, None, algo, count, root);
    let chunks = chunks(count, capacity::<T>(&e.ws));
    // SAFETY: the root's send chunk into its scratch.
    let stage = |e: &mut HostEngine, o, k| if me == root { unsafe { stage_chunk(e, send, o, k, 0) } } else { Ok(()) };
    in_chunks(e, chunks, "broadcast", publication, Agree { count: true, root: true }, stage, |e, o, k| {
        if me == root {
            // SAFETY: out of place on the root: its own data (no-op when identical).
            unsafe { copy(send.add(o), recv.add(o), k) };
        } else {
            // SAFETY: root's staged chunk; recv + o valid for k writes.
            unsafe { copy(scratch::<T>(&e.ws, root, 0, k)?, recv.add(o), k) };
        }
        Ok(())
    })
}

/// All-to-all with `count` elements per (sender, receiver) block.
///
/// # Safety
/// `send` and `recv` valid for `n * count` elements; identical or disjoint.
pub(crate) unsafe fn all_to_all<T: Element>(
    e: &mut HostEngine,
    algo: Algorithm,
    Buffers { send, recv, count }: Buffers<T>,
) -> Result<()> {
    let (n, me) = (e.ws.world_size(), e.ws.rank());
    let publication = call_publication::<T>(Collective::AllToAll, None, algo, count, 0);
    let chunks = chunks(count, capacity::<T>(&e.ws) / n);
    // SAFETY: send holds n blocks of count elements.
    let stage = |e: &mut HostEngine, o, k| unsafe { stage_blocks(e, send, count, o, k) };
    in_chunks(e, chunks, "all_to_all", publication, EQUAL, stage, |e, o, k| {
        for p in 0..n {
            // SAFETY: rank p's staged block for this rank; recv block p, chunk [o, o+k).
            unsafe { copy(scratch::<T>(&e.ws, p, me * k, k)?, recv.add(p * count + o), k) };
        }
        Ok(())
    })
}

/// Counts and displacements (in elements) of an all-to-all-v, indexed by peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllToAllv<'a> {
    pub send_counts: &'a [usize],
    pub send_displs: &'a [usize],
    pub recv_counts: &'a [usize],
    pub recv_displs: &'a [usize],
}

/// All-to-all-v. The first step publishes every rank's counts so that each rank checks every
/// pair (what p sends to q must be what q expects from p) and all agree on the step count.
///
/// # Safety
/// For every peer q, `send + send_displs[q]` valid for `send_counts[q]` reads and
/// `recv + recv_displs[q]` for `recv_counts[q]` writes; `send` and `recv` disjoint.
pub(crate) unsafe fn all_to_allv<T: Element>(
    e: &mut HostEngine,
    algo: Algorithm,
    send: *const T,
    recv: *mut T,
    v: AllToAllv<'_>,
) -> Result<()> {
    let (n, me) = (e.ws.world_size(), e.ws.rank());
    // Step 1: publish counts (2n u64: what I send to each rank, what I expect from each).
    let table = scratch::<u64>(&e.ws, me, 0, 2 * n)?;
    for q in 0..n {
        // SAFETY: the table area holds 2n words of this rank's scratch.
        unsafe {
            table.add(q).write(v.send_counts[q] as u64);
            table.add(n + q).write(v.recv_counts[q] as u64);
        }
    }
    e.step(
        "all_to_allv",
        call_publication::<T>(Collective::AllToAllv, None, algo, 0, 0),
        Agree { count: false, root: false },
    )?;
    let mut longest = 0u64;
    let mut mismatch = None;
    for p in 0..n {
        let row = scratch::<u64>(&e.ws, p, 0, 2 * n)?;
        for q in 0..n {
            // SAFETY: rank p's table, complete before the step's phase.
            let sends = unsafe { row.add(q).read() };
            let row_q = scratch::<u64>(&e.ws, q, 0, 2 * n)?;
            // SAFETY: rank q's table.
            let expects = unsafe { row_q.add(n + p).read() };
            if sends != expects && mismatch.is_none() {
                mismatch = Some(Error::invalid(format!(
                    "all_to_allv: rank {p} sends {sends} elements to rank {q}, which expects {expects}"
                )));
            }
            longest = longest.max(sends);
        }
    }
    e.ws.finish_step();
    if let Some(err) = mismatch {
        return Err(err);
    }
    let cap = capacity::<T>(&e.ws) / n;
    let steps = (longest as usize).div_ceil(cap.max(1));
    for s in 0..steps {
        let o = s * cap;
        // Blocks lie `stride` apart (the longest block of this step, the same on every rank), so
        // a small call touches few scratch pages.
        let stride = (longest as usize - o).min(cap);
        let part = |count: usize| count.saturating_sub(o).min(stride);
        for q in 0..n {
            let k = part(v.send_counts[q]);
            // SAFETY: chunk [o, o+k) of the block for q lies inside the caller's send range.
            unsafe { copy(send.add(v.send_displs[q] + o), scratch::<T>(&e.ws, me, q * stride, k)?, k) };
        }
        e.phase("all_to_allv")?;
        for p in 0..n {
            let k = part(v.recv_counts[p]);
            // SAFETY: rank p staged exactly this many elements for us (checked in step 1).
            unsafe { copy(scratch::<T>(&e.ws, p, me * stride, k)?, recv.add(v.recv_displs[p] + o), k) };
        }
        e.ws.finish_step();
    }
    Ok(())
}
