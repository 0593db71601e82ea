//! Sends a transport holds back until the rank next waits.
//!
//! A network transport pays per frame: a slot credit sent on its own costs a system call and
//! a trip through both kernels' network stacks, while the same credit riding in front of the
//! next message to that peer costs a few bytes. So a transport may hold such a store back
//! ([`Connection::update_lazily`](crate::connection::Connection::update_lazily)) until it sends
//! the next frame to that peer anyway — or until this process next waits for anything, since
//! the waited-for event may depend, through any chain of ranks, on the store held back.
//!
//! The rule that keeps this deadlock-free: **no wait outlasts its spin while a send is held
//! back.** Every wait of the library runs [`send_all`] once it has spun for its few
//! microseconds without its condition coming true (see [`crate::spin`]), which sends whatever
//! any holder in this process holds; a wait on the very peer a holder holds a send for sends
//! that one at once (the transport's [`progress`](crate::connection::Connection::progress)).
//! A holder registers with [`hold`] when it starts holding; registering is cheap, and a wait
//! that finds nothing registered reads one atomic. What is held back is only ever a store its
//! peer needs for a *later* step — a credit for a slot the peer reuses a few messages on —
//! never one the current step waits for, so the short grace costs a waiting peer a few
//! microseconds at most, while a rank whose other waits end quickly (a partner in the node,
//! a step of shared memory between two network messages) sends the credit in front of its
//! next message instead of in a frame of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A holder of sends: a transport's connection that held a store back.
pub trait HeldSends: Send + Sync {
    /// Sends what this holder holds back now. A failure is the holder's to record: its
    /// connection reports it on the next call.
    fn send_held(&self);
}

/// Holders registered since the last [`send_all`].
static HOLDERS: Mutex<Vec<Arc<dyn HeldSends>>> = Mutex::new(Vec::new());
/// How many holders [`HOLDERS`] has: read without the lock by every wait.
static HOLDING: AtomicUsize = AtomicUsize::new(0);

/// Registers `holder`, which holds a send back, so the next wait in this process sends it.
pub fn hold(holder: Arc<dyn HeldSends>) {
    let mut holders = HOLDERS.lock().unwrap_or_else(|p| p.into_inner());
    holders.push(holder);
    HOLDING.store(holders.len(), Ordering::Release);
}

/// Sends everything held back in this process: call it before waiting long on anything a
/// peer is to make true.
#[inline]
pub fn send_all() {
    if HOLDING.load(Ordering::Acquire) != 0 {
        send_all_registered();
    }
}

#[cold]
fn send_all_registered() {
    let holders = {
        let mut holders = HOLDERS.lock().unwrap_or_else(|p| p.into_inner());
        HOLDING.store(0, Ordering::Release);
        std::mem::take(&mut *holders)
    };
    for holder in holders {
        holder.send_held();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    struct Counter(AtomicU64);

    impl HeldSends for Counter {
        fn send_held(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_held_send_goes_out_at_the_next_send_all_and_only_once() {
        let c = Arc::new(Counter(AtomicU64::new(0)));
        hold(c.clone());
        hold(c.clone());
        send_all();
        // A wait of another test may have taken our holders and be sending them right now.
        let started = std::time::Instant::now();
        while c.0.load(Ordering::Relaxed) < 2 {
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "a held send never went out");
            std::thread::yield_now();
        }
        send_all();
        assert_eq!(c.0.load(Ordering::Relaxed), 2, "sent once per registration");
    }
}
