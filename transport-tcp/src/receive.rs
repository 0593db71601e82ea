//! Applying a peer's frames: the state of each inbound socket, and the two kinds of thread that
//! drain it.
//!
//! Each inbound socket is an [`InSocket`]: the socket, the bytes read from it but not yet used,
//! and the frame it is part-way through ([`Partial`]), all behind one lock. Whoever holds the
//! lock reads only what the kernel already has (`recv` with `MSG_DONTWAIT`), applies every whole
//! frame and keeps the rest for the next holder, so no thread ever blocks on the socket while it
//! holds the lock, and a frame begun by one thread is finished by the next. Two kinds of thread
//! take the lock:
//!
//! - the **reader thread** of the socket's stripe number ([`crate::reader`]) waits in one
//!   `poll(2)` over that stripe's sockets *without* their locks, then takes each ready one's
//!   lock and drains it: it carries what arrives while nobody waits (large transfers, flush
//!   answers, the end of the stream);
//! - a rank **waiting** for memory this peer writes (a channel link's spin, through
//!   [`Connection::progress`](comm_core::connection::Connection::progress)) `try_lock`s every
//!   socket of the peer and drains it, so a small message is applied by the very thread that
//!   waits for it, with no thread wake-up on the way.
//!
//! While waiters **tend** a peer (one drained its sockets within [`TENDED_FOR`]), the stripe-0
//! reader — stripe 0 is where small messages travel — leaves the peer's socket out of its
//! `poll(2)` and drains it after a nap instead (the other stripes' readers go on draining
//! large writes beside the waiter): a thread asleep on a socket is woken by every segment
//! that lands, and the peer's sending system call pays for that wake-up (an inter-processor
//! interrupt, on a virtual machine an exit) on every small message. A napping reader wakes on
//! a timer of its own, which costs a core now and then: whether waiters tend is
//! [`Tending`](crate::config::Tending)'s choice. A reader never blocks on a lock either: a
//! waiter holding it is draining, so the reader naps and looks again.
//!
//! Frames are applied exactly once, in each socket's order; a flag or flush waits (in
//! [`Partial::Waiting`], without blocking) until the other stripes applied the data frames it
//! counts, and blocks its own socket meanwhile. Ranges are checked as [`crate::wire`] says;
//! garbage, a reset or an end of stream inside a frame is an error that marks the peer lost,
//! a clean end at a frame boundary a closed socket.

use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use comm_core::memory::MemoryRegion;
use comm_core::{Error, Result};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, recv};

use crate::config::MAX_SOCKETS;
use crate::listener::Inbound;
use crate::region::TcpRegion;
use crate::wire::{FRAME_HEADER_BYTES, FrameHeader, FrameKind};
use crate::writer::SocketWriter;

/// Bytes of an inbound socket's read buffer: one `recv` takes several small frames at once.
const BUFFER_BYTES: usize = 64 << 10;

/// How recently a waiter must have drained a peer's sockets for the peer's reader threads to
/// leave them to it (see the module doc). A waiter drains on every turn of its spin and
/// yield (the first millisecond of a wait), so this only lapses once it sleeps or is done.
pub(crate) const TENDED_FOR: Duration = Duration::from_micros(100);

/// What one sending peer's sockets share: the data frames applied per stripe (which its flags
/// wait for), and the sockets themselves, for waiters to drain.
#[derive(Default)]
pub(crate) struct PeerInbound {
    applied: [AtomicU64; MAX_SOCKETS],
    /// The peer's sockets, highest stripe first: data frames are drained before the flags on
    /// stripe 0 that wait for them.
    sockets: Mutex<Vec<Arc<InSocket>>>,
    /// When a waiter last drained this peer, in nanoseconds of [`since_start`].
    tended_at: AtomicU64,
    /// The highest of this rank's flushes to the peer that the peer answered.
    answered: AtomicU64,
}

/// Nanoseconds since this process first asked (a clock that fits an atomic word).
fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl PeerInbound {
    /// The highest of this rank's flushes to this peer that the peer has answered.
    pub(crate) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Acquire)
    }

    /// Whether a waiter drained this peer within [`TENDED_FOR`]: its stripe-0 reader naps then.
    pub(crate) fn tended(&self) -> bool {
        let at = self.tended_at.load(Ordering::Relaxed);
        at != 0 && since_start().saturating_sub(at) < TENDED_FOR.as_nanos() as u64
    }

    /// Adds a socket of this peer.
    pub(crate) fn add(&self, socket: Arc<InSocket>) {
        let mut sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        sockets.push(socket);
        sockets.sort_by_key(|s| std::cmp::Reverse(s.stripe));
    }

    /// Drains every socket of this peer that no other thread holds, without blocking: the
    /// waiter's side of the module doc. `Err` when a socket broke or lied (the peer is then
    /// marked lost, with `peer` naming it).
    pub(crate) fn progress(&self, peer: usize, inbound: &Inbound) -> Result<()> {
        if inbound.tending.tends() {
            // Never 0, which stands for "never tended".
            self.tended_at.store(since_start().max(1), Ordering::Relaxed);
        }
        // Another waiter of this rank is draining this peer: it does the work for both.
        let sockets = match self.sockets.try_lock() {
            Ok(s) => s,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(()),
        };
        // A second pass only when a flag waited for data that the first pass may have applied.
        for _ in 0..2 {
            let mut waiting = false;
            for socket in sockets.iter() {
                let mut state = match socket.state.try_lock() {
                    Ok(s) => s,
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(TryLockError::WouldBlock) => continue,
                };
                let outcome = socket.drain(&mut state, self, inbound);
                match &outcome {
                    Ok(Drained::Idle) => {}
                    Ok(Drained::Waiting) => waiting = true,
                    // Reported here, so neither this waiter nor the reader thread reads on.
                    Ok(Drained::Ended) => socket.end(&mut state, &outcome, peer, inbound),
                    Err(e) => {
                        let lost = Error::peer_lost(peer, "tcp receive", e.to_string());
                        socket.end(&mut state, &outcome, peer, inbound);
                        return Err(lost);
                    }
                }
            }
            if !waiting {
                break;
            }
        }
        Ok(())
    }
}

/// Where a socket's stream stands between two frames or inside one.
enum Partial {
    /// Expecting a frame header.
    Header,
    /// Copying a data frame's payload: `left` bytes still to store at `at` of `region`.
    Data { region: Arc<TcpRegion>, at: usize, left: usize },
    /// A flag or flush frame whose header was read; its per-stripe counts follow.
    Counts { header: FrameHeader, flag: Option<(Arc<TcpRegion>, usize)> },
    /// A flag (to store `header.value` into the word at `flag`) or flush (to answer), read
    /// whole, waiting until every stripe applied `counts` data frames; `since` is when it was
    /// first found waiting (the wait is bounded by the transport's timeout).
    Waiting { header: FrameHeader, flag: Option<(Arc<TcpRegion>, usize)>, counts: Vec<u64>, since: Option<Instant> },
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drained {
    /// Everything the kernel had is applied; more may come.
    Idle,
    /// A flag or flush waits for data frames of other stripes.
    Waiting,
    /// The peer closed the socket cleanly at a frame boundary (reported by [`InSocket::end`]).
    Ended,
}

/// What one holder of an [`InSocket`]'s lock works on.
pub(crate) struct SocketState {
    socket: TcpStream,
    buffer: Box<[u8]>,
    /// Bytes `start..end` of `buffer` were read and not yet used.
    start: usize,
    end: usize,
    frame: Partial,
    /// Set once the socket ended (cleanly or not) and was reported: nobody touches it again.
    pub(crate) ended: bool,
}

impl SocketState {
    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Takes `n` buffered bytes (the caller checked that there are).
    fn take(&mut self, n: usize) -> &[u8] {
        let at = self.start;
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        &self.buffer[at..at + n]
    }

    /// Reads what the kernel has into the buffer's free tail: `Ok(true)` when bytes came,
    /// `Ok(false)` when none are there yet; the end of the stream is an `UnexpectedEof` error.
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.end == self.buffer.len() {
            self.buffer.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let fd = self.socket.as_raw_fd();
        let n = receive(fd, &mut self.buffer[self.end..])?;
        self.end += n.unwrap_or(0);
        Ok(n.is_some())
    }
}

/// One `recv` without waiting: `Some(n)` bytes read, `None` when none are there; the end of the
/// stream is an `UnexpectedEof` error (`buf` is never empty here).
fn receive(fd: RawFd, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    loop {
        return match recv(fd, buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => Ok(Some(n)),
            Err(Errno::EAGAIN) => Ok(None),
            Err(Errno::EINTR) => continue,
            Err(e) => Err(std::io::Error::from(e)),
        };
    }
}

/// One socket to a peer, stripe `stripe` of `stripes` of the set it belongs to, as this rank
/// reads it: its reading state, and its writing end, where flushes are answered.
pub(crate) struct InSocket {
    /// The socket's stripe.
    pub(crate) stripe: u16,
    stripes: u16,
    /// The socket's descriptor, for `poll(2)` without the lock (valid while `state` lives).
    pub(crate) fd: RawFd,
    state: Mutex<SocketState>,
    writer: Arc<SocketWriter>,
}

impl InSocket {
    /// Wraps an authenticated socket, stripe `stripe` of `stripes`, whose writing end is
    /// `writer`.
    pub(crate) fn new(socket: TcpStream, stripe: u16, stripes: u16, writer: Arc<SocketWriter>) -> Self {
        let fd = socket.as_raw_fd();
        let state = SocketState {
            socket,
            buffer: vec![0u8; BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            frame: Partial::Header,
            ended: false,
        };
        InSocket { stripe, stripes, fd, state: Mutex::new(state), writer }
    }

    /// Takes the lock, waiting for another holder (for ending the socket).
    pub(crate) fn lock(&self) -> MutexGuard<'_, SocketState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the lock if nobody holds it (the reader thread's way: a holder is draining).
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, SocketState>> {
        match self.state.try_lock() {
            Ok(st) => Some(st),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Applies every whole frame the kernel already has, keeping a partial one for the next
    /// holder of the lock; never blocks on the socket's reading end, nor waits for its writing
    /// end (a flush answer another writer holds up goes out when it lets go, see
    /// [`crate::writer`]). An `Err` or [`Drained::Ended`] is reported by the caller
    /// through [`end`](Self::end).
    pub(crate) fn drain(&self, st: &mut SocketState, peer: &PeerInbound, inbound: &Inbound) -> Result<Drained> {
        if st.ended {
            return Ok(Drained::Ended);
        }
        loop {
            let at_boundary = matches!(st.frame, Partial::Header) && st.buffered() == 0;
            match self.step(st, peer, inbound) {
                Ok(Some(d)) => return Ok(d),
                Ok(None) => {}
                Err(StepError::Eof) if at_boundary => return Ok(Drained::Ended),
                Err(StepError::Eof) => return Err(Error::protocol("tcp stream ended inside a frame (truncated)")),
                Err(StepError::Other(e)) => return Err(e),
            }
        }
    }

    /// Moves the frame one step on: `Ok(None)` when it did, `Ok(Some(..))` when it cannot yet.
    fn step(
        &self,
        st: &mut SocketState,
        peer: &PeerInbound,
        inbound: &Inbound,
    ) -> std::result::Result<Option<Drained>, StepError> {
        let frame = std::mem::replace(&mut st.frame, Partial::Header);
        match frame {
            Partial::Header => {
                if st.buffered() < FRAME_HEADER_BYTES {
                    return more(st);
                }
                let bytes: &[u8; FRAME_HEADER_BYTES] =
                    st.take(FRAME_HEADER_BYTES).try_into().map_err(|_| Error::protocol("tcp frame header"))?;
                let header = FrameHeader::decode(bytes)?;
                st.frame = match header.kind {
                    FrameKind::Data => {
                        let len = header.value as usize;
                        let region = find(inbound, header.region, "data")?;
                        let at = usize::try_from(header.offset).map_err(|_| Error::protocol("tcp offset overflows"))?;
                        if at.checked_add(len).is_none_or(|end| end > region.len()) {
                            return Err(Error::protocol(format!(
                                "tcp data [{at}, +{len}) past the {} bytes of region {}",
                                region.len(),
                                header.region
                            ))
                            .into());
                        }
                        Partial::Data { region, at, left: len }
                    }
                    FrameKind::Flag => {
                        let region = find(inbound, header.region, "flag")?;
                        let at = usize::try_from(header.offset).map_err(|_| Error::protocol("tcp offset overflows"))?;
                        if !at.is_multiple_of(8) || at.checked_add(8).is_none_or(|end| end > region.len()) {
                            return Err(Error::protocol(format!(
                                "tcp flag at offset {at} of region {}",
                                header.region
                            ))
                            .into());
                        }
                        Partial::Counts { header, flag: Some((region, at)) }
                    }
                    FrameKind::Flush => Partial::Counts { header, flag: None },
                    FrameKind::Answer => {
                        peer.answered.fetch_max(header.sequence, Ordering::AcqRel);
                        Partial::Header
                    }
                };
                Ok(None)
            }
            Partial::Data { region, mut at, mut left } => {
                if left == 0 {
                    peer.applied[usize::from(self.stripe)].fetch_add(1, Ordering::Release);
                    return Ok(None);
                }
                let base = region.as_ptr();
                if st.buffered() > 0 {
                    let n = st.buffered().min(left);
                    let bytes = st.take(n);
                    // SAFETY: [at, at + n) lies inside the region (the frame's range was checked
                    // against it and `n` ≤ what is left of it), which the Arc keeps alive; the
                    // source is this socket's own buffer. The peer's protocol makes local
                    // readers wait for a later flag before they look at these bytes.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(at), n) };
                    (at, left) = (at + n, left - n);
                    st.frame = Partial::Data { region, at, left };
                    return Ok(None);
                }
                if left < BUFFER_BYTES / 2 {
                    st.frame = Partial::Data { region, at, left };
                    return more(st);
                }
                // A large payload goes straight into the region, skipping the buffer.
                // SAFETY: as above: [at, at + left) lies inside the live region.
                let dst = unsafe { std::slice::from_raw_parts_mut(base.add(at), left) };
                let n = receive(st.socket.as_raw_fd(), dst).map_err(StepError::from)?;
                match n {
                    Some(n) => {
                        st.frame = Partial::Data { region, at: at + n, left: left - n };
                        Ok(None)
                    }
                    None => {
                        st.frame = Partial::Data { region, at, left };
                        Ok(Some(Drained::Idle))
                    }
                }
            }
            Partial::Counts { header, flag } => {
                let need = 8 * usize::from(self.stripes);
                if st.buffered() < need {
                    st.frame = Partial::Counts { header, flag };
                    return more(st);
                }
                let counts = st.take(need).chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
                st.frame = Partial::Waiting { header, flag, counts: counts.collect(), since: None };
                Ok(None)
            }
            Partial::Waiting { header, flag, counts, since } => {
                let behind =
                    counts.iter().enumerate().position(|(s, &want)| peer.applied[s].load(Ordering::Acquire) < want);
                if let Some(stripe) = behind {
                    let since = since.unwrap_or_else(Instant::now);
                    if since.elapsed() > inbound.timeout {
                        return Err(Error::timeout(
                            format!("tcp data of stripe {stripe} before a flag"),
                            None,
                            since.elapsed(),
                        )
                        .into());
                    }
                    st.frame = Partial::Waiting { header, flag, counts, since: Some(since) };
                    return Ok(Some(Drained::Waiting));
                }
                match flag {
                    Some((region, at)) => {
                        // SAFETY: an aligned 8-byte word inside the live region (checked with the
                        // header); shared words are only ever accessed atomically.
                        let word = unsafe { &*region.as_ptr().add(at).cast::<AtomicU64>() };
                        word.store(header.value, Ordering::Release);
                    }
                    None => self.writer.answer(header.sequence).map_err(|e| Error::io("answer a tcp flush", e))?,
                }
                Ok(None)
            }
        }
    }

    /// Marks the socket ended after `outcome` (a drain's `Err` or [`Drained::Ended`]) and
    /// reports it: a clean end counts towards the peer's close, an error marks it lost (unless
    /// the listener is stopping). Only the first report counts. After a clean end the socket
    /// still carries this rank's frames to the peer (which only closed its own direction);
    /// after an error it carries nothing more.
    pub(crate) fn end(&self, st: &mut SocketState, outcome: &Result<Drained>, rank: usize, inbound: &Inbound) {
        if st.ended {
            return;
        }
        st.ended = true;
        if !inbound.stopping() {
            match outcome {
                Err(e) => inbound.mark_lost(rank, e.to_string()),
                Ok(_) => inbound.mark_closed(rank, self.stripes),
            }
        }
        let how = if outcome.is_err() { Shutdown::Both } else { Shutdown::Read };
        let _ = st.socket.shutdown(how);
    }
}

/// Why a step stopped: the stream ended, or something else failed.
enum StepError {
    Eof,
    Other(Error),
}

impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        StepError::Other(e)
    }
}

impl From<std::io::Error> for StepError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            StepError::Eof
        } else {
            StepError::Other(Error::io("read a tcp frame", e))
        }
    }
}

/// Reads more into the buffer: `None` (go on) when bytes came, `Some(Idle)` when none are there.
fn more(st: &mut SocketState) -> std::result::Result<Option<Drained>, StepError> {
    Ok(if st.fill()? { None } else { Some(Drained::Idle) })
}

/// The live region `id` of this rank, or a protocol error naming the frame `what`.
fn find(inbound: &Inbound, id: u64, what: &str) -> Result<Arc<TcpRegion>> {
    inbound.regions().find(id).ok_or_else(|| Error::protocol(format!("tcp {what} for region {id} that does not exist")))
}
