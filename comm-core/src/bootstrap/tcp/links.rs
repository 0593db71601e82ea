//! What the poller thread and the calling threads of one rank share: the mailbox of received
//! messages, the links and why peers were lost, and the commands for the poller.
//!
//! One lock guards it all ([`Shared::lock`]); one condition variable ([`Shared::changed`]) wakes
//! whoever waits for a message, a link or a loss. The poller is woken through a socket pair.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::deadline::Deadline;

/// Payloads up to this size are copied into one buffer with their frame header (one write).
const SMALL_FRAME_LEN: usize = 64 << 10;

/// One established link to a peer: a connected socket (non-blocking; the poller reads it,
/// senders write it under `writer`).
pub(super) struct Link {
    pub(super) peer: usize,
    pub(super) stream: TcpStream,
    /// Held while a frame is written; set once a write failed (later sends fail with it).
    writer: Mutex<Option<String>>,
}

/// Why a bounded write did not complete.
pub(super) enum WriteFailure {
    /// The deadline passed (possibly part-way through a frame).
    TimedOut,
    /// The connection failed or was closed.
    Closed(String),
}

impl Link {
    pub(super) fn new(peer: usize, stream: TcpStream) -> Self {
        Link { peer, stream, writer: Mutex::new(None) }
    }

    /// Writes one frame — tag `u64`, length `u64`, payload — or fails once `deadline` has
    /// passed. A frame cut short leaves the link unusable: it is then shut down, so the peer sees
    /// the end instead of misreading the next frame, and later sends fail at once.
    pub(super) fn write_frame(&self, tag: u64, data: &[u8], deadline: &Deadline) -> Result<(), WriteFailure> {
        let mut broken = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(reason) = broken.as_ref() {
            return Err(WriteFailure::Closed(reason.clone()));
        }
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(&tag.to_le_bytes());
        header[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let written = if data.len() <= SMALL_FRAME_LEN {
            let mut frame = Vec::with_capacity(header.len() + data.len());
            frame.extend_from_slice(&header);
            frame.extend_from_slice(data);
            write_all_until(&self.stream, &frame, deadline)
        } else {
            write_all_until(&self.stream, &header, deadline)
                .and_then(|()| write_all_until(&self.stream, data, deadline))
        };
        if let Err(failure) = &written {
            *broken = Some(match failure {
                WriteFailure::TimedOut => format!("an earlier send of {} bytes timed out part-way", data.len()),
                WriteFailure::Closed(reason) => reason.clone(),
            });
            let _ = self.stream.shutdown(Shutdown::Both);
        }
        written
    }
}

/// Writes all of `bytes` to a non-blocking socket, waiting for room with `poll(2)` until
/// `deadline`.
pub(super) fn write_all_until(stream: &TcpStream, bytes: &[u8], deadline: &Deadline) -> Result<(), WriteFailure> {
    let mut done = 0;
    while done < bytes.len() {
        match (&*stream).write(&bytes[done..]) {
            Ok(0) => return Err(WriteFailure::Closed("the connection accepts no more data".into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let remaining = deadline.next_wait();
                if remaining.is_zero() {
                    return Err(WriteFailure::TimedOut);
                }
                let wait = PollTimeout::try_from(remaining).unwrap_or(PollTimeout::MAX);
                let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
                // EINTR and readiness alike lead to another write attempt.
                let _ = poll(&mut fds, wait);
            }
            Err(e) => return Err(WriteFailure::Closed(e.to_string())),
        }
    }
    Ok(())
}

/// A request from a calling thread to the poller.
pub(super) enum Command {
    /// Open a link to `peer` at `addr`, giving up at `deadline`.
    Connect { peer: usize, addr: SocketAddr, deadline: Deadline },
    /// Close everything and end the thread.
    Stop,
}

/// What the lock of [`Shared`] guards.
pub(super) struct State {
    queues: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    /// Notices from any peer, oldest first, with their senders.
    pub(super) notices: VecDeque<(usize, Vec<u8>)>,
    /// Per peer: why it is known to be gone, once it is.
    pub(super) lost: Vec<Option<String>>,
    /// Per peer with a link: the link its messages go out on — the first one established; a
    /// sender never switches, so messages of one tag arrive in order even when both ranks
    /// opened a link at once.
    pub(super) senders: HashMap<usize, Arc<Link>>,
    /// Every established link (a pair of ranks that opened links at the same time has two).
    pub(super) links: Vec<Arc<Link>>,
    /// Peers a link is being opened to.
    pub(super) connecting: HashSet<usize>,
    /// Peers whose last link attempt timed out, and how (a refused attempt marks the peer lost).
    pub(super) connect_failed: HashMap<usize, String>,
    /// Notices for peers a link is being opened to, sent once it is open (see
    /// [`Bootstrap::send_notice`](crate::bootstrap::Bootstrap::send_notice)).
    pub(super) pending_notices: HashMap<usize, Vec<Vec<u8>>>,
    pub(super) commands: Vec<Command>,
    /// Set by the poller as its last act.
    pub(super) stopped: bool,
}

impl State {
    /// The oldest message from `peer` under `tag`, if one is waiting.
    pub(super) fn take(&mut self, peer: usize, tag: u64) -> Option<Vec<u8>> {
        let queue = self.queues.get_mut(&(peer, tag))?;
        let message = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&(peer, tag));
        }
        message
    }

    /// Records why `peer` is gone (the first reason stays).
    pub(super) fn mark_lost(&mut self, peer: usize, reason: String) {
        if let Some(slot) = self.lost.get_mut(peer) {
            slot.get_or_insert(reason);
        }
    }

    /// Adds an established link; it becomes `peer`'s sending link if that has none.
    pub(super) fn add_link(&mut self, link: Arc<Link>) {
        self.connecting.remove(&link.peer);
        self.connect_failed.remove(&link.peer);
        self.senders.entry(link.peer).or_insert_with(|| Arc::clone(&link));
        self.links.push(link);
    }

    /// Forgets a link that ended (its socket closes once no sender holds it any more).
    pub(super) fn remove_link(&mut self, link: &Arc<Link>) {
        self.links.retain(|l| !Arc::ptr_eq(l, link));
        if self.senders.get(&link.peer).is_some_and(|l| Arc::ptr_eq(l, link)) {
            self.senders.remove(&link.peer);
        }
    }
}

/// The state one rank's poller and calling threads share.
pub(super) struct Shared {
    state: Mutex<State>,
    /// Notified on every delivered message, new link, failed link attempt and lost peer.
    pub(super) changed: Condvar,
    /// Written (one byte) to wake the poller for a command.
    wake: UnixStream,
}

impl Shared {
    /// Shared state of a job of `world_size` ranks; the poller reads the other end of `wake`.
    pub(super) fn new(world_size: usize, wake: UnixStream) -> Self {
        Shared {
            state: Mutex::new(State {
                queues: HashMap::new(),
                notices: VecDeque::new(),
                lost: vec![None; world_size],
                senders: HashMap::new(),
                links: Vec::new(),
                connecting: HashSet::new(),
                connect_failed: HashMap::new(),
                pending_notices: HashMap::new(),
                commands: Vec::new(),
                stopped: false,
            }),
            changed: Condvar::new(),
            wake,
        }
    }

    /// Locks the state (a poisoned lock is taken over: every update is a single push, pop or
    /// assignment, so the state stays consistent).
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Files a message from `peer` under `tag` (a notice in the queue of notices) and wakes
    /// the waiters.
    pub(super) fn deliver(&self, peer: usize, tag: u64, payload: Vec<u8>) {
        let mut state = self.lock();
        if tag == crate::bootstrap::TAG_NOTICE {
            state.notices.push_back((peer, payload));
        } else {
            state.queues.entry((peer, tag)).or_default().push_back(payload);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Queues a command (the lock is held by the caller) and wakes the poller.
    pub(super) fn command(&self, state: &mut State, command: Command) {
        state.commands.push(command);
        // A full socket buffer means a wake-up is already pending.
        let _ = (&self.wake).write(&[1]);
    }
}
