//! Stopping a communicator from another thread: [`AbortHandle`], cheap to clone, which may
//! outlive its communicator.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

use comm_core::resilience::Resilience;

/// Aborts a [`Communicator`](crate::Communicator) from any thread: every current and future wait of it fails with
/// [`Error::Aborted`](comm_core::Error::Aborted), and its running GPU kernels stop. Cheap to clone.
#[derive(Clone)]
pub struct AbortHandle {
    flag: Arc<AtomicBool>,
    /// Weak: a handle that outlives its communicator keeps nothing of it alive.
    resilience: Weak<Resilience>,
    #[cfg(feature = "cudaipc")]
    gpu: Option<Arc<weave_cuda::DeviceStatus>>,
}

impl AbortHandle {
    /// The handle of a communicator whose waits watch `flag`, revoked through `resilience`, with
    /// its GPU engine's status words `gpu`.
    pub(crate) fn new(
        flag: Arc<AtomicBool>,
        resilience: Weak<Resilience>,
        #[cfg(feature = "cudaipc")] gpu: Option<Arc<weave_cuda::DeviceStatus>>,
    ) -> Self {
        AbortHandle {
            flag,
            resilience,
            #[cfg(feature = "cudaipc")]
            gpu,
        }
    }

    /// Aborts the communicator (idempotent).
    pub fn abort(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::Release);
        #[cfg(feature = "cudaipc")]
        if let Some(status) = &self.gpu {
            status.abort();
        }
    }

    /// Revokes the communicator, as [`Communicator::revoke`](crate::Communicator::revoke) does (nothing once the
    /// communicator is gone).
    pub fn revoke(&self) {
        if let Some(r) = self.resilience.upgrade() {
            r.revoke();
        }
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle").field("aborted", &self.flag.load(std::sync::atomic::Ordering::Acquire)).finish()
    }
}
