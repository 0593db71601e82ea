//! A communicator made on a thread of its own (a non-blocking config, or an init inside a
//! group), and the flag that calls it off: [`BackgroundInit`].
//!
//! `ncclCommAbort` of a communicator still being made sets the flag. The init's waits look at
//! it (the bootstrap's rendezvous, the communicator's first exchanges: see
//! [`TcpBootstrap::with_roots_cancellable`](comm_core::bootstrap::TcpBootstrap::with_roots_cancellable)
//! and [`collectives::Builder::with_abort_flag`]), so the init ends within milliseconds and
//! closes what it opened (the root's listening port, links, its threads) before the abort
//! returns, instead of waiting for peers that may never come until `WEAVE_TIMEOUT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use collectives::Communicator;

use crate::abi::NcclResult;
use crate::error::Fail;

/// How often [`BackgroundInit::call_off`] looks whether the init's thread has ended.
const CALL_OFF_NAP: Duration = Duration::from_millis(1);

/// An init running on its own thread, and the flag that calls it off.
pub struct BackgroundInit {
    thread: JoinHandle<Result<Communicator, Fail>>,
    cancel: Arc<AtomicBool>,
}

impl BackgroundInit {
    /// Runs `init` on a thread named after `rank`, handing it the flag that
    /// [`call_off`](Self::call_off) sets: `init` gives up with an error once it is set.
    pub fn start(
        rank: usize,
        init: impl FnOnce(Arc<AtomicBool>) -> Result<Communicator, Fail> + Send + 'static,
    ) -> Result<Self, Fail> {
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let thread = std::thread::Builder::new()
            .name(format!("weave-nccl-init-{rank}"))
            .spawn(move || init(flag))
            .map_err(|e| Fail::new(NcclResult::SYSTEM_ERROR, format!("start the init thread: {e}")))?;
        Ok(BackgroundInit { thread, cancel })
    }

    /// Whether the init is over (made, or failed).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Calls the init off and waits at most `bound` for its thread to end; true once it has
    /// (its outcome is then [`join`](Self::join)'s, at once).
    pub fn call_off(&self, bound: Duration) -> bool {
        self.cancel.store(true, Ordering::Release);
        let started = Instant::now();
        while !self.thread.is_finished() {
            if started.elapsed() >= bound {
                return false;
            }
            std::thread::sleep(CALL_OFF_NAP);
        }
        true
    }

    /// The communicator the init made, or why it failed (waits for the init to end: call it
    /// once [`is_finished`](Self::is_finished)).
    pub fn join(self) -> Result<Communicator, Fail> {
        self.thread.join().unwrap_or_else(|_| {
            Err(Fail::new(NcclResult::INTERNAL_ERROR, "communicator init panicked; please report it"))
        })
    }
}
