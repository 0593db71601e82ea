//! Binomial trees over links, for broadcast and reduce from any root in a world of any size:
//! `ceil(log2 n)` steps. Ranks are numbered relative to the root (`v = (r - root) mod n`); at
//! step `k` (`mask = 2^k`) the ranks `v < mask` that have the data send it to `v + mask`.
//!
//! - **broadcast**: the root's data flows down the tree, each rank sending the whole buffer to
//!   its children after receiving it from its parent.
//! - **reduce**: the same tree upwards: rank `v` combines its input with the partial results of
//!   its children, the smallest subtree first (the last child of the broadcast, a leaf, is ready
//!   after one step; the first, whose subtree is half the world, last), and sends the result to
//!   its parent `v - 2^h` (`2^h` the highest set bit of `v`). `Avg` sums, and the root divides
//!   once at the end.
//!
//! A rank hears only from its parent (broadcast) or its children (reduce), so a count, type or
//! operator that differs is reported where the messages meet; a root that differs between ranks
//! makes the ranks build different trees, and surfaces at a later call or as a timeout, as with
//! the eager algorithms.

use comm_core::Result;

use super::swap::swap;
use super::{ChannelEngine, Run, partial};
use crate::call::{Buffers, CollectiveCall};
use crate::copy::copy;
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::reduce_raw;
use crate::schedule::binomial_tree;

/// Runs a broadcast or reduce down or up the binomial tree. Safety: as [`ChannelEngine::run`].
pub(super) unsafe fn run<T: Element>(Run { e, core, spec, c }: Run<'_, T>) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let (send, recv) = c.buffers();
    let b = Buffers { send, recv, count: spec.count };
    // An invalid rank may name a root outside the world; it moves no data either way.
    let root = if spec.root < n { spec.root } else { 0 };
    let (parent, children) = binomial_tree(n, me, root);
    let peers: Vec<usize> = parent.into_iter().chain(children.iter().copied()).collect();
    // SAFETY: (every arm) forwarded from the caller.
    unsafe {
        match c {
            CollectiveCall::Broadcast { .. } => {
                let mut call = e.begin(core, &peers, spec)?;
                broadcast(e, &mut call, b, me == root, parent, &children)?;
                call.finish()
            }
            CollectiveCall::Reduce { op, .. } => {
                let mut call = e.begin(core, &peers, spec)?;
                reduce(e, &mut call, b, op, me == root, parent, &children)?;
                call.finish()
            }
            // The table names the tree for these two only; anything else runs directly.
            _ => super::direct::run(Run { e, core, spec, c }),
        }
    }
}

/// Broadcast: receive the whole buffer from the parent (the root copies its input), then send
/// it to every child.
unsafe fn broadcast<T: Element>(
    e: &mut ChannelEngine,
    call: &mut super::Call,
    Buffers { send, recv, count }: Buffers<T>,
    is_root: bool,
    parent: Option<usize>,
    children: &[usize],
) -> Result<()> {
    // SAFETY: recv holds count elements, and so does the root's send (caller); identical or
    // disjoint.
    unsafe {
        if is_root {
            copy(send, recv, count);
        } else if let Some(p) = parent {
            swap(e, call, None, Some((p, count)), |a, m, k| copy(m, recv.add(a), k))?;
        }
        for &child in children {
            swap(e, call, Some((child, recv.cast_const(), count)), None, |_, _, _| {})?;
        }
    }
    Ok(())
}

/// Reduce: combine this rank's input with every child's partial result, then send it to the
/// parent; the root writes the result.
unsafe fn reduce<T: Element>(
    e: &mut ChannelEngine,
    call: &mut super::Call,
    Buffers { send, recv, count }: Buffers<T>,
    op: ReduceOp,
    is_root: bool,
    parent: Option<usize>,
    children: &[usize],
) -> Result<()> {
    let n = e.world_size;
    let mut acc: Vec<T> = Vec::new();
    if count > 0 {
        // SAFETY: send holds count elements (caller).
        acc.extend_from_slice(unsafe { std::slice::from_raw_parts(send, count) });
    }
    let acc = acc.as_mut_ptr();
    let o = partial(op);
    for &child in children.iter().rev() {
        // SAFETY: acc + a holds k elements; the message holds k (checked length).
        unsafe {
            swap(e, call, None, Some((child, count)), |a, m, k| reduce_raw(o, n, acc.add(a), &[acc.add(a), m], k))?
        };
    }
    if let Some(p) = parent {
        // SAFETY: acc holds count elements.
        unsafe { swap(e, call, Some((p, acc.cast_const(), count)), None, |_, _, _| {})? };
    } else if is_root && count > 0 {
        // SAFETY: recv holds count elements at the root (caller), disjoint from the scratch;
        // one source with `Avg` divides by n, with any other operator copies.
        unsafe { reduce_raw(op, n, recv, &[acc.cast_const()], count) };
    }
    Ok(())
}
