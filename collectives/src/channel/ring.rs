//! Ring and chain algorithms over links: each rank talks to its two neighbours only.
//!
//! - **all-reduce**: reduce-scatter then all-gather around the ring, `2(n - 1)` steps; at step
//!   `t` rank `r` sends share `(r - t) mod n` to its right and receives the same share index
//!   from its left, so one formula drives both halves.
//! - **all-gather / reduce-scatter**: the matching half alone.
//! - **broadcast**: a chain from the root, pipelined by messages.
//! - **reduce**: a chain towards the root, pipelined by messages.
//!
//! Large calls go in rounds. Inside a round every share is at most `SLOTS - 1` messages long:
//! a rank waits for its right neighbour's credit while it still holds one message of its left,
//! and with one slot to spare that credit never depends on a step the neighbour has not
//! reached — the ring cannot deadlock.

use comm_core::Result;
use comm_core::communicator::Communicator as Core;

use super::{ChannelEngine, Run, partial, piece, pieces};
use crate::call::CallSpec;
use crate::call::{Buffers, CollectiveCall};
use crate::copy::{copy, share};
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::reduce_raw2;
use crate::schedule::SLOTS;

/// Runs `c` around the ring (chains for broadcast and reduce). Safety: as [`ChannelEngine::run`].
pub(super) unsafe fn run<T: Element>(Run { e, core, spec, c }: Run<'_, T>) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let (send, recv) = c.buffers();
    let b = Buffers { send, recv, count: spec.count };
    let ahead = |pos: usize| (pos + 1 < n).then(|| (me + 1) % n);
    let behind = |pos: usize| (pos > 0).then(|| (me + n - 1) % n);
    // An invalid rank may name a root outside the world; it moves no data either way.
    let position = |root: usize| (me + n - if root < n { root } else { 0 }) % n;
    // SAFETY: (every arm) forwarded from the caller; an invalid rank moves no data (count 0).
    unsafe {
        match c {
            CollectiveCall::AllReduce { op, .. } => around(e, core, spec, b, Some(op), Ring::AllReduce),
            CollectiveCall::ReduceScatter { op, .. } => around(e, core, spec, b, Some(op), Ring::ReduceScatter),
            CollectiveCall::AllGather { .. } => around(e, core, spec, b, None, Ring::AllGather),
            // Broadcast flows from the root (position 0) to position n - 1, reduce back.
            CollectiveCall::Broadcast { root, .. } => {
                let pos = position(root);
                chain(e, core, spec, b, behind(pos), ahead(pos), None)
            }
            CollectiveCall::Reduce { op, root, .. } => {
                let pos = position(root);
                chain(e, core, spec, b, ahead(pos), behind(pos), Some(op))
            }
            // No ring form: all-to-all is direct (the table never picks this).
            CollectiveCall::AllToAll { .. } => super::direct::run(Run { e, core, spec, c }),
        }
    }
}

/// Which collective a ring pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ring {
    AllReduce,
    ReduceScatter,
    AllGather,
}

/// One ring collective. For all-reduce, shares of the whole buffer; for reduce-scatter and
/// all-gather, blocks of `count` elements (the block of rank `b` is share `b`).
///
/// Step `t` sends share `(r - t + shift) mod n` and receives share `(r - t - 1 + shift) mod n`
/// from the left; `shift` is 0 for all-reduce and all-gather, -1 for reduce-scatter (so each
/// rank finishes with its own block).
unsafe fn around<T: Element>(
    e: &mut ChannelEngine,
    core: &Core,
    spec: CallSpec,
    Buffers { send, recv, count }: Buffers<T>,
    op: Option<ReduceOp>,
    kind: Ring,
) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let (left, right) = ((me + n - 1) % n, (me + 1) % n);
    let mut call = e.begin(core, &[left, right], spec)?;
    let chunk = e.chunk::<T>();
    let sz = std::mem::size_of::<T>();
    let op = op.unwrap_or(ReduceOp::Sum);
    if n == 1 {
        // SAFETY: send and recv hold count elements (caller); identical or disjoint.
        unsafe { copy(send, recv, count) };
        return call.finish();
    }
    // Elements of one share (block) that one round moves: at most SLOTS - 1 messages, since a
    // rank waits for its right neighbour's credit while it still holds its left's message.
    let per_share = (SLOTS - 1) * chunk;
    // All-reduce splits the buffer into n shares; the others move blocks of `count`.
    let (share_total, steps_rs, steps_ag) = match kind {
        Ring::AllReduce => (count.div_ceil(n), n - 1, n - 1),
        Ring::ReduceScatter => (count, n - 1, 0),
        Ring::AllGather => (count, 0, n - 1),
    };
    let rounds = share_total.div_ceil(per_share).max(1);
    let shift = if kind == Ring::ReduceScatter { n - 1 } else { 0 };
    // Where share `s`'s elements [a, b) of this round live in the user's buffers.
    let range = |s: usize, round: usize| -> (usize, usize, usize) {
        match kind {
            Ring::AllReduce => {
                let (a, b) = share(count, n, s);
                let lo = (a + round * per_share).min(b);
                (lo, (lo + per_share).min(b), 0)
            }
            _ => {
                let lo = (round * per_share).min(count);
                (lo, (lo + per_share).min(count), s * count)
            }
        }
    };
    // The input of share `s` (for reduce-scatter, the send buffer holds every block; for
    // all-reduce, shares of it; for all-gather, the send buffer is this rank's block only).
    let input = |s: usize, lo: usize| -> *const T {
        // SAFETY: callers pass offsets inside the send buffer.
        unsafe {
            match kind {
                Ring::AllReduce => send.add(lo),
                Ring::ReduceScatter => send.add(s * count + lo),
                Ring::AllGather => send.add(lo),
            }
        }
    };
    let total_steps = steps_rs + steps_ag;
    for round in 0..rounds {
        if kind == Ring::AllGather {
            let (lo, hi, _) = range(me, round);
            // SAFETY: this rank's block of recv holds count elements; identical or disjoint.
            unsafe { copy(send.add(lo), recv.add(me * count + lo), hi - lo) };
        }
        for t in 0..=total_steps {
            let send_share = (me + n + shift - t % n) % n;
            // Step t >= 1 receives share (me - t + shift) from the left — the share the left
            // sent at step t - 1 — and passes it on, reduced or kept.
            if t >= 1 {
                let s = send_share;
                let (lo, hi, base) = range(s, round);
                for c in 0..pieces(hi - lo, chunk) {
                    let Some((a, k)) = piece(c, hi - lo, chunk).map(|(a, k)| (lo + a, k)) else { break };
                    let inbox = e.receive(&mut call, left, k * sz)?.cast::<T>();
                    let forward = t < total_steps;
                    let out = if forward { e.outbox(right, call.what)?.cast::<T>() } else { std::ptr::null_mut() };
                    if t <= steps_rs {
                        // Reduce the partial result with this rank's input of the share.
                        let last = t == steps_rs;
                        let o = if last { op } else { partial(op) };
                        let src = input(s, a);
                        // SAFETY: inbox holds k elements (checked length), src and the
                        // destination are inside the caller's buffers; out, when set, is a
                        // private outbox slot of k elements, disjoint from everything else.
                        unsafe {
                            if last {
                                let dst = match kind {
                                    Ring::ReduceScatter => recv.add(a),
                                    _ => recv.add(base + a),
                                };
                                reduce_raw2(o, n, dst, out, &[inbox, src], k);
                            } else {
                                reduce_raw2(o, n, out, std::ptr::null_mut(), &[inbox, src], k);
                            }
                        }
                    } else {
                        // All-gather half: keep the finished share, and pass it on.
                        // SAFETY: as above; recv + base + a holds k elements.
                        unsafe {
                            copy(inbox, recv.add(base + a), k);
                            if forward {
                                copy(inbox, out, k);
                            }
                        }
                    }
                    e.release(left)?;
                    if forward {
                        e.post(&call, right, k * sz)?;
                    }
                }
            } else {
                // Step 0: send this rank's own input of its first share.
                let s = send_share;
                let (lo, hi, _) = range(s, round);
                for c in 0..pieces(hi - lo, chunk) {
                    let Some((a, k)) = piece(c, hi - lo, chunk).map(|(a, k)| (lo + a, k)) else { break };
                    // SAFETY: input(s, a) is valid for k elements of the send buffer.
                    unsafe { e.send_bytes(&call, right, input(s, a).cast(), k * sz)? };
                }
            }
        }
    }
    call.finish()
}

/// A chain from `prev` to `next` (either absent at the ends), pipelined by messages: broadcast
/// when `op` is `None` (copy and pass on), reduce towards the root otherwise (combine with this
/// rank's input and pass on; the root, with no `next`, writes the result).
unsafe fn chain<T: Element>(
    e: &mut ChannelEngine,
    core: &Core,
    spec: CallSpec,
    Buffers { send, recv, count }: Buffers<T>,
    prev: Option<usize>,
    next: Option<usize>,
    op: Option<ReduceOp>,
) -> Result<()> {
    let n = e.world_size;
    let peers: Vec<usize> = prev.into_iter().chain(next).collect();
    let mut call = e.begin(core, &peers, spec)?;
    let chunk = e.chunk::<T>();
    let sz = std::mem::size_of::<T>();
    for c in 0..pieces(count, chunk) {
        let Some((a, k)) = piece(c, count, chunk) else { break };
        // SAFETY: (the whole loop body) send and recv are valid for count elements where this
        // rank reads or writes them (caller); a + k <= count; inbox and outbox slots hold a
        // full chunk and are disjoint from the user's buffers.
        unsafe {
            match (prev, next, op) {
                // The head of the chain: its own data only.
                (None, Some(to), _) => {
                    e.send_bytes(&call, to, send.add(a).cast(), k * sz)?;
                    if op.is_none() {
                        copy(send.add(a), recv.add(a), k);
                    }
                }
                (None, None, _) => copy(send.add(a), recv.add(a), k),
                (Some(from), to, None) => {
                    let inbox = e.receive(&mut call, from, k * sz)?.cast::<T>();
                    copy(inbox, recv.add(a), k);
                    if let Some(to) = to {
                        let out = e.outbox(to, call.what)?.cast::<T>();
                        copy(inbox, out, k);
                        e.release(from)?;
                        e.post(&call, to, k * sz)?;
                    } else {
                        e.release(from)?;
                    }
                }
                (Some(from), to, Some(op)) => {
                    let inbox = e.receive(&mut call, from, k * sz)?.cast::<T>();
                    let srcs = [inbox, send.add(a)];
                    if let Some(to) = to {
                        let out = e.outbox(to, call.what)?.cast::<T>();
                        reduce_raw2(partial(op), n, out, std::ptr::null_mut(), &srcs, k);
                        e.release(from)?;
                        e.post(&call, to, k * sz)?;
                    } else {
                        reduce_raw2(op, n, recv.add(a), std::ptr::null_mut(), &srcs, k);
                        e.release(from)?;
                    }
                }
            }
        }
    }
    call.finish()
}
