//! The one road from a call to its executor: plans a call (`crate::select`) and runs it on the
//! executor the plan names — the host executor (`host/`), the channel executor over links
//! (`channel/`), the hierarchical steps (`hierarchy/`), or on device buffers the GPU engine
//! (`gpu/`: its direct kernels, or its channel kernels; that road is in `exec/device.rs`). The
//! user's API (`api/`) checks a call's arguments and records it in the ledger, then comes here;
//! the executors know nothing of either.

use std::cell::RefMut;
#[cfg(feature = "cuda")]
use std::sync::Arc;

use comm_core::diagnostics;
use comm_core::{Error, Result};
#[cfg(feature = "cuda")]
use cudarc::driver::CudaStream;

use crate::api::communicator::Communicator;
#[cfg(feature = "cuda")]
use crate::call::DeviceCall;
use crate::call::{Buffers, CollectiveCall, already_in_a_call};
use crate::channel::ChannelEngine;
use crate::dtype::{DataType, Element};
use crate::hierarchy::{Hierarchy, StepRunner};
use crate::host::{self, HostEngine};
use crate::op::ReduceOp;
use crate::select::{CallShape, Executor};
use crate::table::{Algorithm, Collective};
use crate::widen::WideHostCall;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub(crate) use device::no_gpu;

/// Calls on host memory: the engines, and the plan's executor.
impl Communicator {
    /// The host executor, when every peer's memory is mapped here, and usable.
    pub(crate) fn engine(&self) -> Result<RefMut<'_, HostEngine>> {
        let host = self.host.as_ref().ok_or_else(|| {
            Error::Unsupported(
                "this communicator reaches some peers only through connections, so it has no shared host \
                 workspace (shared buffers and the direct algorithms need every peer on this host)"
                    .into(),
            )
        })?;
        let e = host.try_borrow_mut().map_err(|_| already_in_a_call())?;
        e.check_usable()?;
        Ok(e)
    }

    /// The channel executor, if usable.
    #[inline]
    pub(crate) fn channel_engine(&self) -> Result<RefMut<'_, ChannelEngine>> {
        let e = self.channel.try_borrow_mut().map_err(|_| already_in_a_call())?;
        e.check_usable()?;
        Ok(e)
    }

    /// Runs a collective call even when it moves nothing (the ranks still exchange what they
    /// called), in form `variant` of its collective (0 but for the steps of a hierarchical
    /// call): where it runs through links (every step across nodes does), a peer that runs it
    /// in another form fails the header check (a hierarchical call's forms that must not meet).
    #[inline]
    pub(crate) fn step_as<T: Element>(
        &self,
        bytes: usize,
        validation: Result<()>,
        call: CollectiveCall<T>,
        variant: u8,
    ) -> Result<()> {
        let (c, op) = call.collective();
        if op.is_some() && T::DTYPE.reduced_in() != T::DTYPE {
            return match T::DTYPE.reduced_in() {
                DataType::F32 => self.step_widened::<T, f32>(bytes, validation, call, variant),
                _ => self.step_widened::<T, f64>(bytes, validation, call, variant),
            };
        }
        // SAFETY: the user API built `call` from slices whose lengths it checked (the
        // validation); an invalid rank takes part with no data.
        let through_links =
            |e: &mut ChannelEngine, algo, invalid| unsafe { e.run(&self.core, algo, call, invalid, variant) };
        // SAFETY: as above; the host algorithms run only once the validation passed.
        let on_host = |e: &mut HostEngine, algo| unsafe { run_on_host(e, algo, call) };
        // SAFETY: as above.
        let in_steps = |h: &Hierarchy<Communicator>, validation| unsafe { h.run(call, validation) };
        self.run_planned::<T>(c, op, bytes, validation, through_links, on_host, in_steps)
    }

    /// A reduction of elements carried in a wider type `W` (FP8, see `crate::widen`): the
    /// input widened, the call run on `W`, the result narrowed once.
    fn step_widened<T: Element, W: Element>(
        &self,
        bytes: usize,
        validation: Result<()>,
        call: CollectiveCall<T>,
        variant: u8,
    ) -> Result<()> {
        let valid = validation.is_ok();
        // SAFETY: the user API built `call` from slices whose lengths it checked when valid.
        let Some(wide) = (unsafe { WideHostCall::<W>::new(&call, self.world_size(), self.rank(), valid) }) else {
            return Err(Error::invalid(format!("{} does not reduce: nothing to widen", call.collective().0)));
        };
        let ratio = std::mem::size_of::<W>() / std::mem::size_of::<T>();
        self.step_as::<W>(bytes.saturating_mul(ratio), validation, wide.call, variant)?;
        // SAFETY: validated (the step returned Ok only then): the receive buffer is writable.
        unsafe { wide.narrow_into(&call) };
        Ok(())
    }

    /// The node and rail sub-communicators of hierarchical calls, split at the first one.
    pub(crate) fn hierarchy(&self) -> Result<&Hierarchy<Communicator>> {
        if let Some(h) = self.hierarchy.get() {
            return Ok(h);
        }
        let grid = self.core.topology().node_grid().ok_or_else(|| {
            Error::Unsupported("the hierarchical algorithm needs nodes of equal size holding consecutive ranks".into())
        })?;
        let built = Hierarchy::new(self, grid)?;
        Ok(self.hierarchy.get_or_init(|| Box::new(built)))
    }

    /// Plans a call and runs it, with each executor's part as a closure: the channel
    /// executor's (`engine, algorithm, this rank's arguments invalid`), the host one's and the
    /// hierarchical one's (`hierarchy, this rank's validation`).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_planned<T: Element>(
        &self,
        c: Collective,
        op: Option<ReduceOp>,
        bytes: usize,
        validation: Result<()>,
        through_links: impl FnOnce(&mut ChannelEngine, Algorithm, bool) -> Result<()>,
        f: impl FnOnce(&mut HostEngine, Algorithm) -> Result<()>,
        in_steps: impl FnOnce(&Hierarchy<Communicator>, Result<()>) -> Result<()>,
    ) -> Result<()> {
        let shape = CallShape::host(c, bytes);
        let plan = match self.last_host_plan.get() {
            Some((last, plan)) if last == shape => plan,
            _ => {
                let plan = self.plan(shape)?;
                self.last_host_plan.set(Some((shape, plan)));
                plan
            }
        };
        let algo = plan.algorithm;
        tracing::info!(target: diagnostics::PLAN, rank = self.rank(), "{c} of {bytes} B on {} ranks -> {algo}", self.world_size());
        if plan.executor == Executor::Hierarchical {
            return in_steps(self.hierarchy()?, validation);
        }
        if plan.executor == Executor::HostChannel {
            let mut e = self.channel_engine()?;
            let invalid = validation.is_err();
            let r = through_links(&mut e, algo, invalid);
            return validation.and(r);
        }
        let mut e = self.engine()?;
        match validation {
            Ok(()) => f(&mut e, algo),
            Err(err) => Err(e.fail_step(c.name(), crate::call::signature(c, T::DTYPE, op, algo), err)),
        }
    }
}

/// Runs `call` with the host algorithm `algo`.
///
/// # Safety
/// `call` as the user API builds it: pointers valid for their counts, receive ranges writable,
/// and send and receive ranges overlapping only as the host collective allows (in place).
unsafe fn run_on_host<T: Element>(e: &mut HostEngine, algo: Algorithm, call: CollectiveCall<T>) -> Result<()> {
    // SAFETY: (every arm) forwarded from the caller.
    unsafe {
        match call {
            CollectiveCall::AllReduce { send, recv, count, op } => {
                host::all_reduce(e, algo, Buffers { send, recv, count }, op)
            }
            CollectiveCall::AllGather { send, recv, count } => host::all_gather(e, algo, Buffers { send, recv, count }),
            CollectiveCall::ReduceScatter { send, recv, count, op } => {
                host::reduce_scatter(e, algo, Buffers { send, recv, count }, op)
            }
            CollectiveCall::Broadcast { send, recv, count, root } => {
                host::broadcast(e, algo, Buffers { send, recv, count }, root)
            }
            CollectiveCall::Reduce { send, recv, count, op, root } => {
                host::reduce(e, algo, Buffers { send, recv, count }, op, root)
            }
            CollectiveCall::AllToAll { send, recv, count } => host::all_to_all(e, algo, Buffers { send, recv, count }),
        }
    }
}

// SAFETY: a communicator is not `Sync` only because of the cells of its engines, plan cache and
// step count, which belong to it alone; what it shares with other communicators (bootstrap,
// transports, registries) is `Sync`. So a `&Communicator` used by one thread at a time is sound
// from any thread.
unsafe impl StepRunner for Communicator {
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }

    fn world_size(&self) -> usize {
        Communicator::world_size(self)
    }

    fn split_for_steps(&self, color: usize, key: usize) -> Result<Option<Self>> {
        Communicator::split_for_steps(self, color, key)
    }

    fn count_step(&self) {
        self.steps_run.set(self.steps_run.get() + 1);
    }

    fn step_as<T: Element>(&self, bytes: usize, valid: Result<()>, call: CollectiveCall<T>, variant: u8) -> Result<()> {
        Communicator::step_as(self, bytes, valid, call, variant)
    }

    #[cfg(feature = "cuda")]
    unsafe fn device_step(&self, call: DeviceCall, stream: &Arc<CudaStream>) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.ledgered(call.signature(), || unsafe { self.device_call(call, stream) })
    }
}
