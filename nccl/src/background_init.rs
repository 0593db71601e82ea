//! A communicator made on a thread of its own (a non-blocking config, or an init inside a
//! group), and the flag that calls it off: [`BackgroundInit`].
//!
//! `ncclCommAbort` of a communicator still being made sets the flag. The init's waits look at
//! it (the bootstrap's rendezvous, the communicator's first exchanges: see
//! [`TcpBootstrap::with_roots_cancellable`](comm_core::bootstrap::TcpBootstrap::with_roots_cancellable)
//! and [`collectives::Builder::with_cancel_flag`]), so an init waiting for peers that may never
//! come ends within milliseconds, and closes what it opened (the root's listening port, links,
//! its threads) before the abort returns, instead of waiting until `WEAVE_TIMEOUT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use collectives::Communicator;

use crate::abi::NcclResult;
use crate::error::Fail;

/// How often [`InitEnd::wait`] looks whether the init has ended.
const CALL_OFF_NAP: Duration = Duration::from_millis(1);

/// An init running on its own thread, and the flag that calls it off.
pub struct BackgroundInit {
    thread: JoinHandle<Result<Communicator, Fail>>,
    cancel: Arc<AtomicBool>,
    /// Set by the thread once the init has returned and dropped what it made on the way.
    ended: Arc<AtomicBool>,
}

/// Sets its flag when dropped: at the end of the init's thread, panicking or not.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Whether a called-off init has ended ([`BackgroundInit::call_off`]), to wait on without the
/// handle's state.
pub struct InitEnd(Arc<AtomicBool>);

impl InitEnd {
    /// Waits at most `bound` for the init to end; true once it has.
    pub fn wait(&self, bound: Duration) -> bool {
        let started = Instant::now();
        while !self.0.load(Ordering::Acquire) {
            if started.elapsed() >= bound {
                return false;
            }
            std::thread::sleep(CALL_OFF_NAP);
        }
        true
    }
}

impl BackgroundInit {
    /// Runs `init` on a thread named after `rank`, handing it the flag that
    /// [`call_off`](Self::call_off) sets: `init` gives up with an error once it is set.
    pub fn start(
        rank: usize,
        init: impl FnOnce(Arc<AtomicBool>) -> Result<Communicator, Fail> + Send + 'static,
    ) -> Result<Self, Fail> {
        let cancel = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let (flag, end) = (cancel.clone(), SetOnDrop(ended.clone()));
        let thread = std::thread::Builder::new()
            .name(format!("weave-nccl-init-{rank}"))
            .spawn(move || {
                let _end = end;
                init(flag)
            })
            .map_err(|e| Fail::new(NcclResult::SYSTEM_ERROR, format!("start the init thread: {e}")))?;
        Ok(BackgroundInit { thread, cancel, ended })
    }

    /// Whether the init is over (made, or failed): [`join`](Self::join) then returns at once.
    pub fn is_finished(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Calls the init off: its waits give up within milliseconds. The [`InitEnd`] returned
    /// says when it has ended (its outcome is then [`join`](Self::join)'s at once), so that the
    /// caller may wait for it without holding the handle's lock.
    pub fn call_off(&self) -> InitEnd {
        self.cancel.store(true, Ordering::Release);
        InitEnd(self.ended.clone())
    }

    /// The communicator the init made, or why it failed (waits for the init to end: call it
    /// once [`is_finished`](Self::is_finished), when only the thread's last instructions are
    /// left).
    pub fn join(self) -> Result<Communicator, Fail> {
        self.thread.join().unwrap_or_else(|_| {
            Err(Fail::new(NcclResult::INTERNAL_ERROR, "communicator init panicked; please report it"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An init that waits for its call-off (a minute at the most), then fails as the real one does.
    fn waits_for_call_off(cancel: Arc<AtomicBool>) -> Result<Communicator, Fail> {
        let started = Instant::now();
        while !cancel.load(Ordering::Acquire) && started.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(Fail::new(NcclResult::SYSTEM_ERROR, "called off"))
    }

    #[test]
    fn a_called_off_init_ends_and_says_why() {
        let init = BackgroundInit::start(0, waits_for_call_off).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!init.is_finished(), "the init ended before it was called off");
        let started = Instant::now();
        assert!(init.call_off().wait(Duration::from_secs(5)), "the init did not end once called off");
        assert!(started.elapsed() < Duration::from_secs(1), "the call-off took {:?}", started.elapsed());
        assert!(init.is_finished());
        let outcome = init.join();
        assert!(matches!(&outcome, Err(f) if f.message.contains("called off")), "{:?}", outcome.err());
    }

    #[test]
    fn an_init_that_does_not_end_in_time_is_reported_so() {
        // An init that ignores its flag for a while (a CUDA call): the wait gives up first.
        let init = BackgroundInit::start(1, |_| {
            std::thread::sleep(Duration::from_millis(300));
            Err(Fail::new(NcclResult::SYSTEM_ERROR, "late"))
        })
        .unwrap();
        assert!(!init.call_off().wait(Duration::from_millis(20)), "the wait did not give up");
        assert!(!init.is_finished());
        assert!(init.call_off().wait(Duration::from_secs(5)), "the init never ended");
    }

    #[test]
    fn an_init_that_panics_ends_and_fails() {
        let init = BackgroundInit::start(2, |_| panic!("a bug in the init")).unwrap();
        assert!(init.call_off().wait(Duration::from_secs(5)), "a panicking init never ended");
        let outcome = init.join();
        assert!(matches!(&outcome, Err(f) if f.code == NcclResult::INTERNAL_ERROR), "{:?}", outcome.err());
    }
}
