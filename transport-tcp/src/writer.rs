//! A socket's writing end, shared by the two users that write on it: this rank's connection to
//! the peer (its stripes' threads and callers writing small frames inline, see
//! [`crate::connection`]) and this rank's receiving side, which answers the peer's flushes on
//! the socket the flush came on (see [`crate::receive`]).
//!
//! Frames never interleave: every writer holds the lock for whole frames. The receiving side
//! never waits for the lock — it runs on a reader thread or inside a waiting rank's
//! `progress`, and a stripe's thread may hold the lock for a long write to a peer that is
//! itself busy writing to us. So an answer is *owed* ([`answer`](SocketWriter::answer)): it is
//! written at once if the socket is free, and otherwise by whoever holds the socket, right
//! after letting it go ([`send_owed`](SocketWriter::send_owed), which every writer calls).

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::wire::{FrameHeader, FrameKind};

/// One socket's writing end.
pub(crate) struct SocketWriter {
    stream: Mutex<TcpStream>,
    /// The highest flush sequence the peer asked an answer for on this socket.
    owed: AtomicU64,
    /// The highest flush sequence answered on this socket.
    answered: AtomicU64,
}

impl SocketWriter {
    /// The writing end of `stream` (a handle of its own: the reader keeps another).
    pub(crate) fn new(stream: TcpStream) -> Self {
        SocketWriter { stream: Mutex::new(stream), owed: AtomicU64::new(0), answered: AtomicU64::new(0) }
    }

    /// Takes the socket for whole frames. Call [`send_owed`](Self::send_owed) after letting
    /// it go.
    pub(crate) fn lock(&self) -> MutexGuard<'_, TcpStream> {
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Owes the peer the answer to its flush `sequence` and sends it unless another writer
    /// holds the socket (which then sends it when it lets go). An error is the socket's.
    pub(crate) fn answer(&self, sequence: u64) -> std::io::Result<()> {
        self.owed.fetch_max(sequence, Ordering::SeqCst);
        self.send_owed()
    }

    /// Sends the answer owed, if any, unless another writer holds the socket: every writer
    /// calls this after letting the socket go, so an answer owed while it wrote goes out then.
    pub(crate) fn send_owed(&self) -> std::io::Result<()> {
        loop {
            if self.owed.load(Ordering::SeqCst) <= self.answered.load(Ordering::SeqCst) {
                return Ok(());
            }
            let mut stream = match self.stream.try_lock() {
                Ok(s) => s,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                // The holder looks again once it lets go.
                Err(TryLockError::WouldBlock) => return Ok(()),
            };
            let owed = self.owed.load(Ordering::SeqCst);
            if owed > self.answered.load(Ordering::SeqCst) {
                let header = FrameHeader { kind: FrameKind::Answer, region: 0, offset: 0, value: 0, sequence: owed };
                stream.write_all(&header.encode())?;
                self.answered.store(owed, Ordering::SeqCst);
            }
        }
    }
}
