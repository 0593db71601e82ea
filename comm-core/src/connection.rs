//! Connections: how one rank moves bytes into a peer's registered memory.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::memory::RegisteredMemory;
use crate::spin::{WaitContext, spin_until_progress};
use crate::transport::Transport;

/// A one-way data path from this rank to one peer, built by a transport.
///
/// Writes may complete asynchronously; [`update_and_sync`](Connection::update_and_sync) is
/// ordered after every earlier [`write`](Connection::write) on the same connection, and
/// [`flush`](Connection::flush) waits until everything issued so far is visible at the peer.
pub trait Connection: Send + Sync {
    /// The transport that built this connection.
    fn transport(&self) -> Transport;

    /// The peer rank at the other end.
    fn peer(&self) -> usize;

    /// Copies `len` bytes from `src[src_offset..]` (local) to `dst[dst_offset..]` (usually the
    /// peer's). Both ranges are checked first ([`CheckedWrite::new`]): out of range is
    /// [`Error::InvalidArgument`]. Transports implement [`write_checked`](Self::write_checked).
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_offset: usize,
        src: &RegisteredMemory,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.write_checked(CheckedWrite::new(dst, dst_offset, src, src_offset, len)?)
    }

    /// Does a [`write`](Self::write) whose ranges were checked: the transport's own copy.
    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<()>;

    /// Stores `value` into the 8-byte word at `dst[dst_offset]`, visible to the peer only after
    /// every earlier write of this connection (release ordering). Used for semaphores and flags.
    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()>;

    /// [`update_and_sync`](Self::update_and_sync) that the transport may hold back until it
    /// next sends to this peer, until this process next waits on this peer, or until any of its
    /// waits outlasts its spin ([`crate::deferred`]), whichever comes first. For stores the peer needs only for a later
    /// step — a slot credit — never for one it waits on now. The default stores at once.
    fn update_lazily(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        self.update_and_sync(dst, dst_offset, value)
    }

    /// Does [`write_checked`](Self::write_checked) and then [`update_and_sync`](Self::update_and_sync)
    /// of the word at `write.dst[flag_offset]` — data and the flag that announces it, the way
    /// a channel link posts a message — as one operation that a transport may send as one
    /// message (TCP: one system call). The default calls the two in turn.
    fn write_and_sync(&self, write: CheckedWrite<'_>, flag_offset: usize, value: u64) -> Result<()> {
        self.write_checked(write)?;
        self.update_and_sync(write.dst, flag_offset, value)
    }

    /// Waits (bounded) until every earlier write and update is complete at the peer.
    fn flush(&self) -> Result<()>;

    /// Makes receive progress for this connection's *peer*: applies, without blocking, what
    /// the peer has sent to this rank that already arrived (the reverse direction of
    /// [`write`](Self::write), through the same transport). A thread that spins on memory this
    /// peer writes calls it on every iteration (channel links do, through
    /// [`spin_until_progress`]), so that a transport whose
    /// incoming bytes are stored by software (TCP) stores them on the waiting thread instead of
    /// waking a thread of its own first. It must return quickly: no blocking, no sleeping;
    /// another thread already at work on the same bytes is a reason to return at once. A
    /// transport that holds a store back for this peer ([`update_lazily`](Self::update_lazily))
    /// sends it here: the wait may be for what the peer does once it has it.
    ///
    /// The default does nothing, which is right wherever the peer's writes land by themselves
    /// (shared memory, RDMA) or a transport's own thread stores them. `Err(PeerLost)` when it
    /// found the peer's stream broken.
    fn progress(&self) -> Result<()> {
        Ok(())
    }

    /// `Err(PeerLost)` once the transport knows the peer is gone; cheap enough to call while
    /// spinning.
    fn check_peer(&self) -> Result<()> {
        Ok(())
    }

    /// Called once as the communicator goes, before its memory is released: lets what this
    /// rank posted reach the peer (bounded), where releasing memory first could lose it. Over
    /// RDMA, a peer's write into memory already deregistered here breaks the queue pair, and
    /// with it this rank's last writes still on the wire, which the peer may be waiting for.
    ///
    /// The default does nothing, which is right wherever a write is complete when it returns
    /// or the transport delivers what it accepted on its own (shared memory, TCP).
    fn finish_before_release(&self) {}
}

/// The arguments of one [`Connection::write`] after its two ranges were checked: what a
/// transport's [`Connection::write_checked`] receives. Only [`new`](Self::new) makes one (the
/// type is `non_exhaustive`), so a transport never sees a range outside its region.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CheckedWrite<'a> {
    /// Where the bytes go (usually the peer's memory).
    pub dst: &'a RegisteredMemory,
    /// Offset in `dst` of the first byte written.
    pub dst_offset: usize,
    /// Where the bytes come from (this rank's memory).
    pub src: &'a RegisteredMemory,
    /// Offset in `src` of the first byte read.
    pub src_offset: usize,
    /// Bytes to copy.
    pub len: usize,
}

impl<'a> CheckedWrite<'a> {
    /// A write of `len` bytes from `src[src_offset..]` to `dst[dst_offset..]` once both ranges
    /// lie inside their regions, else [`Error::InvalidArgument`] naming the region, its owner
    /// and its length.
    #[inline]
    pub fn new(
        dst: &'a RegisteredMemory,
        dst_offset: usize,
        src: &'a RegisteredMemory,
        src_offset: usize,
        len: usize,
    ) -> Result<Self> {
        dst.check_range(dst_offset, len)?;
        src.check_range(src_offset, len)?;
        Ok(CheckedWrite { dst, dst_offset, src, src_offset, len })
    }
}

/// The region of `dst` as `R`, the handle type a network transport's `import` makes for a peer's
/// memory, checked to belong to `peer` (as the transport numbers ranks:
/// [`RegisteredMemory::transport_owner`]): a connection writes only into its own peer's memory
/// imported through its own transport. Otherwise [`Error::InvalidArgument`] naming both.
pub fn peer_region<'a, R: std::any::Any>(dst: &'a RegisteredMemory, peer: usize, transport: &str) -> Result<&'a R> {
    let region = dst.region().as_any().downcast_ref::<R>().ok_or_else(|| {
        Error::invalid(format!(
            "{transport} connection to rank {peer}: {:?} is not a peer's {transport} region",
            dst.label()
        ))
    })?;
    if dst.transport_owner() != peer {
        return Err(Error::invalid(format!(
            "{transport} connection to rank {peer}: {:?} belongs to rank {}",
            dst.label(),
            dst.transport_owner()
        )));
    }
    Ok(region)
}

/// Spins until `done()` holds for `connection` (a flush, say, named `operation` in errors):
/// bounded by `timeout`, stopped by `abort`, and ended once the connection's
/// [`check_peer`](Connection::check_peer) fails; every error names the operation and the peer.
/// Each iteration makes the connection's [`progress`](Connection::progress).
pub fn spin_until_peer(
    connection: &dyn Connection,
    operation: &str,
    timeout: Duration,
    abort: &AtomicBool,
    done: impl FnMut() -> bool,
) -> Result<()> {
    let check = || connection.check_peer();
    let wait = WaitContext { operation, peer: Some(connection.peer()), timeout, abort, check_peer: &check };
    spin_until_progress(&wait, &|| connection.progress(), done)
}

/// Tells whether a peer is still alive; transports supply one to [`DirectConnection`].
pub type PeerCheck = Box<dyn Fn() -> Result<()> + Send + Sync>;

/// A connection for transports whose imported memory is mapped into this process as host
/// memory (loopback, shared memory): writes are plain copies done by the calling thread.
pub struct DirectConnection {
    transport: Transport,
    peer: usize,
    check: PeerCheck,
}

impl DirectConnection {
    /// A direct connection to `peer`, with `check` telling whether the peer still lives.
    pub fn new(transport: Transport, peer: usize, check: PeerCheck) -> Self {
        DirectConnection { transport, peer, check }
    }

    fn mapped(&self, m: &RegisteredMemory, what: &str) -> Result<*mut u8> {
        if !m.is_host_mapped() {
            return Err(Error::invalid(format!(
                "{} connection to rank {}: {what} {:?} is not host memory mapped into this process",
                self.transport.name(),
                self.peer,
                m.label()
            )));
        }
        Ok(m.as_ptr())
    }
}

impl Connection for DirectConnection {
    fn transport(&self) -> Transport {
        self.transport
    }

    fn peer(&self) -> usize {
        self.peer
    }

    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<()> {
        let d = self.mapped(write.dst, "destination")?;
        let s = self.mapped(write.src, "source")?;
        if write.len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were checked to lie inside their mapped regions, which stay mapped
        // while `write` borrows them. `ptr::copy` allows overlap (a rank may copy within
        // one buffer). Concurrent access by other processes is ordered by semaphores.
        unsafe { std::ptr::copy(s.add(write.src_offset), d.add(write.dst_offset), write.len) };
        Ok(())
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        let word: &AtomicU64 = dst.atomic_u64(dst_offset)?;
        word.store(value, Ordering::Release);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        // Copies are done by the time `write` returns; a fence orders them for any observer.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.check_peer()
    }

    fn check_peer(&self) -> Result<()> {
        (self.check)()
    }
}
