//! A link: the two-way message path between this rank and one peer that every channel
//! algorithm runs over, built only from a [`Connection`] (write, update-and-sync).
//!
//! Each side owns one region that the other side writes into:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 8 | `ready`: messages the peer has posted into this region (monotonic) |
//! | 64 | 8 | `freed`: messages of *this* rank the peer has consumed (monotonic) |
//! | 4096 + i·S | S | slot `i` of `SLOTS`: a 64-byte [`Header`], then up to `S - 64` bytes of payload |
//!
//! Message `m` (counted from 1) travels in slot `(m - 1) % SLOTS`. To post it, the sender waits
//! for a credit (`freed ≥ m - SLOTS`: the peer is done with the slot's previous message), stages
//! header and payload in the same slot of its private outbox, writes them into the peer's region
//! through the connection and then stores `ready = m` with update-and-sync, which the
//! connection orders after the write. The receiver waits for `ready ≥ m` on its own region,
//! checks the header (never trusting a length from the wire), uses the payload in place, and
//! releases the slot by storing `freed` into the sender's region. Every wait polls only local
//! memory and is bounded by the timeout, the abort flag and the peer's health.
//!
//! The outbox slot of message `m` is reused by message `m + SLOTS`, which is posted only after
//! the peer freed `m` — so an asynchronous transport has finished reading it by then.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::connection::Connection;
use comm_core::memory::{MemoryKind, RegisteredMemory};
use comm_core::spin::{WaitContext, spin_until};
use comm_core::{Error, Result};

/// Offset of the `ready` word.
const READY: usize = 0;
/// Offset of the `freed` word.
const FREED: usize = 64;
/// Offset of slot 0.
const SLOTS_OFFSET: usize = 4096;
/// Bytes of the header at the start of a slot.
pub(crate) const HEADER_BYTES: usize = 64;

/// What every message says about the call it belongs to; receivers check it against their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Header {
    /// The channel call this message belongs to (every rank counts calls the same way).
    pub(crate) call: u64,
    /// Collective, dtype, op and algorithm of the call, packed (see `host::signature`); the top
    /// bit marks a sender whose own arguments were invalid.
    pub(crate) signature: u64,
    /// Element count as the collective defines it (per pair for all-to-all-v).
    pub(crate) count: u64,
    /// Root rank, or 0.
    pub(crate) root: u64,
    /// Set when the sender (or a rank upstream of it) found a mismatch in this call.
    pub(crate) tainted: bool,
    /// Payload bytes of this message.
    pub(crate) len: u64,
}

impl Header {
    const WORDS: usize = 6;

    fn to_words(self) -> [u64; Self::WORDS] {
        [self.call, self.signature, self.count, self.root, u64::from(self.tainted), self.len]
    }

    fn from_words(w: [u64; Self::WORDS]) -> Self {
        Header { call: w[0], signature: w[1], count: w[2], root: w[3], tainted: w[4] != 0, len: w[5] }
    }
}

/// The message path between this rank and one peer.
pub(crate) struct Link {
    peer: usize,
    connection: Arc<dyn Connection>,
    /// This rank's region: the peer's messages arrive here.
    mine: RegisteredMemory,
    /// The peer's region: this rank's messages go there.
    theirs: RegisteredMemory,
    /// Private staging of this rank's messages (slot `i` mirrors slot `i` of `theirs`).
    outbox: RegisteredMemory,
    slots: usize,
    slot_bytes: usize,
    /// Messages posted to the peer.
    posted: u64,
    /// Messages of the peer consumed.
    consumed: u64,
    /// Credits known: messages of this rank the peer has freed.
    freed: u64,
    timeout: Duration,
    abort: Arc<AtomicBool>,
}

impl Link {
    /// Pairwise: builds the link with `peer` (both ranks call it, in the same order relative to
    /// their other pairwise setups with each other), `slots` slots of `payload` bytes each way.
    pub(crate) fn new(core: &CoreCommunicator, peer: usize, slots: usize, payload: usize) -> Result<Self> {
        let slot_bytes = (HEADER_BYTES + payload).next_multiple_of(64);
        let len = SLOTS_OFFSET + slots * slot_bytes;
        let label =
            format!("weave channel link {}<->{} ({slots} x {payload} B)", core.rank().min(peer), core.rank().max(peer));
        let (mine, theirs) = core.exchange_pair(peer, len, &label)?;
        if !mine.is_host_mapped() {
            return Err(Error::Unsupported(format!("{label}: this rank's region is not host memory")));
        }
        let outbox = core.register_private(len, MemoryKind::Host, &format!("{label} outbox"))?;
        if !outbox.is_host_mapped() {
            return Err(Error::Unsupported(format!("{label}: the outbox is not host memory")));
        }
        // Checked once here, so the word accessors below cannot fail.
        mine.atomic_u64(READY)?;
        mine.atomic_u64(FREED)?;
        let connection = core.connection_via(peer, theirs.transport())?;
        Ok(Link {
            peer,
            connection,
            mine,
            theirs,
            outbox,
            slots,
            slot_bytes,
            posted: 0,
            consumed: 0,
            freed: 0,
            timeout: core.config().timeout,
            abort: core.abort_flag().clone(),
        })
    }

    /// Payload bytes one message carries at most.
    pub(crate) fn payload(&self) -> usize {
        self.slot_bytes - HEADER_BYTES
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        self.mine.atomic_u64(offset).expect("link words were checked when the link was built")
    }

    fn slot_offset(&self, message: u64) -> usize {
        SLOTS_OFFSET + (message % self.slots as u64) as usize * self.slot_bytes
    }

    fn wait(&self, operation: &str, ready: impl FnMut() -> bool) -> Result<()> {
        let check = || self.connection.check_peer();
        let ctx = WaitContext {
            operation,
            peer: Some(self.peer),
            timeout: self.timeout,
            abort: &self.abort,
            check_peer: &check,
        };
        spin_until(&ctx, ready)
    }

    /// `Err(PeerLost)` once the transport knows the peer is gone.
    pub(crate) fn check_peer(&self) -> Result<()> {
        self.connection.check_peer()
    }

    /// Whether the next message may be posted now (the peer freed its slot).
    pub(crate) fn has_credit(&mut self) -> bool {
        if self.posted < self.freed + self.slots as u64 {
            return true;
        }
        self.freed = self.word(FREED).load(Ordering::Acquire);
        self.posted < self.freed + self.slots as u64
    }

    /// Waits until the next message may be posted, then returns its payload area in the outbox
    /// (valid for [`payload`](Self::payload) bytes until [`post`](Self::post)).
    pub(crate) fn outbox(&mut self, operation: &str) -> Result<*mut u8> {
        if !self.has_credit() {
            let limit = self.posted + 1 - self.slots as u64;
            let word = self.word(FREED);
            self.wait(operation, || word.load(Ordering::Acquire) >= limit)?;
            self.freed = word.load(Ordering::Acquire);
        }
        let offset = self.slot_offset(self.posted) + HEADER_BYTES;
        // SAFETY: offset + payload lies inside the outbox (it has the region's layout), which
        // stays mapped while the link lives.
        Ok(unsafe { self.outbox.as_ptr().add(offset) })
    }

    /// Posts the next message: `header` and the first `header.len` bytes staged in
    /// [`outbox`](Self::outbox). Call only after `outbox` returned for this message.
    pub(crate) fn post(&mut self, header: Header) -> Result<()> {
        let len = usize::try_from(header.len).unwrap_or(usize::MAX);
        if len > self.payload() {
            return Err(Error::invalid(format!(
                "channel message of {len} bytes exceeds the {}-byte slot",
                self.payload()
            )));
        }
        let offset = self.slot_offset(self.posted);
        for (i, w) in header.to_words().into_iter().enumerate() {
            self.outbox.write_bytes(offset + 8 * i, &w.to_le_bytes())?;
        }
        self.connection.write(&self.theirs, offset, &self.outbox, offset, HEADER_BYTES + len)?;
        self.posted += 1;
        self.connection.update_and_sync(&self.theirs, READY, self.posted)
    }

    /// Whether the peer's next message has arrived.
    pub(crate) fn has_message(&self) -> bool {
        self.word(READY).load(Ordering::Acquire) > self.consumed
    }

    /// Waits for the peer's next message; returns its header and payload (valid until
    /// [`release`](Self::release)). A header whose length exceeds the slot is a protocol error.
    pub(crate) fn receive(&mut self, operation: &str) -> Result<(Header, *const u8)> {
        let target = self.consumed + 1;
        let word = self.word(READY);
        self.wait(operation, || word.load(Ordering::Acquire) >= target)?;
        let offset = self.slot_offset(self.consumed);
        let mut words = [0u64; Header::WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = self.mine.load_u64(offset + 8 * i)?;
        }
        let header = Header::from_words(words);
        if header.len > self.payload() as u64 {
            return Err(Error::protocol(format!(
                "rank {} sent a channel message of {} bytes into a {}-byte slot",
                self.peer,
                header.len,
                self.payload()
            )));
        }
        // SAFETY: the payload lies inside this rank's mapped region (slot layout), and the peer
        // wrote it before the `ready` store observed above with acquire ordering.
        Ok((header, unsafe { self.mine.as_ptr().add(offset + HEADER_BYTES) }))
    }

    /// Gives the slot of the message last received back to the peer.
    pub(crate) fn release(&mut self) -> Result<()> {
        self.consumed += 1;
        self.connection.update_and_sync(&self.theirs, FREED, self.consumed)
    }
}
