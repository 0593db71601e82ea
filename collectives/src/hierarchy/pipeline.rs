//! A large hierarchical all-reduce in chunks, so that the network carries one chunk while the
//! node works on the next and the previous.
//!
//! From `select::forms::HIERARCHY_PIPELINE_BYTES`, the call's main part (a multiple of the node's `L` ranks) is cut into
//! [`CHUNKS`] chunks of `L × s` elements, and each chunk is a hierarchical all-reduce of its own:
//! reduce-scatter in the node (this rank's `s` elements of the chunk), all-reduce of those across
//! the rail, all-gather in the node. The calling thread runs the node steps; a second thread, for
//! the length of the call, runs the rail steps one chunk behind:
//!
//! | calling thread | rail thread |
//! |---|---|
//! | RS(0) | |
//! | RS(1) | AR(0) |
//! | AG(0), RS(2) | AR(1) |
//! | … | … |
//! | AG(last) | |
//!
//! So the network, the slowest of the three, is busy from the first chunk's reduce-scatter to
//! the last chunk's all-gather instead of standing still during every node step. Chunks are
//! disjoint ranges of the buffers, so the two threads never touch the same bytes.
//!
//! Every rank runs [`CHUNKS`] chunks whatever its count (chunks may be empty), so ranks whose
//! counts differ meet in a step that reports it, as in the unpipelined steps. Agreement works as
//! there: each thread keeps its own [`Steps`]; a chunk handed over after the calling thread
//! found a problem makes the rail thread take part in its step without data, and a rail step's
//! problem makes the calling thread take part in that chunk's all-gather without data; the call
//! returns the first problem. A lost peer or a timeout in either thread ends the call: the other
//! finds its partner gone at the next hand-over.

use std::sync::mpsc;

use comm_core::{Error, Result};

use super::{Hierarchy, StepRunner, Steps};
use crate::call::CollectiveCall;
use crate::dtype::Element;
use crate::op::ReduceOp;

/// Chunks of a pipelined call: the first reduce-scatter and the last all-gather are what the
/// network waits for, a sixteenth of the node work each.
pub(super) const CHUNKS: usize = 16;

/// The rail communicator, lent to the rail thread for the length of one call.
struct LentRail<'a, C>(&'a C);

impl<'a, C> LentRail<'a, C> {
    fn communicator(&self) -> &'a C {
        self.0
    }
}

// SAFETY: [`StepRunner`]'s contract: a `&C` may be used from another thread while no other
// thread uses the same value. While a pipelined call runs, only the rail thread calls into the
// rail communicator (the calling thread uses the node communicator, and joins the rail thread
// before it returns).
unsafe impl<C: StepRunner> Send for LentRail<'_, C> {}

/// A chunk's shard for the rail thread: its address and elements, and whether the calling
/// thread's steps had found a problem by then.
struct Handed {
    at: usize,
    len: usize,
    invalid: bool,
}

impl<C: StepRunner> Hierarchy<C> {
    /// The main part of an all-reduce (`main` elements, a multiple of `L`), pipelined as the
    /// module doc says; `Avg` is divided per chunk once its rail step summed it.
    ///
    /// # Safety
    /// As [`Hierarchy::run`] for an all-reduce of at least `main` elements.
    pub(super) unsafe fn all_reduce_pipelined<T: Element>(
        &self,
        steps: &mut Steps,
        send: *const T,
        recv: *mut T,
        main: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let l = self.grid.ranks_per_node;
        let shard = main / l;
        let per_chunk = shard.div_ceil(CHUNKS);
        let size = std::mem::size_of::<T>();
        let step_op = super::summing(op);
        // (first element, shard elements) of chunk c: base + l·s <= main for every chunk.
        let chunk = |c: usize| (c * l * per_chunk, per_chunk.min(shard.saturating_sub(c * per_chunk)));
        // This rank's shard of chunk c.
        let mine = |c: usize| {
            let (base, s) = chunk(c);
            // SAFETY: base + local·s + s <= base + l·s <= main <= count: inside recv.
            unsafe { recv.add(base + self.local * s) }
        };
        let rail = LentRail(&self.rail);
        let outcome = std::thread::scope(|scope| -> Result<Option<Error>> {
            let (to_rail, handed) = mpsc::channel::<Handed>();
            let (to_caller, summed) = mpsc::channel::<bool>();
            let rail_thread = std::thread::Builder::new()
                .name("weave-rail".into())
                .spawn_scoped(scope, move || -> Result<Steps> {
                    let comm = rail.communicator();
                    let mut rail_steps = Steps { problem: None };
                    for h in handed {
                        if h.invalid {
                            rail_steps
                                .problem
                                .get_or_insert(Error::invalid("an earlier step of this hierarchical call failed"));
                        }
                        let at = h.at as *mut T;
                        let ar = CollectiveCall::AllReduce { send: at, recv: at, count: h.len, op: step_op };
                        rail_steps.run(comm, h.len * size, ar)?;
                        if to_caller.send(rail_steps.ok()).is_err() {
                            break;
                        }
                    }
                    Ok(rail_steps)
                })
                .map_err(|e| Error::io("start the rail thread of a pipelined all-reduce", e))?;
            let mut rail_gone = false;
            let mut finish = |c: usize, steps: &mut Steps| -> Result<()> {
                match summed.recv() {
                    Ok(true) => {}
                    Ok(false) => {
                        steps.problem.get_or_insert(Error::invalid("a rail step of this hierarchical call failed"));
                    }
                    Err(_) => {
                        rail_gone = true;
                        return Ok(());
                    }
                }
                let (base, s) = chunk(c);
                // SAFETY: the chunk's shard holds the sum over every rank (its rail step is done).
                unsafe { self.finish_avg(steps, op, mine(c), s) };
                // SAFETY: base + l·s <= main: inside recv.
                let whole = unsafe { recv.add(base) };
                steps.run(&self.intra, l * s * size, CollectiveCall::AllGather { send: mine(c), recv: whole, count: s })
            };
            for c in 0..CHUNKS {
                let (base, s) = chunk(c);
                // SAFETY: base + l·s <= main: inside send.
                let input = unsafe { send.add(base) };
                let rs = CollectiveCall::ReduceScatter { send: input, recv: mine(c), count: s, op: step_op };
                steps.run(&self.intra, l * s * size, rs)?;
                if to_rail.send(Handed { at: mine(c) as usize, len: s, invalid: !steps.ok() }).is_err() {
                    break;
                }
                if c >= 1 {
                    finish(c - 1, steps)?;
                }
            }
            finish(CHUNKS - 1, steps)?;
            drop(to_rail);
            let rail_steps = rail_thread
                .join()
                .map_err(|_| Error::protocol("the rail thread of a pipelined all-reduce panicked"))??;
            if rail_gone {
                return Err(Error::protocol("the rail thread of a pipelined all-reduce ended early"));
            }
            Ok(rail_steps.problem)
        })?;
        if let Some(e) = outcome {
            steps.problem.get_or_insert(e);
        }
        Ok(())
    }
}
