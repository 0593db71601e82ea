//! Whether an executor of a communicator can still be used.
//!
//! A failure that may leave the ranks out of step — a timeout, a lost peer, an abort, a
//! protocol error — breaks the executor for good: later calls fail at once, saying why, instead
//! of pairing with the wrong messages of their peers. Invalid arguments do not: every rank
//! finished the call and agrees on the error.

use std::sync::Arc;

use comm_core::resilience::Resilience;
use comm_core::{Error, Result};

/// An executor's health: broken once, with the reason, or usable; and whether its communicator
/// was revoked.
#[derive(Debug)]
pub(crate) struct Health {
    broken: Option<String>,
    revocation: Arc<Resilience>,
}

impl Health {
    /// The health of an executor of the communicator that `revocation` is the state of.
    pub(crate) fn new(revocation: Arc<Resilience>) -> Self {
        Health { broken: None, revocation }
    }

    /// Errors if the communicator was revoked or an earlier failure broke it.
    #[inline(always)]
    pub(crate) fn check(&self) -> Result<()> {
        if self.revocation.is_revoked() {
            return Err(if self.revocation.is_retired() { retired() } else { revoked() });
        }
        match &self.broken {
            Some(why) => Err(unusable(why)),
            None => Ok(()),
        }
    }

    /// Whether an earlier failure broke the executor (a revocation aside).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Records `e` when it leaves the ranks out of step, and hands it back — as
    /// [`Error::Revoked`] when the communicator was revoked meanwhile (whatever the revocation
    /// cut short: a wait, a peer's half-finished registration), except a rejected argument or
    /// a protocol error (a finding of this rank's, not something the revocation cut short).
    pub(crate) fn poison(&mut self, e: Error) -> Error {
        // A protocol error is this rank's own finding (ranks out of step), which the revocation
        // it caused must not hide.
        let e = if self.revocation.is_revoked() && !matches!(e, Error::InvalidArgument(_) | Error::Protocol(_)) {
            revoked_during(&e)
        } else {
            e
        };
        if e.is_fatal() && self.broken.is_none() {
            self.broken = Some(e.to_string());
        }
        e
    }
}

/// The error of a call on a revoked communicator.
#[cold]
#[inline(never)]
pub(crate) fn revoked() -> Error {
    Error::Revoked(
        "this communicator was revoked (by a rank of it): its calls fail; shrink it (Communicator::shrink, after \
         agree_on_failed) to go on"
            .into(),
    )
}

/// The error of a call on a communicator that a shrink took over.
#[cold]
#[inline(never)]
pub(crate) fn retired() -> Error {
    Error::Revoked(
        "this communicator was shrunk: the shrunk communicator took over what it held, so its own calls fail; make \
         them on the shrunk one"
            .into(),
    )
}

/// The error of a call that a revocation cut short, with what it stopped.
#[cold]
#[inline(never)]
pub(crate) fn revoked_during(cause: &Error) -> Error {
    Error::Revoked(format!(
        "this communicator was revoked (by a rank of it) during the call, which stopped with: {cause}; shrink it \
         (Communicator::shrink, after agree_on_failed) to go on"
    ))
}

/// The error of a call on a broken executor, out of the way of every call's fast path.
#[cold]
#[inline(never)]
fn unusable(why: &str) -> Error {
    Error::Aborted(format!("this communicator is unusable after an earlier failure ({why}); create a new one"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_that_leave_ranks_out_of_step_break_it() {
        let mut h = unrevoked();
        let _ = h.poison(Error::invalid("bad count"));
        h.check().unwrap();
        let _ = h.poison(Error::peer_lost(3, "wait", "gone"));
        let _ = h.poison(Error::protocol("later"));
        let e = h.check().unwrap_err();
        assert!(matches!(e, Error::Aborted(ref m) if m.contains("rank 3")), "{e}");
    }

    /// The health of a lone rank's communicator that nobody revoked.
    fn unrevoked() -> Health {
        let b: Arc<dyn comm_core::bootstrap::Bootstrap> =
            Arc::new(comm_core::loopback::LoopbackBootstrap::group(1, std::time::Duration::from_secs(1)).remove(0));
        let abort = Arc::new(std::sync::atomic::AtomicBool::new(false));
        Health::new(Resilience::new(0, vec![0], 0, b, abort))
    }

    #[test]
    fn a_revoked_communicator_fails_every_call_with_revoked() {
        let mut h = unrevoked();
        h.check().unwrap();
        h.revocation.revoke();
        assert!(matches!(h.check(), Err(Error::Revoked(_))));
        assert!(
            matches!(h.poison(Error::Aborted("a wait was aborted".into())), Error::Revoked(_)),
            "the stop is told as a revocation"
        );
        assert!(matches!(h.poison(Error::invalid("bad count")), Error::InvalidArgument(_)));
    }
}
