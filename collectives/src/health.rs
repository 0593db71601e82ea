//! Whether an executor of a communicator can still be used.
//!
//! A failure that may leave the ranks out of step — a timeout, a lost peer, an abort, a
//! protocol error — breaks the executor for good: later calls fail at once, saying why, instead
//! of pairing with the wrong messages of their peers. Invalid arguments do not: every rank
//! finished the call and agrees on the error.

use comm_core::{Error, Result};

/// An executor's health: broken once, with the reason, or usable.
#[derive(Debug, Default)]
pub(crate) struct Health {
    broken: Option<String>,
}

impl Health {
    /// Errors if an earlier failure broke the communicator.
    #[inline(always)]
    pub(crate) fn check(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(unusable(why)),
            None => Ok(()),
        }
    }

    /// Records `e` when it leaves the ranks out of step, and hands it back.
    pub(crate) fn poison(&mut self, e: Error) -> Error {
        if e.is_fatal() && self.broken.is_none() {
            self.broken = Some(e.to_string());
        }
        e
    }
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
        let mut h = Health::default();
        let _ = h.poison(Error::invalid("bad count"));
        h.check().unwrap();
        let _ = h.poison(Error::peer_lost(3, "wait", "gone"));
        let _ = h.poison(Error::protocol("later"));
        let e = h.check().unwrap_err();
        assert!(matches!(e, Error::Aborted(ref m) if m.contains("rank 3")), "{e}");
    }
}
