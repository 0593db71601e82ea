//! Direct algorithms over links: every rank talks to every rank it exchanges data with, in
//! lockstep by message index — post message `c` to every peer, then take message `c` from every
//! peer — so a rank runs at most one message ahead of its slowest peer and no credit wait can
//! close a cycle. Reductions combine the inputs in rank order, so an all-reduce gives every rank
//! the same bits. One hop of latency: what small calls and small worlds want.

use comm_core::communicator::Communicator as Core;
use comm_core::{Error, Result};

use super::{ChannelEngine, Run, piece, pieces};
use crate::call::CallSpec;
use crate::call::CollectiveCall;
use crate::copy::copy;
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::reduce_raw;
use crate::table::{Algorithm, Collective};

/// Per-peer counts and displacements of an all-to-all-v, in elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllToAllvCounts<'a> {
    /// Elements sent to each rank.
    pub(crate) send_counts: &'a [usize],
    /// Where each rank's elements start in the send buffer.
    pub(crate) send_displs: &'a [usize],
    /// Elements received from each rank.
    pub(crate) recv_counts: &'a [usize],
    /// Where each rank's elements land in the receive buffer.
    pub(crate) recv_displs: &'a [usize],
}

/// (offset, elements) of the block for a peer.
type BlockOf<'a> = dyn Fn(usize) -> (usize, usize) + 'a;

/// What one rank sends to and receives from every peer, in elements: (offset, count) pairs
/// per peer, and how incoming data is used.
struct Exchange<'a> {
    /// Peers this rank posts to.
    to: Vec<usize>,
    /// Peers this rank takes messages from.
    from: Vec<usize>,
    /// (offset in the send buffer, elements) for each peer in `to`.
    out: &'a BlockOf<'a>,
    /// (offset in the receive buffer, elements) for each peer in `from`.
    inc: &'a BlockOf<'a>,
    /// `Some(op)`: combine every rank's message `c` (and this rank's own input) in rank order
    /// into the receive buffer; `None`: copy each message to its place.
    reduce: Option<ReduceOp>,
}

/// Runs `c` directly between the ranks. Safety: as [`ChannelEngine::run`].
pub(super) unsafe fn run<T: Element>(Run { e, core, spec, c }: Run<'_, T>) -> Result<()> {
    let count = spec.count;
    let (n, me) = (e.world_size, e.rank);
    let others: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    let whole = |_: usize| (0, count);
    let block = |q: usize| (q * count, count);
    let none: Vec<usize> = Vec::new();
    if n == 1 {
        // Every collective of one rank is a copy of its input (count elements, one block).
        let mut call = e.begin(core, &[], spec)?;
        let (send, recv) = c.buffers();
        // SAFETY: both buffers hold count elements (caller); identical or disjoint.
        unsafe { copy(send, recv, count) };
        return call.problem.take().map_or(Ok(()), Err);
    }
    // SAFETY: (every arm) forwarded from the caller; the exchanges below stay inside the
    // buffers the collective defines (count elements, or n blocks of count).
    unsafe {
        match c {
            CollectiveCall::AllReduce { send, recv, op, .. } => {
                let x = Exchange { to: others.clone(), from: others, out: &whole, inc: &whole, reduce: Some(op) };
                exchange(e, core, spec, send, recv, &x, Some((send, 0)))
            }
            CollectiveCall::AllGather { send, recv, .. } => {
                copy(send, recv.add(me * count), count);
                let x = Exchange { to: others.clone(), from: others, out: &whole, inc: &block, reduce: None };
                exchange(e, core, spec, send, recv, &x, None)
            }
            CollectiveCall::ReduceScatter { send, recv, op, .. } => {
                let own = |_: usize| (0, count);
                let x = Exchange { to: others.clone(), from: others, out: &block, inc: &own, reduce: Some(op) };
                exchange(e, core, spec, send, recv, &x, Some((send, me * count)))
            }
            CollectiveCall::AllToAll { send, recv, .. } => {
                copy(send.add(me * count), recv.add(me * count), count);
                let x = Exchange { to: others.clone(), from: others, out: &block, inc: &block, reduce: None };
                exchange(e, core, spec, send, recv, &x, None)
            }
            CollectiveCall::Broadcast { send, recv, root, .. } => {
                let x = if me == root {
                    copy(send, recv, count);
                    Exchange { to: others, from: none, out: &whole, inc: &whole, reduce: None }
                } else {
                    Exchange { to: none, from: vec![root], out: &whole, inc: &whole, reduce: None }
                };
                exchange(e, core, spec, send, recv, &x, None)
            }
            CollectiveCall::Reduce { send, recv, op, root, .. } => {
                if me == root {
                    let x = Exchange { to: none, from: others, out: &whole, inc: &whole, reduce: Some(op) };
                    exchange(e, core, spec, send, recv, &x, Some((send, 0)))
                } else {
                    let x = Exchange { to: vec![root], from: none, out: &whole, inc: &whole, reduce: None };
                    exchange(e, core, spec, send, recv, &x, None)
                }
            }
        }
    }
}

/// All-to-all-v through the channel executor (or, when `invalid`, taking part with no data).
///
/// # Safety
/// Every block lies inside its buffer and receive blocks do not overlap each other or the send
/// buffer (the user API checks this).
pub(crate) unsafe fn all_to_allv<T: Element>(
    e: &mut ChannelEngine,
    core: &Core,
    send: *const T,
    recv: *mut T,
    v: AllToAllvCounts<'_>,
    invalid: bool,
) -> Result<()> {
    e.check_usable()?;
    let (n, me) = (e.world_size, e.rank);
    let spec = CallSpec {
        collective: Collective::AllToAllv,
        algorithm: Algorithm::ChannelDirect,
        dtype: T::DTYPE,
        op: None,
        count: 0,
        root: 0,
        invalid,
        variant: 0,
    };
    let others: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    let zero = |_: usize| (0, 0);
    let out = |q: usize| (v.send_displs[q], v.send_counts[q]);
    let inc = |p: usize| (v.recv_displs[p], v.recv_counts[p]);
    let (out, inc): (&BlockOf<'_>, &BlockOf<'_>) = if invalid { (&zero, &zero) } else { (&out, &inc) };
    if !invalid {
        if v.send_counts[me] != v.recv_counts[me] {
            return Err(Error::invalid(format!(
                "all_to_allv: rank {me} sends {} elements to itself but receives {}",
                v.send_counts[me], v.recv_counts[me]
            )));
        }
        // SAFETY: both blocks lie inside their buffers (checked by the API).
        unsafe { copy(send.add(v.send_displs[me]), recv.add(v.recv_displs[me]), v.send_counts[me]) };
    }
    let x = Exchange { to: others.clone(), from: others, out, inc, reduce: None };
    // SAFETY: forwarded from the caller.
    let r = unsafe { exchange(e, core, spec, send, recv, &x, None) };
    r.map_err(|err| e.poison(err))
}

/// The lockstep exchange: message `c` to every peer of `to`, then message `c` from every peer
/// of `from`, until every block is through. `own` is this rank's input for a reduction (its
/// buffer and element offset), combined in rank order with the peers' messages.
///
/// # Safety
/// The send buffer is valid for every `out` block and the receive buffer for every `inc` block
/// (and `own` for the `inc` counts); receive blocks are disjoint from each other and, unless
/// identical, from send blocks.
unsafe fn exchange<T: Element>(
    e: &mut ChannelEngine,
    core: &Core,
    spec: CallSpec,
    send: *const T,
    recv: *mut T,
    x: &Exchange<'_>,
    own: Option<(*const T, usize)>,
) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let mut peers: Vec<usize> = x.to.iter().chain(&x.from).copied().collect();
    peers.sort_unstable();
    peers.dedup();
    let all_to_allv = spec.collective == Collective::AllToAllv;
    let mut call = e.begin(core, &peers, spec)?;
    let chunk = e.chunk::<T>();
    let sz = std::mem::size_of::<T>();
    let pieces = |elems: usize| pieces(elems, chunk);
    let rounds = x.to.iter().map(|&q| pieces((x.out)(q).1)).chain(x.from.iter().map(|&p| pieces((x.inc)(p).1))).max();
    let mut srcs: Vec<*const T> = vec![std::ptr::null(); n];
    for c in 0..rounds.unwrap_or(0) {
        for &q in &x.to {
            let (off, elems) = (x.out)(q);
            let Some((a, k)) = piece(c, elems, chunk) else { continue };
            if all_to_allv {
                // Each pair agrees on its own count: the receiver checks this one.
                call.header.count = elems as u64;
            }
            // SAFETY: the block [off, off + elems) lies inside the send buffer (caller).
            unsafe { e.send_bytes(&call, q, send.add(off + a).cast(), k * sz)? };
        }
        let mut taken = Vec::with_capacity(x.from.len());
        for &p in &x.from {
            let (off, elems) = (x.inc)(p);
            let Some((a, k)) = piece(c, elems, chunk) else { continue };
            if all_to_allv {
                call.header.count = elems as u64;
            }
            let inbox = e.receive(&mut call, p, k * sz)?.cast::<T>();
            match x.reduce {
                None => {
                    // SAFETY: the block [off, off + elems) lies inside the receive buffer
                    // (caller); the inbox holds k elements.
                    unsafe { copy(inbox, recv.add(off + a), k) };
                    e.release(p)?;
                }
                Some(_) => {
                    srcs[p] = inbox;
                    taken.push((p, off + a, k));
                }
            }
        }
        if let (Some(op), Some((input, base))) = (x.reduce, own) {
            let Some(&(_, at, k)) = taken.first() else { continue };
            // SAFETY: this rank's input holds the same block (caller).
            srcs[me] = unsafe { input.add(base + at) };
            // SAFETY: every source holds k elements (inboxes by their checked length, the input
            // by the caller); recv + at is valid for k writes and may alias the input exactly.
            unsafe { reduce_raw(op, n, recv.add(at), &srcs, k) };
            for &(p, _, _) in &taken {
                e.release(p)?;
            }
        } else if let Some(op) = x.reduce {
            return Err(Error::invalid(format!("{} reduction without this rank's input", op.name())));
        }
    }
    call.finish()
}
