//! Host all-reduce and reduce: one-shot, two-phase (reduce-scatter + all-gather / gather) and
//! ring.

use comm_core::Result;

use super::workspace::INLINE_BYTES;
use super::{
    Agree, HostEngine, call_publication, capacity, chunks, in_chunks, reduce_scratch, ring, scratch, stage_chunk,
};
use crate::call::Buffers;
use crate::copy::{copy, share};
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::{reduce_raw, reduce_raw2};
use crate::select::forms::{INLINE_ALL_REDUCE_MAX_RANKS, inline_all_reduce};
use crate::table::{Algorithm, Collective};

/// All-reduce of `count` elements from `send` into `recv` (which may be the same memory).
///
/// # Safety
/// `send` valid for `count` reads and `recv` for `count` writes; either identical or disjoint.
pub(crate) unsafe fn all_reduce<T: Element>(
    e: &mut HostEngine,
    algo: Algorithm,
    Buffers { send, recv, count }: Buffers<T>,
    op: ReduceOp,
) -> Result<()> {
    let (n, me) = (e.ws.world_size(), e.ws.rank());
    let publication = call_publication::<T>(Collective::AllReduce, Some(op), algo, count, 0);
    let agree = Agree { count: true, root: false };
    let cap = capacity::<T>(&e.ws);
    // SAFETY: o + k <= count; the scratch holds `cap >= k` elements.
    let stage = |e: &mut HostEngine, o, k| unsafe { stage_chunk(e, send, o, k, 0) };
    // Every algorithm but the two-phase and the ring runs one-shot here: the GPU's two-shots,
    // the channel family and the hierarchical steps run elsewhere (the plan never sends them
    // here), and one-shot is the safe reading of them.
    let bytes = count * std::mem::size_of::<T>();
    if inline_all_reduce(algo, bytes, n, INLINE_BYTES) {
        // The payload travels in the header line: one cache line per peer and step.
        let mut p = publication;
        // SAFETY: send holds count elements (at most INLINE_BYTES), copied into the words.
        unsafe { std::ptr::copy_nonoverlapping(send.cast::<u8>(), p.inline.as_mut_ptr().cast::<u8>(), bytes) };
        e.step("all_reduce", p, agree)?;
        let mut words = [[0u64; 2]; INLINE_ALL_REDUCE_MAX_RANKS];
        let mut srcs = [std::ptr::null::<T>(); INLINE_ALL_REDUCE_MAX_RANKS];
        for (r, w) in words.iter_mut().enumerate().take(n) {
            *w = if r == me { p.inline } else { e.ws.publication(r).inline };
        }
        for (src, w) in srcs.iter_mut().zip(&words) {
            *src = w.as_ptr().cast::<T>();
        }
        // SAFETY: every source is an 8-byte aligned pair of words holding count elements (at
        // most INLINE_BYTES) of one rank's input, in rank order; recv is valid for count writes.
        unsafe { reduce_raw(op, n, recv, &srcs[..n], count) };
        e.ws.finish_step();
        return Ok(());
    }
    match algo {
        Algorithm::TwoPhase => {
            let half = cap / 2;
            let sz = std::mem::size_of::<T>();
            // Input inside a shared buffer: peers read it where it is (no copy into scratch).
            // They finish reading before the step's second phase, so the caller may reuse it as
            // soon as this returns.
            let shared = e.locate(send.cast(), count * sz);
            for (o, k) in chunks(count, half) {
                let (mine_a, mine_b) = share(k, n, me);
                let mut p = publication;
                match shared {
                    Some((id, off)) => {
                        p.source = id as u64 + 1;
                        p.source_offset = (off + o * sz) as u64;
                    }
                    None => {
                        // Stage only the shares the peers reduce; this rank reduces its own
                        // share straight from its input.
                        let scratch_in = scratch::<T>(&e.ws, me, 0, k)?;
                        // SAFETY: [0, mine_a) and [mine_b, k) of the input chunk go to the same
                        // offsets of this rank's scratch input area (k <= half elements).
                        unsafe {
                            copy(send.add(o), scratch_in, mine_a);
                            copy(send.add(o + mine_b), scratch_in.add(mine_b), k - mine_b);
                        }
                    }
                }
                e.step("all_reduce", p, agree)?;
                let (a, b) = (mine_a, mine_b);
                let mut srcs = Vec::with_capacity(n);
                for r in 0..n {
                    let pr = e.ws.publication(r);
                    srcs.push(if r == me && shared.is_none() {
                        // SAFETY: o + b <= count: this rank's own share of its input.
                        unsafe { send.add(o + a) }
                    } else if pr.source == 0 {
                        scratch::<T>(&e.ws, r, a, b - a)? as *const T
                    } else {
                        e.shared_source(r, pr.source, pr.source_offset + (a * sz) as u64, (b - a) * sz)?.cast::<T>()
                    });
                }
                // Own input first: in place, the output aliases exactly this source.
                srcs.swap(0, me);
                let out = scratch::<T>(&e.ws, me, half + a, b - a)?;
                // SAFETY: the sources are every rank's share [a, b) of this chunk; `recv + o + a`
                // is valid for b - a writes and aliases at most the first source exactly (in
                // place); `out` is this rank's output area, disjoint from all of them.
                unsafe { reduce_raw2(op, n, recv.add(o + a), out, &srcs, b - a) };
                e.phase("all_reduce gather")?;
                for q in (0..n).filter(|&q| q != me) {
                    let (a, b) = share(k, n, q);
                    // SAFETY: rank q's output share, fully written before the phase; recv + o + a
                    // is inside the caller's buffer.
                    unsafe { copy(scratch::<T>(&e.ws, q, half + a, b - a)?, recv.add(o + a), b - a) };
                }
                e.ws.finish_step();
            }
        }
        Algorithm::Ring => {
            in_chunks(e, chunks(count, cap), "all_reduce", publication, agree, stage, |e, o, k| {
                // Segment c is share c of the chunk. The reduce-scatter completes segment
                // (me + 1) here, and the all-gather starts with the left neighbour's (me).
                let segment = |c| {
                    let (a, b) = share(k, n, c);
                    (a, b - a)
                };
                ring::reduce_scatter::<T>(e, op, (me + 1) % n, segment, "all_reduce ring reduce-scatter")?;
                ring::all_gather::<T>(e, me, segment, "all_reduce ring all-gather")?;
                // SAFETY: the scratch's first k elements hold the result; recv + o valid for k.
                unsafe { copy(scratch::<T>(&e.ws, me, 0, k)?, recv.add(o), k) };
                Ok(())
            })?;
        }
        // One-shot (see `one_shot` above).
        _ => in_chunks(e, chunks(count, cap), "all_reduce", publication, agree, stage, |e, o, k| {
            // SAFETY: `recv + o` is valid for k writes and distinct from scratch.
            unsafe { reduce_scratch(e, op, 0, k, recv.add(o)) }
        })?,
    }
    Ok(())
}

/// Reduce of `count` elements to `root`; `recv` is written on the root only.
///
/// # Safety
/// `send` valid for `count` reads; on the root, `recv` valid for `count` writes (identical to
/// `send` or disjoint). Elsewhere `recv` is not touched.
pub(crate) unsafe fn reduce<T: Element>(
    e: &mut HostEngine,
    algo: Algorithm,
    Buffers { send, recv, count }: Buffers<T>,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let (n, me) = (e.ws.world_size(), e.ws.rank());
    let publication = call_publication::<T>(Collective::Reduce, Some(op), algo, count, root);
    let agree = Agree { count: true, root: true };
    let cap = capacity::<T>(&e.ws);
    let two_phase = algo == Algorithm::TwoPhase;
    let chunk = if two_phase { cap / 2 } else { cap };
    // SAFETY: o + k <= count; the scratch's input area holds `chunk` elements.
    let stage = |e: &mut HostEngine, o, k| unsafe { stage_chunk(e, send, o, k, 0) };
    in_chunks(e, chunks(count, chunk), "reduce", publication, agree, stage, |e, o, k| {
        if two_phase {
            let (a, b) = share(k, n, me);
            let out = scratch::<T>(&e.ws, me, chunk + a, b - a)?;
            // SAFETY: `out` is this rank's output area, disjoint from every input share.
            unsafe { reduce_scratch(e, op, a, b - a, out)? };
            e.phase("reduce gather")?;
            if me == root {
                for q in 0..n {
                    let (a, b) = share(k, n, q);
                    // SAFETY: rank q's reduced share; recv valid on the root.
                    unsafe { copy(scratch::<T>(&e.ws, q, chunk + a, b - a)?, recv.add(o + a), b - a) };
                }
            }
        } else if me == root {
            // SAFETY: on the root `recv + o` is valid for k writes and distinct from scratch.
            unsafe { reduce_scratch(e, op, 0, k, recv.add(o))? };
        }
        Ok(())
    })
}
