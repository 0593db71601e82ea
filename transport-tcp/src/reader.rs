//! The reader threads: one per stripe number, each watching every inbound socket of that stripe
//! with one `ppoll(2)` and draining the sockets that have bytes (see [`crate::receive`]).
//!
//! A thread per socket would give a rank with many peers thousands of threads (at 1,023 peers
//! and two stripes, 2,046), and each napping stripe-0 reader a timer of its own. A thread per
//! stripe number rather than one for all: stripes `s > 0` carry large writes, which go on
//! draining on their own threads while stripe 0's reader applies small messages.
//!
//! Each [`ReaderSet`] keeps the sockets it watches in a list the listener appends to
//! ([`Readers::add`]); a byte on the set's wake-up pair tells its thread to take the new
//! sockets, or to look at the stop flag. Per socket the thread remembers how its last drain
//! ended: a flag waiting for other stripes is drained again after a snooze instead of waiting
//! for bytes, and a stripe-0 socket whose peer waiters tend (or whose lock a waiter held) is
//! left out of the `ppoll` and drained again after at most [`TENDED_NAP`] — the other sockets
//! of the set stay in it, so their bytes still wake the thread at once.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use comm_core::spin::Backoff;
use comm_core::{Error, Result};
use nix::poll::{PollFd, PollFlags};
use nix::sys::time::TimeSpec;

use crate::config::MAX_SOCKETS;
use crate::listener::Inbound;
use crate::receive::{Drained, InSocket, PeerInbound};

/// How often an idle reader thread looks at the stop flag (the listener also wakes it when it
/// stops).
const IDLE_POLL: Duration = Duration::from_secs(1);
/// How long a reader naps while waiters tend a peer (see [`crate::receive`]) or hold a socket,
/// before it looks again: what a message landing just as the waiter stopped waits at most,
/// beyond [`TENDED_FOR`](crate::receive::TENDED_FOR).
const TENDED_NAP: Duration = Duration::from_micros(50);

/// One socket as its reader thread sees it.
struct Watched {
    socket: Arc<InSocket>,
    /// The peer's rank, for reports.
    rank: usize,
    peer: Arc<PeerInbound>,
    /// How the last drain ended.
    last: Drained,
    /// A waiter held the socket at the last look: nap, then look again.
    busy: bool,
}

impl Watched {
    /// Left out of the `poll`, drained after a nap: waiters tend the peer (stripe 0 carries its
    /// small messages) or held the socket.
    fn napping(&self) -> bool {
        self.busy || (self.socket.stripe == 0 && self.peer.tended())
    }
}

/// The sockets of one stripe number and the thread that reads them.
struct ReaderSet {
    /// Sockets added since the thread last looked (the thread takes them).
    added: Arc<Mutex<Vec<Watched>>>,
    /// Written to wake the thread (new sockets, stop); the thread reads the other end.
    wake: UnixStream,
    thread: JoinHandle<()>,
}

/// The reader threads of one listener, by stripe number, started with their first socket.
#[derive(Default)]
pub(crate) struct Readers {
    sets: Mutex<Vec<Option<ReaderSet>>>,
}

impl Readers {
    /// Hands `socket` (from rank `rank`, whose shared state is `peer`) to its stripe's reader
    /// thread, starting the thread with its first socket.
    pub(crate) fn add(
        &self,
        socket: Arc<InSocket>,
        rank: usize,
        peer: Arc<PeerInbound>,
        inbound: &Arc<Inbound>,
    ) -> Result<()> {
        let stripe = usize::from(socket.stripe);
        if stripe >= MAX_SOCKETS {
            return Err(Error::protocol(format!(
                "tcp socket of rank {rank} claims stripe {stripe}, past {MAX_SOCKETS}"
            )));
        }
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        if inbound.stopping() {
            return Err(Error::Aborted("the tcp listener is stopping; no socket is read any more".into()));
        }
        if sets.len() <= stripe {
            sets.resize_with(stripe + 1, || None);
        }
        let set = match &mut sets[stripe] {
            Some(set) => set,
            empty => empty.insert(ReaderSet::start(stripe, inbound.clone())?),
        };
        let watched = Watched { socket, rank, peer, last: Drained::Idle, busy: false };
        set.added.lock().unwrap_or_else(|p| p.into_inner()).push(watched);
        // A full pair already holds a wake-up the thread has not read.
        let _ = (&set.wake).write(&[1]);
        Ok(())
    }

    /// The reader threads started so far (for tests).
    #[cfg(test)]
    pub(crate) fn thread_count(&self) -> usize {
        self.sets.lock().unwrap_or_else(|p| p.into_inner()).iter().flatten().count()
    }

    /// Wakes every reader thread (the listener's stop flag is set) and joins it.
    pub(crate) fn stop(&self) {
        let sets: Vec<ReaderSet> = self.sets.lock().unwrap_or_else(|p| p.into_inner()).drain(..).flatten().collect();
        for set in &sets {
            let _ = (&set.wake).write(&[1]);
        }
        for set in sets {
            let _ = set.thread.join();
        }
    }
}

impl ReaderSet {
    /// Starts the reader thread of stripe `stripe`.
    fn start(stripe: usize, inbound: Arc<Inbound>) -> Result<ReaderSet> {
        let (wake, woken) = UnixStream::pair().map_err(|e| Error::io("make a tcp reader's wake-up pair", e))?;
        for end in [&wake, &woken] {
            end.set_nonblocking(true).map_err(|e| Error::io("make a tcp reader's wake-up pair non-blocking", e))?;
        }
        let added = Arc::new(Mutex::new(Vec::new()));
        let thread_added = added.clone();
        let thread = std::thread::Builder::new()
            .name(format!("weave-tcp-recv-s{stripe}"))
            .spawn(move || read_loop(&woken, &thread_added, &inbound))
            .map_err(|e| Error::io("spawn a tcp reader thread", e))?;
        Ok(ReaderSet { added, wake, thread })
    }
}

/// A stripe's reader thread: takes the sockets added to its set, waits in one `ppoll(2)` (not
/// holding any socket's lock) for bytes on those it watches, and drains each socket that has
/// some, that waits for other stripes (after a snooze) or that naps (after at most
/// [`TENDED_NAP`]). A socket leaves the set when it ends (whoever saw the end reported it); the
/// thread ends when the listener stops.
fn read_loop(woken: &UnixStream, added: &Mutex<Vec<Watched>>, inbound: &Inbound) {
    let mut watched: Vec<Watched> = Vec::new();
    let mut backoff = Backoff::new();
    let (mut ready, mut polled): (Vec<bool>, Vec<usize>) = (Vec::new(), Vec::new());
    while !inbound.stopping() {
        let waiting = watched.iter().any(|w| w.last == Drained::Waiting);
        let napping = watched.iter().any(Watched::napping);
        let timeout = if waiting {
            backoff.snooze();
            Duration::ZERO
        } else {
            backoff.reset();
            if napping { TENDED_NAP } else { IDLE_POLL }
        };
        // The sockets to poll: all but those drained regardless (waiting or napping), which
        // stand for "ready" below.
        ready.clear();
        ready.extend(watched.iter().map(|w| w.last == Drained::Waiting || w.napping()));
        polled.clear();
        polled.extend((0..watched.len()).filter(|&i| !ready[i]));
        // SAFETY: each descriptor stays open while its `InSocket` (which owns the stream) lives,
        // and `watched` holds every one of them until after this poll.
        let borrow = |i: usize| unsafe { BorrowedFd::borrow_raw(watched[i].socket.fd) };
        let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(woken.as_fd(), PollFlags::POLLIN))
            .chain(polled.iter().map(|&i| PollFd::new(borrow(i), PollFlags::POLLIN)))
            .collect();
        match nix::poll::ppoll(&mut fds, Some(TimeSpec::from(timeout)), None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                // No socket of the set can be watched: each fails, as a broken socket does.
                for w in watched.drain(..) {
                    let mut st = w.socket.lock();
                    let why = Err(Error::io("poll the tcp sockets of a stripe", e.into()));
                    w.socket.end(&mut st, &why, w.rank, inbound);
                }
                continue;
            }
        }
        let was_woken = fds[0].any().unwrap_or(false);
        for (k, &i) in polled.iter().enumerate() {
            ready[i] = fds[k + 1].any().unwrap_or(true);
        }
        drop(fds);
        // Every socket added comes with a wake-up byte: the list is looked at only then.
        if was_woken {
            let mut bytes = [0u8; 64];
            while matches!((&*woken).read(&mut bytes), Ok(n) if n > 0) {}
            let mut new = std::mem::take(&mut *added.lock().unwrap_or_else(|p| p.into_inner()));
            ready.resize(watched.len() + new.len(), true);
            watched.append(&mut new);
        }
        if inbound.readers_paused.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let mut i = 0;
        while i < watched.len() {
            if !ready[i] || !drain(&mut watched[i], inbound) {
                i += 1;
                continue;
            }
            watched.swap_remove(i);
            ready.swap_remove(i);
        }
    }
}

/// Drains `w` unless a waiter holds it (then it naps); `true` once the socket ended and was
/// reported, so that the reader lets go of it.
fn drain(w: &mut Watched, inbound: &Inbound) -> bool {
    let Some(mut st) = w.socket.try_lock() else {
        // A waiter is draining this socket: look again after a nap (it may leave bytes).
        w.busy = true;
        return false;
    };
    w.busy = false;
    let outcome = w.socket.drain(&mut st, &w.peer, inbound);
    match outcome {
        Ok(d @ (Drained::Idle | Drained::Waiting)) => {
            w.last = d;
            false
        }
        Ok(Drained::Ended) | Err(_) => {
            w.socket.end(&mut st, &outcome, w.rank, inbound);
            true
        }
    }
}
