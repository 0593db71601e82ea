//! Deadlines: the point in time after which a blocking call gives up, and the error it gives
//! up with. A deadline may also be cancellable: a flag that another thread sets ends every wait
//! bounded by it (within [`CANCEL_LOOK`]) as if its time had come, with [`Error::Aborted`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a wait bounded by a cancellable deadline sleeps at most before it looks at the
/// flag again ([`Deadline::next_wait`]).
pub const CANCEL_LOOK: Duration = Duration::from_millis(20);

/// A point in time after which a blocking call gives up, and, where one is given, a flag that
/// makes it give up sooner.
#[derive(Debug, Clone)]
pub struct Deadline {
    start: Instant,
    end: Instant,
    /// Set by whoever cancels the wait (see [`Deadline::cancellable`]).
    cancel: Option<Arc<AtomicBool>>,
}

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        let start = Instant::now();
        let end = start.checked_add(timeout).unwrap_or(start + Duration::from_secs(1 << 30));
        Deadline { start, end, cancel: None }
    }

    /// `timeout` from now, or sooner: as soon as `cancel` is set. Waits bounded by it sleep at
    /// most [`CANCEL_LOOK`] at a time ([`next_wait`](Self::next_wait)) so that they see the flag.
    pub fn cancellable(timeout: Duration, cancel: Arc<AtomicBool>) -> Self {
        Deadline { cancel: Some(cancel), ..Self::after(timeout) }
    }

    /// True once the deadline's flag (if it has one) is set.
    pub fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Acquire))
    }

    /// Time left, zero once passed or cancelled.
    pub fn remaining(&self) -> Duration {
        if self.cancelled() { Duration::ZERO } else { self.end.saturating_duration_since(Instant::now()) }
    }

    /// How long a wait may sleep before it looks at the deadline again: the time left, at most
    /// [`CANCEL_LOOK`] when the deadline is cancellable.
    pub fn next_wait(&self) -> Duration {
        match self.cancel {
            Some(_) => self.remaining().min(CANCEL_LOOK),
            None => self.remaining(),
        }
    }

    /// True once the deadline has passed or was cancelled.
    pub fn expired(&self) -> bool {
        self.cancelled() || Instant::now() >= self.end
    }

    /// Time since the deadline was set.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Why a wait for `operation` on `peer` that this deadline bounds gives up:
    /// [`Error::Aborted`] when it was cancelled, [`Error::Timeout`] otherwise.
    pub fn give_up(&self, operation: impl Into<String>, peer: Option<usize>) -> Error {
        let operation = operation.into();
        if self.cancelled() {
            Error::Aborted(format!("{operation} was cancelled after {:?}", self.elapsed()))
        } else {
            Error::timeout(operation, peer, self.elapsed())
        }
    }

    /// `Err` from [`give_up`](Self::give_up) once the deadline has passed or was cancelled.
    pub fn check(&self, operation: &str, peer: Option<usize>) -> Result<()> {
        if self.expired() { Err(self.give_up(operation, peer)) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_expires() {
        let d = Deadline::after(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(3));
        assert!(d.expired());
        assert!(matches!(d.check("x", Some(2)), Err(Error::Timeout { peer: Some(2), .. })));
        assert!(!Deadline::after(Duration::from_secs(10)).expired());
    }

    #[test]
    fn a_cancelled_deadline_has_passed_and_says_aborted() {
        let flag = Arc::new(AtomicBool::new(false));
        let d = Deadline::cancellable(Duration::from_secs(3600), flag.clone());
        assert!(!d.expired());
        assert!(d.remaining() > Duration::from_secs(3000));
        assert_eq!(d.next_wait(), CANCEL_LOOK, "a cancellable wait looks again soon");
        assert!(d.check("x", None).is_ok());
        flag.store(true, Ordering::Release);
        assert!(d.expired() && d.cancelled());
        assert_eq!(d.remaining(), Duration::ZERO);
        assert!(matches!(d.check("x", Some(1)), Err(Error::Aborted(_))));
        assert!(
            Deadline::after(Duration::from_secs(3600)).next_wait() > CANCEL_LOOK,
            "a plain wait sleeps as long as it may"
        );
    }
}
