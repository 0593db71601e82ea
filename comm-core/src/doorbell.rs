//! Doorbells: how a host waiter sleeps until another process has stored what it waits for,
//! instead of taking turns at the cores with every other waiter.
//!
//! A [`Doorbell`] is eight bytes in memory that the waiter and the writers share (a
//! `MAP_SHARED` mapping: shared-memory segments, or plain memory within one process), next to
//! the words a wait polls: a count of *sleepers* and a *rings* counter. The waiter sleeps on
//! `rings` with a futex (`FUTEX_WAIT` without `FUTEX_PRIVATE_FLAG`, so the kernel keys it by the
//! physical page and a wake from another process reaches it); a writer wakes it by bumping
//! `rings` and `FUTEX_WAKE`. Ringing is cheap when nobody sleeps: one load (and a fence on a crowded host), no
//! system call, so writers ring after every store a sleeper may wait for.
//!
//! # Protocol
//!
//! - **Sleep** (waiter, [`Doorbell::sleep`]): add one to `sleepers`; full fence; read `rings`
//!   (acquire) as `seen`; look at the condition — if it holds, leave; otherwise
//!   `FUTEX_WAIT(rings, seen, slice)`; then take the one back from `sleepers`. Any outcome of
//!   the futex (woken, `rings` already moved on, interrupted, the slice over) only means "look
//!   again": the caller's loop re-checks its condition, its deadline, the abort flag and the
//!   peer's health after every sleep.
//! - **Ring** (writer, [`Doorbell::ring`]), after the stores that may make a sleeper's
//!   condition true: full fence; read `sleepers`; only if it is not zero, add one to `rings`
//!   (release) and `FUTEX_WAKE` every sleeper.
//!
//! No wake is lost: the waiter announces itself, fences, then reads the data; the writer
//! stores the data, fences, then reads the announcement. With both fences sequentially
//! consistent, either the waiter's read sees the store (it does not sleep) or the writer's read
//! sees the announcement (it rings). A ring that comes before the waiter enters the futex has
//! moved `rings` past `seen`, so the futex returns at once; one after finds it queued. The same
//! holds when the ringer is not the writer of the last store but a rank that *observed* every
//! store a condition needs and rings after it: its fence comes after the store the waiter
//! missed (a barrier's last arrival rings once its own wait is over; see the host workspace).
//!
//! The loom models (`cargo xtask loom`) check this over every interleaving of a sleeper and a
//! writer, with a futex that has no time slice: with the fence no wake is lost, and without it
//! loom finds the schedule that loses one.
//!
//! `rings` wraps at 2^32; a waiter would sleep through a ring only if exactly 2^32 rings came
//! between its read and its futex call, and even then only until its slice ends.
//!
//! Where the host is not crowded (at most four ranks per core, see [`crate::crowding::crowded`]),
//! writers ring without the fence: a full fence after a store to a peer's cache line waits for
//! that line, which costs a small message more than the rest of its path. A wake can then be
//! lost in the window between a waiter's announcement and its look at the condition; the
//! waiter sleeps through it for one slice at most, and there only waiters that have already
//! yielded for a millisecond sleep at all.
//!
//! # Who sleeps
//!
//! The policy lives in [`crate::spin::Backoff`]: spin briefly, yield a while, then sleep on the
//! doorbell in slices; on a crowded host (more than four ranks per core) waiters skip most of
//! the yielding, because a yield there hands the core to another waiter instead of to the
//! rank with work.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::sync::{AtomicU32, fence};

/// Two 32-bit counters in shared memory: the sleepers announced and the rings so far (the
/// futex word). Lives at an 8-byte aligned address; all-zero bytes are a fresh doorbell.
#[derive(Debug, Default)]
#[repr(C, align(8))]
pub struct Doorbell {
    /// Waiters announced on this doorbell (asleep, or about to be).
    sleepers: AtomicU32,
    /// Rings so far, wrapping; waiters sleep on this word.
    rings: AtomicU32,
    /// Under loom, the futex the kernel would keep for `rings`.
    #[cfg(loom)]
    futex: futex::ModelFutex,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Doorbell>() == Doorbell::BYTES);

impl Doorbell {
    /// Bytes a doorbell takes in a shared layout (8-byte aligned).
    pub const BYTES: usize = 8;

    /// A fresh doorbell, for memory owned by this process (threads of one process, tests).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Doorbell { sleepers: AtomicU32::new(0), rings: AtomicU32::new(0) }
    }

    /// A fresh doorbell inside a loom model.
    #[cfg(loom)]
    pub fn new() -> Self {
        Doorbell::default()
    }

    /// The doorbell at `ptr`.
    ///
    /// # Safety
    /// `ptr` is 8-byte aligned and points to [`BYTES`](Self::BYTES) bytes that stay mapped for
    /// `'a`, that every process sharing them accesses only through a `Doorbell`, and that were
    /// zero before first use.
    #[cfg(not(loom))]
    pub unsafe fn from_ptr<'a>(ptr: *mut u8) -> &'a Doorbell {
        debug_assert!((ptr as usize).is_multiple_of(Self::BYTES));
        // SAFETY: the caller guarantees alignment, size, lifetime and atomic-only access; a
        // `Doorbell` is two `AtomicU32`s, valid for any bytes.
        unsafe { &*(ptr as *const Doorbell) }
    }

    /// Wakes every waiter asleep on this doorbell, if any. Call it after the stores a waiter may
    /// wait for; costs a fence and a load when nobody sleeps.
    #[inline]
    pub fn ring(&self) {
        // Where the host is not crowded, the fence would stall every message on the store that
        // precedes it, for a sleeper that is rarely there (see the module doc).
        self.ring_fenced(crate::crowding::crowded());
    }

    /// [`ring`](Self::ring), with the fence that makes it lose no wake or without it.
    #[inline]
    pub(crate) fn ring_fenced(&self, fenced: bool) {
        if fenced {
            fence(Ordering::SeqCst);
        }
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.rings.fetch_add(1, Ordering::Release);
            self.wake_all();
        }
    }

    #[cfg(not(loom))]
    fn wait_while_rings_is(&self, seen: u32, slice: Duration) {
        futex::wait(&self.rings, seen, slice);
    }

    #[cfg(not(loom))]
    fn wake_all(&self) {
        futex::wake_all(&self.rings);
    }

    /// Under loom a sleep has no slice: a lost wake leaves the sleeper asleep for good, which
    /// the model checker reports as a deadlock.
    #[cfg(loom)]
    fn wait_while_rings_is(&self, seen: u32, _slice: Duration) {
        self.futex.wait(&self.rings, seen);
    }

    #[cfg(loom)]
    fn wake_all(&self) {
        self.futex.wake_all();
    }

    /// Sleeps at most `slice` unless `ready()` holds once this waiter is announced; returns
    /// what `ready()` said. Any wake-up — a ring, a signal, the slice running out — returns:
    /// the caller looks at its condition, its deadline and its peers again.
    pub fn sleep(&self, slice: Duration, ready: impl FnOnce() -> bool) -> bool {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let seen = self.rings.load(Ordering::Acquire);
        let ready = ready();
        if !ready {
            self.wait_while_rings_is(seen, slice);
        }
        self.sleepers.fetch_sub(1, Ordering::Release);
        ready
    }

    /// Waiters announced right now (for tests and diagnostics).
    pub fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::Relaxed)
    }
}

/// The two futex operations a doorbell needs, on shared (not process-private) futex words.
#[cfg(all(target_os = "linux", not(loom)))]
mod futex {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    /// Sleeps while `word` holds `expected`, at most `timeout`. Every outcome (woken, the
    /// value differs, interrupted, timed out) returns: callers look again.
    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `word` is a valid, aligned 32-bit word for the duration of the call and `ts`
        // a valid relative timeout; FUTEX_WAIT reads the word and never writes memory. No
        // FUTEX_PRIVATE_FLAG: the word may be shared with other processes.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wakes every thread, of any process, asleep on `word`.
    pub(super) fn wake_all(word: &AtomicU32) {
        // SAFETY: `word` is a valid, aligned 32-bit word; FUTEX_WAKE only looks up waiters
        // keyed by its address and touches no memory.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

/// Without futexes a sleeper naps briefly instead; rings are then only a counter.
#[cfg(all(not(target_os = "linux"), not(loom)))]
mod futex {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// Naps for a short part of `timeout` unless `word` already moved past `expected`.
    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
        if word.load(Ordering::Acquire) == expected {
            std::thread::sleep(timeout.min(Duration::from_micros(50)));
        }
    }

    /// Nothing to wake: sleepers nap briefly.
    pub(super) fn wake_all(_word: &AtomicU32) {}
}

/// A futex as the model checker sees it: a wait checks the word and queues under the lock the
/// kernel takes for the word's hash bucket, and a wake takes the same lock, so a wake that
/// comes after the waiter checked the word finds it queued.
#[cfg(loom)]
mod futex {
    use std::sync::atomic::Ordering;

    use crate::sync::{AtomicU32, Condvar, Mutex};

    /// The kernel's queue for one futex word: the wakes so far, under the bucket lock.
    #[derive(Debug, Default)]
    pub(super) struct ModelFutex {
        wakes: Mutex<u64>,
        woken: Condvar,
    }

    impl ModelFutex {
        /// Sleeps while `word` holds `expected`, until a wake; no timeout.
        pub(super) fn wait(&self, word: &AtomicU32, expected: u32) {
            let mut wakes = self.wakes.lock().unwrap_or_else(|p| p.into_inner());
            if word.load(Ordering::Relaxed) != expected {
                return;
            }
            let queued_at = *wakes;
            while *wakes == queued_at {
                wakes = self.woken.wait(wakes).unwrap_or_else(|p| p.into_inner());
            }
        }

        /// Wakes every sleeper queued.
        pub(super) fn wake_all(&self) {
            *self.wakes.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            self.woken.notify_all();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    #[test]
    fn a_ring_without_sleepers_changes_nothing() {
        let d = Doorbell::new();
        d.ring();
        assert_eq!((d.sleepers(), d.rings.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn a_ready_condition_does_not_sleep() {
        let d = Doorbell::new();
        let t = Instant::now();
        assert!(d.sleep(Duration::from_secs(5), || true));
        assert!(t.elapsed() < Duration::from_secs(1), "slept {:?}", t.elapsed());
        assert_eq!(d.sleepers(), 0);
    }

    #[test]
    fn an_unrung_sleep_ends_with_its_slice() {
        let d = Doorbell::new();
        let t = Instant::now();
        assert!(!d.sleep(Duration::from_millis(30), || false));
        let slept = t.elapsed();
        assert!(slept >= Duration::from_millis(25) && slept < Duration::from_secs(2), "slept {slept:?}");
        assert_eq!(d.sleepers(), 0);
    }

    #[test]
    fn a_store_and_a_ring_from_another_thread_wake_the_sleeper() {
        let shared = Arc::new((Doorbell::new(), AtomicU64::new(0)));
        let writer = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let (bell, word) = &*shared;
                // Once the sleeper is announced, store and ring.
                while bell.sleepers() == 0 {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_millis(20));
                word.store(1, Ordering::Release);
                bell.ring();
            })
        };
        let (bell, word) = &*shared;
        let t = Instant::now();
        // A slice far longer than the test: only the ring can end the sleep in time.
        while !bell.sleep(Duration::from_secs(20), || word.load(Ordering::Acquire) == 1) {}
        let woke = t.elapsed();
        writer.join().unwrap();
        assert!(woke < Duration::from_secs(5), "woken after {woke:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_ring_from_another_process_wakes_the_sleeper() {
        const LEN: usize = 4096;
        // SAFETY: a fresh anonymous shared mapping (zeroed, page-aligned), as a shared-memory
        // segment is; checked below and unmapped at the end.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        // SAFETY: both lie inside the mapping, aligned, zeroed, used only atomically.
        let (bell, word) = unsafe {
            (Doorbell::from_ptr(base.cast::<u8>()), AtomicU64::from_ptr(base.cast::<u8>().add(64).cast::<u64>()))
        };
        // SAFETY: the child only touches the shared atomics, sleeps in futex(2) and leaves
        // with _exit: nothing that the other threads of this test process may hold locks for.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // A slice far longer than the test: only a ring from the parent ends it in time.
            while !bell.sleep(Duration::from_secs(20), || word.load(Ordering::Acquire) == 1) {}
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        let reap = |options: i32| {
            let mut status = 0;
            // SAFETY: `child` is this process's child; `status` a valid out-pointer.
            let r = unsafe { libc::waitpid(child, &mut status, options) };
            (r, status)
        };
        let start = Instant::now();
        while bell.sleepers() == 0 {
            if start.elapsed() > Duration::from_secs(10) {
                // SAFETY: kills and reaps our own child, so the failed test leaves nothing.
                unsafe { libc::kill(child, libc::SIGKILL) };
                reap(0);
                panic!("the child never went to sleep");
            }
            std::thread::yield_now();
        }
        word.store(1, Ordering::Release);
        bell.ring();
        let rung = Instant::now();
        let (r, status) = reap(0);
        let woke = rung.elapsed();
        assert_eq!(r, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        assert!(woke < Duration::from_secs(5), "the child woke {woke:?} after the ring");
        // SAFETY: the mapping made above, no longer used (the child is gone).
        assert_eq!(unsafe { libc::munmap(base, LEN) }, 0);
    }

    #[test]
    fn no_wake_is_lost_between_many_stores_and_sleeps() {
        // A ping-pong through two words in which both sides sleep on every turn: a lost wake
        // stalls a turn until the slice of 10 s ends, which the time bound catches. The rings
        // are fenced, as on a crowded host: unfenced rings may lose a wake by design (see the
        // module doc), and whether `ring` fences depends on what other tests of this process
        // set up.
        const TURNS: u64 = 2_000;
        let shared = Arc::new((Doorbell::new(), AtomicU64::new(0)));
        let pong = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let (bell, word) = &*shared;
                for t in 0..TURNS {
                    while !bell.sleep(Duration::from_secs(10), || word.load(Ordering::Acquire) == 2 * t + 1) {}
                    word.store(2 * t + 2, Ordering::Release);
                    bell.ring_fenced(true);
                }
            })
        };
        let (bell, word) = &*shared;
        let start = Instant::now();
        for t in 0..TURNS {
            word.store(2 * t + 1, Ordering::Release);
            bell.ring_fenced(true);
            while !bell.sleep(Duration::from_secs(10), || word.load(Ordering::Acquire) == 2 * t + 2) {}
        }
        pong.join().unwrap();
        assert!(start.elapsed() < Duration::from_secs(8), "{TURNS} turns took {:?}", start.elapsed());
    }
}
