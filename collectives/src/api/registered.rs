//! Registered buffers: device memory one rank registers with a communicator on its own
//! ([`Communicator::register_device`]; NCCL's `ncclCommRegister`), so that device all-reduces on
//! buffers inside it read and write the peers' memory in place instead of copying through the
//! workspace ([`DeviceRegistration`]).
//!
//! Unlike a [window](crate::Window), a registration is local (no peer takes part, ranks may
//! register different memory at different times, offsets differ between ranks), and the rule
//! is NCCL's: a call uses registered memory when its input and output both lie in
//! registrations of its communicator, and when one rank's call does, every rank's must. A
//! call whose ranks disagree fails with a call mismatch on the ranks that passed registered
//! buffers (the rest wait until their timeout), never with wrong data read in place.
//!
//! The first call on a registration asks every peer's transport to map it (their own thread
//! answers, so the peers need not be in a call); later calls reuse the mappings, and
//! [`Communicator::deregister_device`] ends them.

use std::sync::Arc;

use comm_core::memory::MemoryKind;
use comm_core::{Error, Result};

use crate::api::communicator::Communicator;
use crate::exec::no_gpu;
use crate::gpu::{RegistrationState, UserRange};

/// Device memory this rank registered with one communicator (see the module doc). Keep it while
/// calls use it; [`Communicator::deregister_device`] ends it. Dropping it without deregistering
/// keeps the registration until the communicator goes.
#[derive(Clone)]
pub struct DeviceRegistration {
    state: Arc<RegistrationState>,
}

impl std::fmt::Debug for DeviceRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.range.debug("DeviceRegistration", self.zero_copy(), f)
    }
}

impl DeviceRegistration {
    /// The registered memory's device address.
    pub fn address(&self) -> u64 {
        self.state.range.address
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.state.range.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.state.range.len == 0
    }

    /// Whether calls on it read and write peers' memory in place: the direct kernels run (every
    /// peer's GPU reached through CUDA IPC, at most 8) and the transport could register it.
    /// Otherwise the registration is kept and calls copy as on any memory.
    pub fn zero_copy(&self) -> bool {
        self.state.memory.is_some()
    }

    /// Errors unless `comm` made this registration.
    pub fn check_owner(&self, comm: &Communicator) -> Result<()> {
        self.state.range.check_owner(comm.core().id(), "registration")
    }
}

impl Communicator {
    /// Local: registers `len` bytes of this rank's device memory at `address` with this
    /// communicator, so that device all-reduces whose input and output lie in registrations read
    /// and write the peers' memory in place (see the module doc for the rule every rank
    /// follows). Where the direct kernels do not run, the registration is kept and calls copy
    /// ([`DeviceRegistration::zero_copy`] says which).
    ///
    /// The memory must come from `cudaMalloc`/`cuMemAlloc` (or libnccl's `ncclMemAlloc`), not a
    /// stream-ordered pool (`cudaMallocAsync`, cudarc's `CudaSlice`): peers map it with a CUDA
    /// IPC handle; such memory is [`Error::Unsupported`].
    ///
    /// # Safety
    /// `[address, address + len)` is device memory of this rank's GPU that stays allocated until
    /// the registration is ended ([`deregister_device`](Self::deregister_device)) or the
    /// communicator dropped.
    pub unsafe fn register_device(&self, address: u64, len: usize) -> Result<DeviceRegistration> {
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let mut g = gpu.try_borrow_mut().map_err(|_| crate::call::already_in_a_call())?;
        if address == 0 || len == 0 {
            return Err(Error::invalid(format!("register_device: [{address:#x}, +{len}) is no memory")));
        }
        let memory = if g.maps_every_peer() {
            let label = format!("weave registration #{}", g.registrations.len());
            Some(self.core().register_existing_private(address, len, MemoryKind::Device(g.device), &label)?)
        } else {
            None
        };
        let range = UserRange { communicator: self.core().id(), address, len };
        let state = Arc::new(RegistrationState { range, memory });
        g.registrations.add(state.clone());
        Ok(DeviceRegistration { state })
    }

    /// Local: ends `registration` on this rank, after the GPU work queued on this rank's GPU
    /// finished (every call that used it, the peers' part included, is then over), and asks
    /// every peer that mapped it to unmap it. The memory is the caller's again when this returns.
    /// A peer that cannot be asked (its communicator ended already, as happens when ranks tear
    /// down at their own pace) keeps nothing that matters: its mapping went with its
    /// communicator, or goes when that ends; this is logged, not an error.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when another communicator made it, or it was ended already; a
    /// CUDA error from the wait.
    pub fn deregister_device(&self, registration: DeviceRegistration) -> Result<()> {
        registration.check_owner(self)?;
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let mut g = gpu.try_borrow_mut().map_err(|_| crate::call::already_in_a_call())?;
        g.synchronize()?;
        let Some(mapped) = g.registrations.remove(&registration.state) else {
            return Err(Error::invalid(format!(
                "deregister_device: the registration of {:#x} was ended already",
                registration.state.range.address
            )));
        };
        drop(g);
        if let Some(memory) = &registration.state.memory {
            for peer in (0..mapped.len()).filter(|&p| p != self.rank()) {
                if let Err(e) = self.core().unmap_at_peer(memory, peer) {
                    tracing::info!(
                        target: comm_core::diagnostics::INIT,
                        rank = self.rank(),
                        "deregister_device: rank {peer} could not be asked to unmap {:#x} (it keeps its mapping \
                         until its communicator ends): {e}",
                        registration.state.range.address
                    );
                }
            }
        }
        Ok(())
    }
}
