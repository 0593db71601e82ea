//! Deadlines: the point in time after which a blocking call gives up, and the error it gives
//! up with.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A point in time after which a blocking call gives up.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Instant,
    end: Instant,
}

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        let start = Instant::now();
        let end = start.checked_add(timeout).unwrap_or(start + Duration::from_secs(1 << 30));
        Deadline { start, end }
    }

    /// Time left, zero once passed.
    pub fn remaining(&self) -> Duration {
        self.end.saturating_duration_since(Instant::now())
    }

    /// True once the deadline has passed.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.end
    }

    /// Time since the deadline was set.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// `Err(Error::Timeout)` naming `operation` and `peer` once the deadline has passed.
    pub fn check(&self, operation: &str, peer: Option<usize>) -> Result<()> {
        if self.expired() { Err(Error::timeout(operation, peer, self.elapsed())) } else { Ok(()) }
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
}
