//! Stopping a running job from outside [`launch`](crate::launch): the [`CancelToken`], and
//! [`forward_signals_to`], which turns the signals a launcher binary receives (Ctrl-C) into
//! cancel requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread;

use nix::sys::signal::{SigSet, Signal};

use crate::error::{Error, Result};

/// A request to stop a running [`launch`](crate::launch) from outside it (another thread, a
/// signal handler thread such as [`forward_signals_to`]).
///
/// `cancel(sig)` makes the launcher send `sig` to every running rank's process group, wait up to
/// [`LaunchSpec::cancel_grace`](crate::LaunchSpec::cancel_grace), then `SIGKILL` what is left.
/// A later `cancel` with a different signal is forwarded too (so `cancel(SIGKILL)` after
/// `cancel(SIGINT)` stops everything at once).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicI32>);

impl CancelToken {
    /// A token that has not been cancelled.
    pub fn new() -> Self {
        CancelToken::default()
    }

    /// Asks the launcher to forward `signal` to every rank and stop the job.
    pub fn cancel(&self, signal: Signal) {
        self.0.store(signal as i32, Ordering::SeqCst);
    }

    /// The signal of the latest cancel request, if any.
    pub fn requested(&self) -> Option<Signal> {
        Signal::try_from(self.0.load(Ordering::SeqCst)).ok()
    }
}

/// Blocks `SIGINT`, `SIGTERM` and `SIGHUP` in the calling thread and starts a thread that turns
/// them into cancel requests on `token`: the first signal is forwarded to the ranks as is, any
/// further one becomes `SIGKILL`.
///
/// Meant for launcher binaries (`cargo xtask launch`): the ranks run in their own process
/// groups, so a Ctrl-C on the terminal reaches only the launcher, which must pass it on. Call it
/// from `main` before any other thread starts — threads inherit the blocked set, and a thread
/// that started earlier would still take the signal's default action (ending the launcher and
/// orphaning the ranks). Ranks started through [`launch`](crate::launch) get an empty signal
/// mask again; signals ignored by the launcher (`nohup`, a background job of a shell without job
/// control ignores `SIGINT`) stay ignored in the ranks, so forwarding one of those ends them only
/// after the grace time.
pub fn forward_signals_to(token: &CancelToken) -> Result<()> {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block().map_err(|e| Error::errno("block SIGINT/SIGTERM/SIGHUP with pthread_sigmask", e))?;
    let token = token.clone();
    thread::Builder::new()
        .name("weave-launch-signals".into())
        .spawn(move || {
            let mut seen = false;
            while let Ok(sig) = set.wait() {
                token.cancel(if seen { Signal::SIGKILL } else { sig });
                seen = true;
            }
        })
        .map_err(|e| Error::io("start the launcher's signal-forwarding thread", e))?;
    Ok(())
}
