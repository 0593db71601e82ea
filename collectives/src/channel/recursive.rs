//! Recursive doubling and halving over links: `log2 n` steps, each a swap with the rank whose
//! core index differs in one bit (see [`Fold`] for worlds that are not a power of two).
//!
//! - **all-reduce by doubling** (`channel_doubling`): every step swaps the whole buffer and
//!   reduces; for small calls.
//! - **all-reduce by halving** (`channel_halving`, Rabenseifner): a reduce-scatter by recursive
//!   halving — each step sends half of the part still held and reduces the other half — then an
//!   all-gather by recursive doubling; every rank moves `2(p - 1)/p` of the buffer.
//! - **reduce-scatter by halving**: the first half alone, over the blocks of the ranks each
//!   core index stands for.
//!
//! Every reduction combines the partial result of the lower core indices with that of the
//! higher ones, in that order, and both ranks of a pair compute the same values from the same
//! operands, so every rank ends with the same bits (floating-point sums included). `Avg` sums
//! until the step that produces a final value, which divides.

use comm_core::Result;
use comm_core::communicator::Communicator as Core;

use super::swap::swap;
use super::{Call, ChannelEngine, Run, partial};
use crate::call::CallSpec;
use crate::call::{Buffers, CollectiveCall};
use crate::copy::copy;
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::reduce_raw;
use crate::schedule::{Fold, doubling_peers};

/// All-reduce by recursive doubling.
///
/// # Safety
/// As [`ChannelEngine::run`].
pub(super) unsafe fn all_reduce_doubling<T: Element>(
    e: &mut ChannelEngine,
    core: &Core,
    spec: CallSpec,
    Buffers { send, recv, count }: Buffers<T>,
    op: ReduceOp,
) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let f = Fold::new(n);
    let mut call = e.begin(core, &doubling_peers(n, me), spec)?;
    // SAFETY: both buffers hold count elements (caller); identical or disjoint.
    unsafe { copy(send, recv, count) };
    let acc = recv;
    let Some(i) = f.core(me) else {
        // SAFETY: acc holds count elements, sent whole before the result lands in it.
        return unsafe { folded_out(e, call, (acc.cast_const(), count), (acc, count)) };
    };
    let steps = f.p.ilog2();
    let finals = |step: u32| if step + 1 == steps { op } else { partial(op) };
    if let Some(lower) = f.partner(me) {
        // The folded partner's data is the lower one; a world of 2^k + 1 ranks has no other
        // steps (p = 1 cannot happen: n >= 2 makes p >= 2).
        let o = partial(op);
        // SAFETY: acc + a holds k elements; the message holds k (checked length).
        unsafe {
            swap(e, &mut call, None, Some((lower, count)), |a, m, k| reduce_raw(o, n, acc.add(a), &[m, acc.add(a)], k))?
        };
    }
    for step in 0..steps {
        let mask = 1 << step;
        let peer = f.rank(i ^ mask);
        let o = finals(step);
        let mine_first = i & mask == 0;
        // SAFETY: message c of acc is sent before message c of the peer reduces into it
        // (see `swap`); acc + a holds k elements.
        unsafe {
            swap(e, &mut call, Some((peer, acc.cast_const(), count)), Some((peer, count)), |a, m, k| {
                let mine = acc.add(a).cast_const();
                let srcs = if mine_first { [mine, m] } else { [m, mine] };
                reduce_raw(o, n, acc.add(a), &srcs, k);
            })?;
        }
    }
    if let Some(lower) = f.partner(me) {
        // SAFETY: acc holds count elements.
        unsafe { swap(e, &mut call, Some((lower, acc.cast_const(), count)), None, |_, _, _| {})? };
    }
    call.finish()
}

/// Which collective a halving pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Halving {
    AllReduce,
    ReduceScatter,
}

/// All-reduce (Rabenseifner) or reduce-scatter by recursive halving. Safety: as [`ChannelEngine::run`].
pub(super) unsafe fn run<T: Element>(Run { e, core, spec, c }: Run<'_, T>) -> Result<()> {
    let (send, recv) = c.buffers();
    let b = Buffers { send, recv, count: spec.count };
    // SAFETY: (every arm) forwarded from the caller.
    unsafe {
        match c {
            CollectiveCall::AllReduce { op, .. } => halving(e, core, spec, b, op, Halving::AllReduce),
            CollectiveCall::ReduceScatter { op, .. } => halving(e, core, spec, b, op, Halving::ReduceScatter),
            // The table names halving for these two only; anything else runs directly.
            _ => super::direct::run(Run { e, core, spec, c }),
        }
    }
}

/// The whole part in a call of a rank folded out of the power-of-two core (see [`Fold`]): it
/// hands its input (`len` elements) to its partner, the next rank, takes the result (`count`
/// elements) back into `out`, and the call ends.
///
/// # Safety
/// `input` valid for `len` reads until it is sent, then `out` for `count` writes.
unsafe fn folded_out<T: Element>(
    e: &mut ChannelEngine,
    mut call: Call,
    (input, len): (*const T, usize),
    (out, count): (*mut T, usize),
) -> Result<()> {
    let partner = e.rank + 1;
    // SAFETY: forwarded from the caller; the received messages land inside `out`.
    unsafe {
        swap(e, &mut call, Some((partner, input, len)), None, |_, _, _| {})?;
        swap(e, &mut call, None, Some((partner, count)), |a, m, k| copy(m, out.add(a), k))?;
    }
    call.finish()
}

/// The halving pass, then (all-reduce) the doubling all-gather, with the fold around them.
///
/// The work buffer holds what the collective reduces: the all-reduce's buffer (in `recv`),
/// split into `p` shares; or a copy of the reduce-scatter's `n` blocks, where core index `i`
/// owns the blocks of the ranks it stands for.
unsafe fn halving<T: Element>(
    e: &mut ChannelEngine,
    core: &Core,
    spec: CallSpec,
    Buffers { send, recv, count }: Buffers<T>,
    op: ReduceOp,
    kind: Halving,
) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let f = Fold::new(n);
    let steps = f.p.ilog2();
    let mut call = e.begin(core, &doubling_peers(n, me), spec)?;
    let mut scratch: Vec<T> = Vec::new();
    let (work, total) = match kind {
        Halving::AllReduce => {
            // SAFETY: both buffers hold count elements (caller); identical or disjoint.
            unsafe { copy(send, recv, count) };
            (recv, count)
        }
        Halving::ReduceScatter => {
            if count > 0 {
                // SAFETY: send holds n blocks of count elements (caller).
                scratch.extend_from_slice(unsafe { std::slice::from_raw_parts(send, n * count) });
            }
            (scratch.as_mut_ptr(), n * count)
        }
    };
    // First element of core index i's part of the work buffer (bound(p) = total).
    let bound = |i: usize| match kind {
        Halving::AllReduce => total * i / f.p,
        Halving::ReduceScatter => f.first(i) * count,
    };
    let Some(i) = f.core(me) else {
        // SAFETY: work holds total elements; recv holds count (the all-reduce's result or this
        // rank's block).
        return unsafe { folded_out(e, call, (work.cast_const(), total), (recv, count)) };
    };
    if let Some(lower) = f.partner(me) {
        let o = partial(op);
        // SAFETY: work + a holds k elements; the message holds k (checked length).
        unsafe {
            swap(e, &mut call, None, Some((lower, total)), |a, m, k| {
                reduce_raw(o, n, work.add(a), &[m, work.add(a)], k)
            })?;
        }
    }
    // Recursive halving: the core indices [lo, lo + 2 * mask) split in two; this rank keeps its
    // half of them and sends the other.
    let mut lo = 0;
    for step in (0..steps).rev() {
        let mask = 1 << step;
        let peer = f.rank(i ^ mask);
        let (keep, give) = if i & mask == 0 { (lo, lo + mask) } else { (lo + mask, lo) };
        let (ka, kb) = (bound(keep), bound(keep + mask));
        let (ga, gb) = (bound(give), bound(give + mask));
        let o = if step == 0 { op } else { partial(op) };
        let mine_first = i & mask == 0;
        // SAFETY: the given and kept ranges are disjoint parts of the work buffer.
        unsafe {
            swap(e, &mut call, Some((peer, work.add(ga).cast_const(), gb - ga)), Some((peer, kb - ka)), |a, m, k| {
                let mine = work.add(ka + a);
                let srcs = if mine_first { [mine.cast_const(), m] } else { [m, mine.cast_const()] };
                reduce_raw(o, n, mine, &srcs, k);
            })?;
        }
        lo = keep;
    }
    match kind {
        Halving::AllReduce => {
            // Recursive doubling: the parts held so far double every step.
            for step in 0..steps {
                let mask = 1 << step;
                let peer = f.rank(i ^ mask);
                let mine = i & !(mask - 1);
                let theirs = (i ^ mask) & !(mask - 1);
                let (ma, mb) = (bound(mine), bound(mine + mask));
                let (ta, tb) = (bound(theirs), bound(theirs + mask));
                // SAFETY: the two ranges are disjoint parts of the work buffer.
                unsafe {
                    swap(
                        e,
                        &mut call,
                        Some((peer, work.add(ma).cast_const(), mb - ma)),
                        Some((peer, tb - ta)),
                        |a, m, k| copy(m, work.add(ta + a), k),
                    )?;
                }
            }
            if let Some(lower) = f.partner(me) {
                // SAFETY: work holds count elements.
                unsafe { swap(e, &mut call, Some((lower, work.cast_const(), count)), None, |_, _, _| {})? };
            }
        }
        Halving::ReduceScatter => {
            if let Some(lower) = f.partner(me) {
                // SAFETY: the lower rank's block lies inside the work buffer.
                unsafe {
                    swap(e, &mut call, Some((lower, work.add(lower * count).cast_const(), count)), None, |_, _, _| {})?
                };
            }
            // SAFETY: this rank's block lies inside the work buffer; recv holds count elements
            // (and is disjoint from the scratch).
            unsafe { copy(work.add(me * count).cast_const(), recv, count) };
        }
    }
    call.finish()
}
