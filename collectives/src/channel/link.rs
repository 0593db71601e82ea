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
const _: () = assert!(8 * Header::WORDS <= HEADER_BYTES);

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
    /// The sender's last message of the call to this receiver (set by the eager algorithms,
    /// whose receivers take messages until they see it, so that a mismatched call still
    /// leaves the link in step).
    pub(crate) last: bool,
}

impl Header {
    const WORDS: usize = 7;

    fn to_words(self) -> [u64; Self::WORDS] {
        [self.call, self.signature, self.count, self.root, u64::from(self.tainted), self.len, u64::from(self.last)]
    }

    fn from_words(w: [u64; Self::WORDS]) -> Self {
        Header { call: w[0], signature: w[1], count: w[2], root: w[3], tainted: w[4] != 0, len: w[5], last: w[6] != 0 }
    }
}

/// Maps every page of the first `len` bytes of `mem` (host memory mapped here, checked to hold
/// them) into this process: by reading a byte of each (shared memory, which a peer may be
/// writing), or by writing a zero to one (`write`: private memory no one else uses yet).
fn prefault(mem: &RegisteredMemory, len: usize, write: bool) {
    const PAGE: usize = 4096;
    let base = mem.as_ptr();
    for offset in (0..len).step_by(PAGE) {
        // SAFETY: offset < len, inside the mapped region (the caller checked). The read is
        // atomic, so a peer writing the same byte is no data race; the write goes only to
        // private memory that nothing reads yet.
        unsafe {
            let byte = base.add(offset);
            if write {
                byte.write_volatile(0);
            } else {
                std::sync::atomic::AtomicU8::from_ptr(byte).load(Ordering::Relaxed);
            }
        }
    }
}

/// The message path between this rank and one peer.
pub(crate) struct Link {
    peer: usize,
    connection: Arc<dyn Connection>,
    /// This rank's region: the peer's messages arrive here (read through `mine_base`; held to
    /// keep it mapped).
    _mine: RegisteredMemory,
    /// The peer's region: this rank's messages go there.
    theirs: RegisteredMemory,
    /// Private staging of this rank's messages (slot `i` mirrors slot `i` of `theirs`).
    outbox: RegisteredMemory,
    /// Address of `mine` here, checked to be host memory holding the whole layout.
    mine_base: usize,
    /// Address of `outbox` here, checked likewise.
    outbox_base: usize,
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
        // Checked once here, so that the accessors below work on plain addresses.
        mine.check_range(0, len)?;
        outbox.check_range(0, len)?;
        let (mine_base, outbox_base) = (mine.as_ptr() as usize, outbox.as_ptr() as usize);
        if !mine_base.is_multiple_of(64) || !outbox_base.is_multiple_of(64) {
            return Err(Error::Unsupported(format!("{label}: the region or its outbox is not cache-line aligned")));
        }
        // The first pass over the slots would otherwise take a page fault per slot on both
        // sides; small calls feel that.
        prefault(&mine, len, false);
        prefault(&outbox, len, true);
        if theirs.is_host_mapped() && theirs.check_range(0, len).is_ok() {
            prefault(&theirs, len, false);
        }
        let connection = core.connection_via(peer, theirs.transport())?;
        Ok(Link {
            peer,
            connection,
            _mine: mine,
            theirs,
            outbox,
            mine_base,
            outbox_base,
            slots,
            slot_bytes,
            posted: 0,
            consumed: 0,
            freed: 0,
            timeout: core.config().timeout,
            abort: core.abort_flag().clone(),
        })
    }

    /// The peer at the other end.
    pub(crate) fn peer(&self) -> usize {
        self.peer
    }

    /// Payload bytes one message carries at most.
    pub(crate) fn payload(&self) -> usize {
        self.slot_bytes - HEADER_BYTES
    }

    /// The control word at `offset` (`READY` or `FREED`) of this rank's region.
    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offset is READY or FREED, 8-byte aligned words inside the region, whose
        // address was checked to be cache-line aligned host memory holding the whole layout;
        // `mine` keeps it mapped while the link lives. The peer writes these words only
        // atomically.
        unsafe { AtomicU64::from_ptr((self.mine_base + offset) as *mut u64) }
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
        // offset + payload lies inside the outbox (checked to hold the region's layout), which
        // stays mapped while the link lives.
        Ok((self.outbox_base + self.slot_offset(self.posted) + HEADER_BYTES) as *mut u8)
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
        let words = header.to_words();
        // SAFETY: the slot's header lies inside the outbox (checked to hold the layout, 64-byte
        // aligned), private memory that only this rank writes; the transport reads it only
        // inside `write` below, or — asynchronously — before the peer frees the slot, which it
        // must have done before this slot is used again.
        unsafe { ((self.outbox_base + offset) as *mut [u64; Header::WORDS]).write(words) };
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
        // SAFETY: the slot's header lies inside this rank's region (checked to hold the layout,
        // 64-byte aligned); the peer wrote it before the `ready` store observed above with
        // acquire ordering and writes the slot again only after this rank releases it.
        let words = unsafe { ((self.mine_base + offset) as *const [u64; Header::WORDS]).read() };
        let header = Header::from_words(words);
        if header.len > self.payload() as u64 {
            return Err(Error::protocol(format!(
                "rank {} sent a channel message of {} bytes into a {}-byte slot",
                self.peer,
                header.len,
                self.payload()
            )));
        }
        // The payload lies inside this rank's mapped region (slot layout), and the peer wrote it
        // before the `ready` store observed above with acquire ordering.
        Ok((header, (self.mine_base + offset + HEADER_BYTES) as *const u8))
    }

    /// Gives the slot of the message last received back to the peer.
    pub(crate) fn release(&mut self) -> Result<()> {
        self.consumed += 1;
        self.connection.update_and_sync(&self.theirs, FREED, self.consumed)
    }
}
