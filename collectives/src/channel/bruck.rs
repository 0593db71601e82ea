//! Bruck's algorithms over links, for any world size: `ceil(log2 n)` steps, step `k` talking to
//! the ranks at distance `d = 2^k` on either side.
//!
//! - **all-gather**: a work buffer holds blocks in the order `r, r + 1, …` (mod `n`); step `k`
//!   sends the first `min(d, n - d)` blocks gathered so far to rank `r - d` and appends as many
//!   from rank `r + d`. A final rotation puts every block at its rank's place.
//! - **all-to-all**: the work buffer's block `j` starts as this rank's block for rank `r + j`;
//!   step `k` sends every block whose index has bit `k` set to rank `r + d` and takes the same
//!   blocks from rank `r - d` in their place. A block for rank `r + j` thus travels `j` ranks
//!   forward in the steps of `j`'s bits and ends at its destination in place `j`, which the final
//!   pass reads into the receive block of its source, `r - j`.
//!
//! Every block moves whole through scratch buffers of this rank: a small-call algorithm, where
//! the number of steps matters more than the bytes (all-to-all moves each block up to `log2 n`
//! times).

use comm_core::Result;

use super::Run;
use super::swap::swap;
use crate::call::CollectiveCall;
use crate::copy::copy;
use crate::dtype::Element;
use crate::schedule::{bruck_distances, bruck_peers};

/// Runs an all-gather or all-to-all by Bruck's algorithm. Safety: as [`ChannelEngine::run`].
pub(super) unsafe fn run<T: Element>(Run { e, core, spec, c }: Run<'_, T>) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let count = spec.count;
    let peers = bruck_peers(n, me);
    let (send, recv) = c.buffers();
    let block = |w: *mut T, j: usize| {
        // SAFETY: callers pass j < n, inside a buffer of n blocks of count elements.
        unsafe { w.add(j * count) }
    };
    let mut work: Vec<T> = vec![T::default(); n * count];
    let w = work.as_mut_ptr();
    match c {
        CollectiveCall::AllGather { .. } => {
            let mut call = e.begin(core, &peers, spec)?;
            // SAFETY: send holds count elements (caller), the work buffer n blocks.
            unsafe { copy(send, w, count) };
            let mut held = 1;
            for d in bruck_distances(n) {
                let m = d.min(n - d);
                let (to, from) = ((me + n - d) % n, (me + d) % n);
                let at = block(w, held);
                // SAFETY: the first m <= held blocks are sent; m blocks land after the held ones
                // (held + m <= n).
                unsafe {
                    swap(e, &mut call, Some((to, w.cast_const(), m * count)), Some((from, m * count)), |a, msg, k| {
                        copy(msg, at.add(a), k)
                    })?;
                }
                held += m;
            }
            for j in 0..n {
                // SAFETY: block j of the work buffer holds rank (me + j)'s data; recv holds n
                // blocks (caller), disjoint from the scratch.
                unsafe { copy(block(w, j).cast_const(), recv.add((me + j) % n * count), count) };
            }
            call.finish()
        }
        CollectiveCall::AllToAll { .. } => {
            let mut call = e.begin(core, &peers, spec)?;
            for j in 0..n {
                // SAFETY: send holds n blocks (caller), as does the work buffer.
                unsafe { copy(send.add((me + j) % n * count), block(w, j), count) };
            }
            let mut packed: Vec<T> = vec![T::default(); n.div_ceil(2) * count];
            let mut arrived: Vec<T> = vec![T::default(); n.div_ceil(2) * count];
            for d in bruck_distances(n) {
                let moving: Vec<usize> = (0..n).filter(|j| j & d != 0).collect();
                let len = moving.len() * count;
                for (slot, &j) in moving.iter().enumerate() {
                    // SAFETY: slot < moving.len() <= ceil(n / 2) blocks of the packed buffer.
                    unsafe { copy(block(w, j).cast_const(), packed.as_mut_ptr().add(slot * count), count) };
                }
                let (to, from) = ((me + d) % n, (me + n - d) % n);
                let into = arrived.as_mut_ptr();
                // SAFETY: both packed buffers hold len elements.
                unsafe {
                    swap(e, &mut call, Some((to, packed.as_ptr(), len)), Some((from, len)), |a, msg, k| {
                        copy(msg, into.add(a), k)
                    })?;
                }
                for (slot, &j) in moving.iter().enumerate() {
                    // SAFETY: as above.
                    unsafe { copy(arrived.as_ptr().add(slot * count), block(w, j), count) };
                }
            }
            for j in 0..n {
                // SAFETY: block j holds the data rank (me - j) sent this rank; recv holds n
                // blocks (caller), disjoint from the scratch.
                unsafe { copy(block(w, j).cast_const(), recv.add((me + n - j) % n * count), count) };
            }
            call.finish()
        }
        // The table names Bruck for these two only; anything else runs directly.
        _ => {
            drop(work);
            // SAFETY: forwarded from the caller.
            unsafe { super::direct::run(Run { e, core, spec, c }) }
        }
    }
}
