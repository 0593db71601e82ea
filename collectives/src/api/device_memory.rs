//! The GPU memory a communicator holds, and releasing it while the communicator is idle:
//! [`DeviceMemory`], [`Communicator::device_memory`], [`Communicator::suspend_device_memory`] and
//! [`Communicator::resume_device_memory`] (NCCL's `ncclCommMemStats`, `ncclCommSuspend` and
//! `ncclCommResume`).
//!
//! A communicator allocates device memory when a call first needs it: the direct kernels'
//! control area (flags, LL packets, point-to-point mailboxes) with the communicator where it has
//! peers, each larger area (data slots, pipelined slots, LL128 lines) at the first call whose
//! kernel uses it, the channel family's links at the first call to each peer, the hierarchical
//! calls' staging at the first such call. What it holds is what its calls so far needed.

#[cfg(feature = "cuda")]
use comm_core::Error;
use comm_core::Result;
#[cfg(feature = "cuda")]
use comm_core::bootstrap::Bootstrap as _;

use crate::api::communicator::Communicator;

/// The GPU memory a communicator holds on its rank's device, in bytes
/// ([`Communicator::device_memory`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// What [`Communicator::suspend_device_memory`] releases: the direct kernels' workspace areas
    /// and the hierarchical calls' staging (0 while suspended).
    pub releasable: usize,
    /// What stays while suspended: the channel family's links, link table and scratch.
    pub persistent: usize,
    /// Whether the releasable memory is released until [`Communicator::resume_device_memory`].
    pub suspended: bool,
}

impl DeviceMemory {
    /// Every byte held.
    pub fn total(&self) -> usize {
        self.releasable + self.persistent
    }

    fn add(self, other: DeviceMemory) -> DeviceMemory {
        DeviceMemory {
            releasable: self.releasable + other.releasable,
            persistent: self.persistent + other.persistent,
            suspended: self.suspended,
        }
    }
}

impl Communicator {
    /// The GPU memory this communicator holds on this rank's device (its node and rail
    /// sub-communicators' included): all zero without a GPU path. Local and cheap.
    pub fn device_memory(&self) -> DeviceMemory {
        #[cfg(feature = "cuda")]
        let own = match self.gpu.as_ref().and_then(|g| g.try_borrow().ok()) {
            Some(g) => {
                let (releasable, persistent) = g.memory();
                DeviceMemory { releasable, persistent, suspended: g.is_suspended() }
            }
            None => DeviceMemory::default(),
        };
        #[cfg(not(feature = "cuda"))]
        let own = DeviceMemory::default();
        match self.hierarchy.get() {
            Some(h) => own.add(h.intra().device_memory()).add(h.rail().device_memory()),
            None => own,
        }
    }

    /// Collective: releases the GPU memory [`DeviceMemory::releasable`] counts on every rank,
    /// while the communicator is idle (host calls still run; device calls are refused until
    /// [`resume_device_memory`](Self::resume_device_memory)).
    ///
    /// Every rank calls it. It waits for the GPU work this rank's context queued (device calls
    /// of every communicator on this GPU, whose waits the timeouts bound), then for every rank to
    /// get this far (within the communicator's timeout), so no kernel anywhere still uses the
    /// memory when it goes. Without a GPU path it does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when already suspended; a CUDA error from the wait; a timeout or
    /// lost peer from the agreement (nothing is released then).
    pub fn suspend_device_memory(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(gpu) = self.gpu.as_ref() {
            let mut g = gpu.try_borrow_mut().map_err(|_| crate::call::already_in_a_call())?;
            if g.is_suspended() {
                return Err(Error::invalid(
                    "suspend_device_memory: this communicator's GPU memory is already suspended; resume it first",
                ));
            }
            g.synchronize()?;
            self.core().abortable_bootstrap().barrier()?;
            g.suspend();
            drop(g);
            self.on_step_communicators(Communicator::suspend_device_memory)?;
            tracing::info!(target: comm_core::diagnostics::INIT, rank = self.rank(), "GPU memory suspended");
        }
        Ok(())
    }

    /// Collective: ends [`suspend_device_memory`](Self::suspend_device_memory) on every rank; the
    /// control area is made again (where there are peers), the other areas at the first calls
    /// that need them. Without a GPU path it does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when not suspended; a CUDA error when the control area cannot
    /// be allocated on some rank (the communicator stays usable: call again); a timeout or lost
    /// peer from the exchange.
    pub fn resume_device_memory(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(gpu) = self.gpu.as_ref() {
            let mut g = gpu.try_borrow_mut().map_err(|_| crate::call::already_in_a_call())?;
            if !g.is_suspended() {
                return Err(Error::invalid("resume_device_memory: this communicator's GPU memory is not suspended"));
            }
            g.resume(self.core())?;
            drop(g);
            self.on_step_communicators(Communicator::resume_device_memory)?;
            tracing::info!(target: comm_core::diagnostics::INIT, rank = self.rank(), "GPU memory resumed");
        }
        Ok(())
    }

    /// Runs `f` on the node and rail communicators of hierarchical calls, where a call made them
    /// (every rank of this communicator is in one of each, so every rank's `f` is matched).
    #[cfg(feature = "cuda")]
    fn on_step_communicators(&self, f: impl Fn(&Communicator) -> Result<()>) -> Result<()> {
        if let Some(h) = self.hierarchy.get() {
            f(h.intra())?;
            f(h.rail())?;
        }
        Ok(())
    }
}
