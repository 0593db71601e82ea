//! Bounded waits: every wait in weave checks a deadline, an abort flag and the peer's health,
//! and returns an error instead of waiting forever. A wait spins briefly, yields, then sleeps
//! (see [`Backoff`]); where the writer rings a [`Doorbell`] after its stores
//! ([`wait_until_rung`]), the sleep ends as soon as it does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::crowding::{crowded, oversubscribed};
use crate::deadline::Deadline;
use crate::doorbell::Doorbell;
use crate::error::{Error, Result};

/// How long a waiter spins before it starts yielding its core. Measured in time, not
/// iterations: a `spin_loop` hint costs ~10 ns on some CPUs, and when two ranks share a core,
/// every microsecond spent spinning is a microsecond the peer cannot run.
const SPIN_BUDGET: Duration = Duration::from_micros(3);

/// How long a waiter yields before it sleeps, counted from its first snooze, while ranks do
/// not outnumber cores: a yield with an idle core returns at once, so waits shorter than this
/// keep the latency of spinning, and only longer ones pay a wake-up.
const YIELD_BUDGET: Duration = Duration::from_millis(1);

/// Yields before a waiter sleeps on a crowded host (more than [`CROWDED_RANKS_PER_CORE`] ranks
/// per core): a yield then hands the core to another waiter rather than to the rank with work,
/// so only a few are worth trying (the peer may be about to store).
const CROWDED_YIELDS: u32 = 2;

/// The longest sleep on a doorbell before the waiter looks at its deadline, the abort flag and
/// its peer's health again.
const SLEEP_SLICE: Duration = Duration::from_millis(2);

/// Bounds of a nap, the sleep of a waiter that has no doorbell (nobody rings for its wait): a
/// sixteenth of the time waited so far, so that napping adds at most ~6 % to a wait.
#[cfg_attr(loom, allow(dead_code))]
const NAP_MIN: Duration = Duration::from_micros(20);
#[cfg_attr(loom, allow(dead_code))]
const NAP_MAX: Duration = Duration::from_millis(1);

/// What a [`Backoff`] does on a snooze.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Spin hints, while the peer is likely running on another core.
    Spin,
    /// Give the core away, but stay runnable.
    Yield,
    /// Leave the run queue: sleep on the wait's doorbell, or nap without one.
    Sleep,
}

/// Waiting politely, in three stages: spin for a few microseconds (the common case: the peer
/// runs on another core and answers quickly), yield the core for a while (the peer may need
/// it), then sleep — on the wait's [`Doorbell`] ([`snooze_on`](Self::snooze_on)) in slices of
/// a few milliseconds, woken by the writer's ring, or, for a wait nobody rings for
/// ([`snooze`](Self::snooze)), in naps of a sixteenth of the time waited so far. While ranks
/// outnumber cores a waiter skips the spin and yields only a couple of times before it
/// sleeps, so the cores go to the ranks with work. The clock is first read after 32 spins, so
/// a wait that ends sooner costs no clock read.
#[derive(Debug)]
pub struct Backoff {
    start: Option<Instant>,
    calls: u32,
    stage: Stage,
    crowded: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// A fresh backoff (spinning first, unless ranks outnumber cores).
    ///
    /// Under loom a backoff sleeps from the start, so the models reach the doorbell at once.
    pub fn new() -> Self {
        let stage = if cfg!(loom) {
            Stage::Sleep
        } else if oversubscribed() {
            Stage::Yield
        } else {
            Stage::Spin
        };
        Backoff { start: None, calls: 0, stage, crowded: crowded() }
    }

    /// Waits a little for a condition nobody rings for: a spin hint, a yield, or a nap,
    /// depending on how long the wait has lasted.
    ///
    /// Under loom the nap is a yield to the model's scheduler.
    pub fn snooze(&mut self) {
        if self.advance() {
            #[cfg(not(loom))]
            {
                let waited = self.start.map_or(Duration::ZERO, |s| s.elapsed());
                std::thread::sleep((waited / 16).clamp(NAP_MIN, NAP_MAX));
            }
            #[cfg(loom)]
            crate::sync::yield_now();
        }
    }

    /// Waits a little for `ready()`, which a writer announces by ringing `doorbell`: a spin
    /// hint or a yield early in the wait, later a sleep on the doorbell of at most a few
    /// milliseconds, skipped if `ready()` holds once this waiter is announced.
    pub fn snooze_on(&mut self, doorbell: &Doorbell, ready: impl FnOnce() -> bool) {
        if self.advance() {
            doorbell.sleep(SLEEP_SLICE, ready);
        }
    }

    /// Whether snoozes sleep now: each takes long enough that the caller may look at its
    /// deadline, abort flag and peers after every one.
    pub fn is_sleeping(&self) -> bool {
        self.stage == Stage::Sleep
    }

    /// Whether snoozes are still spin hints: the wait is younger than the spin budget (a few
    /// microseconds), and ranks do not outnumber cores.
    pub fn is_spinning(&self) -> bool {
        self.stage == Stage::Spin
    }

    /// Counts one snooze and spins or yields for it; true when the caller is to sleep instead.
    fn advance(&mut self) -> bool {
        self.calls = self.calls.wrapping_add(1);
        match self.stage {
            Stage::Spin => {
                std::hint::spin_loop();
                if self.calls.is_multiple_of(32) {
                    match self.start {
                        None => self.start = Some(Instant::now()),
                        Some(start) if start.elapsed() > SPIN_BUDGET => self.stage = Stage::Yield,
                        Some(_) => {}
                    }
                }
            }
            Stage::Yield => {
                crate::sync::yield_now();
                let start = *self.start.get_or_insert_with(Instant::now);
                let enough = if self.crowded {
                    self.calls >= CROWDED_YIELDS
                } else {
                    self.calls.is_multiple_of(32) && start.elapsed() > YIELD_BUDGET
                };
                if enough {
                    self.stage = Stage::Sleep;
                }
            }
            Stage::Sleep => return true,
        }
        false
    }

    /// Starts spinning again (after progress).
    pub fn reset(&mut self) {
        *self = Backoff::new();
    }
}

/// Iterations between checks of the deadline, abort flag and peer health while spinning or
/// yielding; a sleeping wait checks after every sleep.
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

/// Waits until `ready()` is true; errors on timeout, abort or a lost peer. The timeout counts
/// from the first check, 128 iterations in: a short wait reads no clock. Nobody rings for
/// this wait, so once it sleeps it naps ([`Backoff::snooze`]); a wait on memory whose writer
/// rings a doorbell is [`wait_until_rung`].
pub fn spin_until(ctx: &WaitContext<'_>, ready: impl FnMut() -> bool) -> Result<()> {
    wait_until_rung(ctx, None, &|| Ok(()), ready)
}

/// [`spin_until`] for a condition that `progress` helps come true: it is called before every
/// look at `ready()` after the first, and must not block (a connection's
/// [`progress`](crate::connection::Connection::progress): the waiter applies the peer's
/// incoming messages itself). Its error ends the wait like a lost peer: after one last look at
/// `ready()`, since what the peer did before failing may be just what we wait for.
pub fn spin_until_progress(
    ctx: &WaitContext<'_>,
    progress: &dyn Fn() -> Result<()>,
    ready: impl FnMut() -> bool,
) -> Result<()> {
    wait_until_rung(ctx, None, progress, ready)
}

/// [`spin_until_progress`] whose sleeps, once it sleeps, are on `doorbell`: every store that
/// may make `ready()` true is followed by a [`ring`](Doorbell::ring) of it, so a sleeping
/// waiter wakes at once instead of at the end of a nap. With `None`, the wait naps.
pub fn wait_until_rung(
    ctx: &WaitContext<'_>,
    doorbell: Option<&Doorbell>,
    progress: &dyn Fn() -> Result<()>,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    let mut deadline: Option<Deadline> = None;
    let mut backoff = Backoff::new();
    let mut held_sent = false;
    let mut i: u32 = 0;
    loop {
        if let Err(e) = progress() {
            return if ready() { Ok(()) } else { Err(e) };
        }
        if ready() {
            return Ok(());
        }
        i = i.wrapping_add(1);
        // What this process holds back may be what the peer needs to make `ready()` true: it
        // goes out once the wait outlasts its spin (see `crate::deferred`).
        if !held_sent && !backoff.is_spinning() {
            crate::deferred::send_all();
            held_sent = true;
        }
        match doorbell {
            Some(bell) => backoff.snooze_on(bell, &mut ready),
            None => backoff.snooze(),
        }
        if backoff.is_sleeping() || i.is_multiple_of(CHECK_EVERY) {
            if ctx.abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted(format!("{} was aborted", ctx.operation)));
            }
            if let Err(e) = (ctx.check_peer)() {
                // The peer is gone, but what it did before going may be just what we wait for,
                // and may still need this thread's progress to land (a flag in a receive queue).
                let _ = progress();
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

#[cfg(all(test, not(loom)))]
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

    /// A 10 s wait on peer 3, aborted by `abort`, whose peer check is `check_peer`.
    fn watching<'a>(abort: &'a AtomicBool, check_peer: &'a dyn Fn() -> Result<()>) -> WaitContext<'a> {
        WaitContext { operation: "t", peer: Some(3), timeout: Duration::from_secs(10), abort, check_peer }
    }

    #[test]
    fn abort_and_lost_peer_stop_the_wait() {
        let abort = AtomicBool::new(true);
        let ctx = context("t", None, Duration::from_secs(10), &abort);
        assert!(matches!(spin_until(&ctx, || false), Err(Error::Aborted(_))));
        let abort = AtomicBool::new(false);
        let lost = || Err(Error::peer_lost(3, "t", "gone"));
        let ctx = watching(&abort, &lost);
        assert!(matches!(spin_until(&ctx, || false), Err(Error::PeerLost { peer: 3, .. })));
    }

    #[test]
    fn what_a_lost_peer_sent_before_it_went_still_lands_with_one_more_progress() {
        // The peer's last flag sits in a receive queue that only this thread's progress
        // applies, and the peer is seen gone before that progress ran.
        let abort = AtomicBool::new(false);
        let gone = std::cell::Cell::new(false);
        let landed = std::cell::Cell::new(false);
        let lost = || {
            gone.set(true);
            Err(Error::peer_lost(3, "t", "gone"))
        };
        let progress = || {
            landed.set(gone.get());
            Ok(())
        };
        let ctx = watching(&abort, &lost);
        spin_until_progress(&ctx, &progress, || landed.get()).unwrap();
    }

    /// Runs `wait` on this thread while another thread, once `bell` has a sleeper (the wait
    /// reached its sleep), runs `then`; returns the wait's result and how long it took.
    fn while_asleep<T: Send>(bell: &Doorbell, then: impl FnOnce() + Send, wait: impl FnOnce() -> T) -> (T, Duration) {
        std::thread::scope(|s| {
            s.spawn(|| {
                let start = Instant::now();
                while bell.sleepers() == 0 {
                    assert!(start.elapsed() < Duration::from_secs(10), "the waiter never went to sleep");
                    std::thread::yield_now();
                }
                then();
            });
            let start = Instant::now();
            let r = wait();
            (r, start.elapsed())
        })
    }

    #[test]
    fn a_sleeping_wait_is_woken_by_a_store_and_ring() {
        let abort = AtomicBool::new(false);
        let ctx = context("t", Some(1), Duration::from_secs(30), &abort);
        let (bell, word) = (Doorbell::new(), AtomicU64::new(0));
        let ring = || {
            word.store(1, Ordering::Release);
            bell.ring();
        };
        let (r, took) =
            while_asleep(&bell, ring, || wait_until_rung(&ctx, Some(&bell), &ok, || word.load(Ordering::Acquire) == 1));
        r.unwrap();
        assert!(took < Duration::from_secs(5), "woken after {took:?}");
        assert_eq!(bell.sleepers(), 0);
    }

    #[test]
    fn a_sleeping_wait_times_out_aborts_and_sees_a_lost_peer_on_time() {
        let abort = AtomicBool::new(false);
        let bell = Doorbell::new();
        let ctx = context("t", Some(1), Duration::from_millis(50), &abort);
        let start = Instant::now();
        let r = wait_until_rung(&ctx, Some(&bell), &ok, || false);
        let took = start.elapsed();
        assert!(matches!(r, Err(Error::Timeout { peer: Some(1), .. })), "{r:?}");
        assert!(took >= Duration::from_millis(50) && took < Duration::from_secs(2), "timed out after {took:?}");

        let ctx = context("t", None, Duration::from_secs(30), &abort);
        let (r, took) = while_asleep(
            &bell,
            || abort.store(true, Ordering::Relaxed),
            || wait_until_rung(&ctx, Some(&bell), &ok, || false),
        );
        assert!(matches!(r, Err(Error::Aborted(_))), "{r:?}");
        assert!(took < Duration::from_secs(5), "aborted after {took:?}");

        let abort = AtomicBool::new(false);
        let gone = AtomicBool::new(false);
        let check = || if gone.load(Ordering::Relaxed) { Err(Error::peer_lost(2, "t", "gone")) } else { Ok(()) };
        let ctx = WaitContext {
            operation: "t",
            peer: Some(2),
            timeout: Duration::from_secs(30),
            abort: &abort,
            check_peer: &check,
        };
        let (r, took) = while_asleep(
            &bell,
            || gone.store(true, Ordering::Relaxed),
            || wait_until_rung(&ctx, Some(&bell), &ok, || false),
        );
        assert!(matches!(r, Err(Error::PeerLost { peer: 2, .. })), "{r:?}");
        assert!(took < Duration::from_secs(5), "noticed after {took:?}");
    }

    #[test]
    fn a_wait_that_outlasts_its_spin_sends_what_the_process_holds_back() {
        struct Held(AtomicU64);
        impl crate::deferred::HeldSends for Held {
            fn send_held(&self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let held = std::sync::Arc::new(Held(AtomicU64::new(0)));
        crate::deferred::hold(held.clone());
        let abort = AtomicBool::new(false);
        let ctx = context("t", Some(1), Duration::from_secs(10), &abort);
        // The held send is what the condition waits for, as a peer's next message may be.
        spin_until(&ctx, || held.0.load(Ordering::Relaxed) > 0).unwrap();
        assert_eq!(held.0.load(Ordering::Relaxed), 1, "sent once");
    }

    #[test]
    fn backoff_sleeps_after_a_millisecond_or_at_once_when_crowded() {
        let mut b = Backoff { crowded: false, ..Backoff::new() };
        b.stage = Stage::Spin;
        let start = Instant::now();
        while !b.is_sleeping() {
            b.snooze();
            assert!(start.elapsed() < Duration::from_secs(10));
        }
        assert!(start.elapsed() >= YIELD_BUDGET, "slept after {:?}", start.elapsed());
        // Asleep, a snooze without a doorbell naps at least NAP_MIN.
        let t = Instant::now();
        b.snooze();
        assert!(t.elapsed() >= NAP_MIN);

        let mut b = Backoff { crowded: true, stage: Stage::Yield, ..Backoff::new() };
        for _ in 0..CROWDED_YIELDS {
            assert!(!b.is_sleeping());
            b.snooze();
        }
        assert!(b.is_sleeping());
        b.reset();
        assert_eq!(b.calls, 0);
    }
}
