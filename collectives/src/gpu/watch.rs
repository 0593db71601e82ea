//! The GPU peer watch: a thread that notices within milliseconds that a peer process died and
//! sets this rank's device abort word, so every kernel waiting for that peer leaves at once
//! instead of spinning until `WEAVE_TIMEOUT`. The next
//! [`check_gpu`](crate::Communicator::check_gpu) then reports [`Error::PeerLost`] naming the
//! rank. The host path learns of the same death through its connections' peer checks; kernels
//! cannot make system calls, so this thread makes them on their behalf.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use comm_core::connection::Connection;
use comm_core::{Error, Result};
use weave_cuda::DeviceStatus;

/// How often the watch asks whether the peers live.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The watch thread of one communicator's GPU engine; stopped and joined on drop.
pub(crate) struct GpuPeerWatch {
    stop: Arc<AtomicBool>,
    lost: Arc<Mutex<Option<(usize, String)>>>,
    thread: Option<JoinHandle<()>>,
}

impl GpuPeerWatch {
    /// Watches the peers at the other end of `connections`; aborts `status` when one is lost.
    pub(crate) fn start(connections: Vec<Arc<dyn Connection>>, status: Arc<DeviceStatus>) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(Mutex::new(None));
        let (stop2, lost2) = (stop.clone(), lost.clone());
        let thread = std::thread::Builder::new()
            .name("weave-gpu-watch".into())
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    if let Some((peer, why)) = connections.iter().find_map(|c| {
                        c.check_peer()
                            .err()
                            .filter(|e| matches!(e, Error::PeerLost { .. }))
                            .map(|e| (c.peer(), e.to_string()))
                    }) {
                        *lost2.lock().unwrap_or_else(|p| p.into_inner()) = Some((peer, why));
                        status.abort();
                        return;
                    }
                    std::thread::sleep(POLL_INTERVAL);
                }
            })
            .map_err(|e| Error::io("spawn the GPU peer watch", e))?;
        Ok(GpuPeerWatch { stop, lost, thread: Some(thread) })
    }

    /// The peer found dead, with why, once the watch aborted the kernels for it.
    pub(crate) fn lost(&self) -> Option<(usize, String)> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for GpuPeerWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
