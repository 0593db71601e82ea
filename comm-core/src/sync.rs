//! The synchronisation primitives the lock-free core is built from — the trigger FIFO, the
//! doorbell, the bounded waits, the semaphore's counts and a slot ring's credits: the standard
//! library's, or [loom]'s when the crate is built with `--cfg loom`.
//!
//! Under loom every atomic access, fence and lock of these modules is a point at which the
//! model checker may switch threads, and a load may return any store the memory model allows,
//! not only the latest. The models (`crate::loom_models`, run by `cargo xtask loom`) then
//! explore every interleaving of small scenarios within their bounds.
//!
//! [loom]: https://docs.rs/loom

#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, fence};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex};

/// Gives the processor (under loom: the model's scheduler) to another thread.
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}
