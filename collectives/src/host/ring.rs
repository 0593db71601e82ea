//! The two passes of a ring over the workspace's scratch, shared by the ring all-reduce,
//! reduce-scatter and all-gather: each rank works on segments of its own scratch and reads only
//! its left neighbour's, one phase per sub-step.

use comm_core::Result;

use super::{HostEngine, scratch};
use crate::copy::copy;
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::reduce_raw;

/// Reduce-scatter pass: at sub-step `t`, folds the left neighbour's partial result of segment
/// `(done - (n - 2 - t)) mod n` into this rank's, so that after `n - 1` sub-steps segment `done`
/// is complete here. `segment(c)` is segment `c`'s (offset, length) in elements of scratch. An
/// average sums until the last sub-step, which divides.
pub(super) fn reduce_scatter<T: Element>(
    e: &mut HostEngine,
    op: ReduceOp,
    done: usize,
    segment: impl Fn(usize) -> (usize, usize),
    what: &str,
) -> Result<()> {
    sub_steps(e, what, |e, n, t, me, left| {
        let (offset, len) = segment((done + 2 * n - 2 - t) % n);
        let step_op = if op == ReduceOp::Avg && t + 2 != n { ReduceOp::Sum } else { op };
        let mine = scratch::<T>(&e.ws, me, offset, len)?;
        let theirs = scratch::<T>(&e.ws, left, offset, len)?;
        // SAFETY: `mine` aliases the first source exactly (allowed); the left neighbour finished
        // this segment before the last phase and does not touch it during this sub-step.
        unsafe { reduce_raw(step_op, n, mine, &[mine as *const T, theirs as *const T], len) };
        Ok(())
    })
}

/// All-gather pass: at sub-step `t`, copies segment `(first - t) mod n`, complete in the left
/// neighbour's scratch, into this rank's; `first` is the segment the left neighbour holds
/// complete when the pass starts. `segment` as in [`reduce_scatter`].
pub(super) fn all_gather<T: Element>(
    e: &mut HostEngine,
    first: usize,
    segment: impl Fn(usize) -> (usize, usize),
    what: &str,
) -> Result<()> {
    sub_steps(e, what, |e, n, t, me, left| {
        let (offset, len) = segment((first + n - t) % n);
        // SAFETY: the left neighbour's segment is complete and not written during this sub-step;
        // this rank's is its own to write.
        unsafe { copy(scratch::<T>(&e.ws, left, offset, len)?, scratch::<T>(&e.ws, me, offset, len)?, len) };
        Ok(())
    })
}

/// Runs the `n - 1` sub-steps of a pass, each `sub_step(e, n, t, me, left)` (world size,
/// sub-step, this rank, its left neighbour) followed by one phase named `what`.
fn sub_steps(
    e: &mut HostEngine,
    what: &str,
    mut sub_step: impl FnMut(&HostEngine, usize, usize, usize, usize) -> Result<()>,
) -> Result<()> {
    let (n, me) = (e.ws.world_size(), e.ws.rank());
    let left = (me + n - 1) % n;
    for t in 0..n.saturating_sub(1) {
        sub_step(e, n, t, me, left)?;
        e.phase(what)?;
    }
    Ok(())
}
