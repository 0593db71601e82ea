//! Bounded spin-waits: every spin in weave checks a deadline, an abort flag and the peer's
//! health, and returns an error instead of waiting forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::Deadline;
use crate::error::{Error, Result};

/// How long a waiter spins before it starts yielding its core. Measured in time, not
/// iterations: a `spin_loop` hint costs ~10 ns on some CPUs, and when two ranks share a core,
/// every microsecond spent spinning is a microsecond the peer cannot run.
const SPIN_BUDGET: std::time::Duration = std::time::Duration::from_micros(3);

/// Set when this host runs more ranks than it has cores: spinning then only delays the rank
/// that holds the core we wait for, so waiters yield at once.
static OVERSUBSCRIBED: AtomicBool = AtomicBool::new(false);

/// Tells every wait in this process whether ranks outnumber cores on this host.
pub fn set_oversubscribed(oversubscribed: bool) {
    OVERSUBSCRIBED.store(oversubscribed, Ordering::Relaxed);
}

/// Tells every wait in this process how many ranks run on this host: they outnumber its cores
/// when there are more of them than [`host_cpus`].
pub fn set_local_ranks(local_ranks: usize) {
    set_oversubscribed(local_ranks > host_cpus());
}

/// CPUs online on this host (`/sys/devices/system/cpu/online`), not this thread's affinity
/// mask: a rank pinned to one CPU still shares the host with peers pinned to the others, and
/// they do not outnumber the cores. Falls back to the affinity mask where sysfs is unreadable.
pub fn host_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| count_cpu_list(s.trim()))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of CPUs in a kernel CPU list such as `0-3,8,10-11`; `None` if malformed.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    (n > 0).then_some(n)
}

/// Waiting politely: spin for a few microseconds (the common case: the peer is running on
/// another core and answers quickly), then yield the core on every call (the peer may need it).
/// The clock is first read after 32 spins, so a wait that ends sooner costs no clock read.
#[derive(Debug)]
pub struct Backoff {
    start: Option<std::time::Instant>,
    calls: u32,
    yielding: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// A fresh backoff (spinning first, unless ranks outnumber cores).
    pub fn new() -> Self {
        Backoff { start: None, calls: 0, yielding: OVERSUBSCRIBED.load(Ordering::Relaxed) }
    }

    /// Waits a little: a spin hint while within the budget, a yield after.
    pub fn snooze(&mut self) {
        self.calls = self.calls.wrapping_add(1);
        if self.yielding {
            std::thread::yield_now();
            return;
        }
        std::hint::spin_loop();
        if self.calls.is_multiple_of(32) {
            match self.start {
                None => self.start = Some(std::time::Instant::now()),
                Some(start) if start.elapsed() > SPIN_BUDGET => self.yielding = true,
                Some(_) => {}
            }
        }
    }

    /// Starts spinning again (after progress).
    pub fn reset(&mut self) {
        *self = Backoff::new();
    }
}
/// Iterations between checks of the deadline, abort flag and peer health.
const CHECK_EVERY: u32 = 128;

/// What a wait needs besides its condition.
pub struct WaitContext<'a> {
    /// What is being waited for, for the error message.
    pub operation: &'a str,
    /// The peer that should make the condition true, if any.
    pub peer: Option<usize>,
    /// How long to wait at most.
    pub timeout: Duration,
    /// Set to stop the wait early with [`Error::Aborted`].
    pub abort: &'a AtomicBool,
    /// Returns an error once the peer is known to be gone; called now and then.
    pub check_peer: &'a dyn Fn() -> Result<()>,
}

/// Spins until `ready()` is true; errors on timeout, abort or a lost peer. The timeout counts
/// from the first check, 128 iterations in: a short wait reads no clock.
pub fn spin_until(ctx: &WaitContext<'_>, ready: impl FnMut() -> bool) -> Result<()> {
    spin_until_progress(ctx, &|| Ok(()), ready)
}

/// [`spin_until`] for a condition that `progress` helps come true: it is called before every
/// look at `ready()` after the first, and must not block (a connection's
/// [`progress`](crate::connection::Connection::progress): the waiter applies the peer's
/// incoming messages itself). Its error ends the wait like a lost peer: after one last look at
/// `ready()`, since what the peer did before failing may be just what we wait for.
pub fn spin_until_progress(
    ctx: &WaitContext<'_>,
    progress: &dyn Fn() -> Result<()>,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    let mut deadline: Option<Deadline> = None;
    let mut backoff = Backoff::new();
    let mut i: u32 = 0;
    loop {
        if let Err(e) = progress() {
            return if ready() { Ok(()) } else { Err(e) };
        }
        if ready() {
            return Ok(());
        }
        i = i.wrapping_add(1);
        backoff.snooze();
        if i.is_multiple_of(CHECK_EVERY) {
            if ctx.abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted(format!("{} was aborted", ctx.operation)));
            }
            if let Err(e) = (ctx.check_peer)() {
                // The peer is gone, but what it did before going may be just what we wait for.
                return if ready() { Ok(()) } else { Err(e) };
            }
            let deadline = deadline.get_or_insert_with(|| Deadline::after(ctx.timeout));
            if deadline.expired() {
                // One last look: the condition may have come true while we checked.
                if ready() {
                    return Ok(());
                }
                return Err(Error::timeout(ctx.operation, ctx.peer, deadline.elapsed()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn ok() -> Result<()> {
        Ok(())
    }

    /// A wait on `peer` of at most `timeout`, aborted by `abort`, whose peer check passes.
    fn context<'a>(
        operation: &'a str,
        peer: Option<usize>,
        timeout: Duration,
        abort: &'a AtomicBool,
    ) -> WaitContext<'a> {
        WaitContext { operation, peer, timeout, abort, check_peer: &ok }
    }

    #[test]
    fn cpu_lists_count() {
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        for bad in ["", "3-1", "a", "0-"] {
            assert_eq!(count_cpu_list(bad), None, "{bad:?}");
        }
        assert!(host_cpus() >= 1);
    }

    #[test]
    fn returns_when_ready_times_out_otherwise() {
        let abort = AtomicBool::new(false);
        let ctx = context("test", Some(1), Duration::from_millis(20), &abort);
        let n = AtomicU64::new(0);
        spin_until(&ctx, || n.fetch_add(1, Ordering::Relaxed) > 10).unwrap();
        let r = spin_until(&ctx, || false);
        assert!(matches!(r, Err(Error::Timeout { peer: Some(1), .. })), "{r:?}");
    }

    #[test]
    fn progress_runs_while_waiting_and_its_error_ends_the_wait() {
        let abort = AtomicBool::new(false);
        let ctx = context("t", Some(2), Duration::from_secs(10), &abort);
        // The condition comes true only through progress (a waiter applying a message).
        let word = AtomicU64::new(0);
        let progress = || {
            word.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        spin_until_progress(&ctx, &progress, || word.load(Ordering::Relaxed) >= 5).unwrap();
        let broken = || Err(Error::peer_lost(2, "t", "reset"));
        let r = spin_until_progress(&ctx, &broken, || false);
        assert!(matches!(r, Err(Error::PeerLost { peer: 2, .. })), "{r:?}");
        // What arrived before the failure still counts.
        let arrived = AtomicU64::new(0);
        let last = || {
            arrived.store(1, Ordering::Relaxed);
            Err(Error::peer_lost(2, "t", "closed"))
        };
        spin_until_progress(&ctx, &last, || arrived.load(Ordering::Relaxed) == 1).unwrap();
    }

    #[test]
    fn abort_and_lost_peer_stop_the_wait() {
        let abort = AtomicBool::new(true);
        let ctx = context("t", None, Duration::from_secs(10), &abort);
        assert!(matches!(spin_until(&ctx, || false), Err(Error::Aborted(_))));
        let abort = AtomicBool::new(false);
        let lost = || Err(Error::peer_lost(3, "t", "gone"));
        let ctx = WaitContext {
            operation: "t",
            peer: Some(3),
            timeout: Duration::from_secs(10),
            abort: &abort,
            check_peer: &lost,
        };
        assert!(matches!(spin_until(&ctx, || false), Err(Error::PeerLost { peer: 3, .. })));
    }
}
