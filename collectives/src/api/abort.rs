//! Stopping a communicator from another thread: [`AbortHandle`], cheap to clone, which may
//! outlive its communicator.

use std::sync::Weak;

use comm_core::resilience::Resilience;

/// Aborts a [`Communicator`](crate::Communicator) from any thread: every current and future wait of it fails with
/// [`Error::Aborted`](comm_core::Error::Aborted), and its running GPU kernels stop. Cheap to clone.
///
/// It acts through the communicator's [`Resilience`]: once the communicator is gone, or
/// retired by a shrink that carried its transports over, aborting it does nothing — the shrunk
/// communicator, which shares the transports' abort flag, goes on.
#[derive(Clone)]
pub struct AbortHandle {
    /// Weak: a handle that outlives its communicator keeps nothing of it alive.
    resilience: Weak<Resilience>,
    #[cfg(feature = "cuda")]
    gpu: Option<std::sync::Arc<weave_cuda::DeviceStatus>>,
}

impl AbortHandle {
    /// The handle of the communicator that `resilience` serves, with its GPU engine's status
    /// words `gpu`.
    pub(crate) fn new(
        resilience: Weak<Resilience>,
        #[cfg(feature = "cuda")] gpu: Option<std::sync::Arc<weave_cuda::DeviceStatus>>,
    ) -> Self {
        AbortHandle {
            resilience,
            #[cfg(feature = "cuda")]
            gpu,
        }
    }

    /// Aborts the communicator (idempotent).
    pub fn abort(&self) {
        if let Some(r) = self.resilience.upgrade() {
            r.abort();
        }
        #[cfg(feature = "cuda")]
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
        f.debug_struct("AbortHandle").field("alive", &(self.resilience.strong_count() > 0)).finish()
    }
}
