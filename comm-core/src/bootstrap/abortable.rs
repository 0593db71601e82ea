//! A bootstrap whose waits end when a communicator is aborted: [`AbortableBootstrap`], the view
//! a communicator's own exchanges in the middle of a call (registrations, a workspace area made
//! at a call, windows) go through, so that an abort from another thread ends them as it ends
//! every other wait of the communicator.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::Bootstrap;
use crate::error::Result;

/// `inner`, with every receive given up once `abort` is set
/// ([`Bootstrap::recv_or_abort`]); its all-gathers, broadcasts and barriers are the trait's
/// tree algorithms over those receives. Everything else is `inner`'s.
pub struct AbortableBootstrap<'a> {
    inner: &'a dyn Bootstrap,
    abort: &'a AtomicBool,
}

impl<'a> AbortableBootstrap<'a> {
    /// `inner` whose receives give up once `abort` is set.
    pub fn new(inner: &'a dyn Bootstrap, abort: &'a AtomicBool) -> Self {
        AbortableBootstrap { inner, abort }
    }
}

impl Bootstrap for AbortableBootstrap<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn peer_lost(&self, peer: usize) -> Option<String> {
        self.inner.peer_lost(peer)
    }

    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }

    fn local_world_size(&self) -> usize {
        self.inner.local_world_size()
    }

    fn job_key(&self) -> String {
        self.inner.job_key()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.inner.send(peer, tag, data)
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.inner.recv_or_abort(peer, tag, self.abort)
    }

    fn recv_or_abort(&self, peer: usize, tag: u64, abort: &AtomicBool) -> Result<Vec<u8>> {
        self.inner.recv_or_abort(peer, tag, abort)
    }

    fn send_notice(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.inner.send_notice(peer, data)
    }

    fn carries_notices(&self) -> bool {
        self.inner.carries_notices()
    }

    fn recv_notice(&self, timeout: Duration) -> Result<Option<(usize, Vec<u8>)>> {
        self.inner.recv_notice(timeout)
    }
}
