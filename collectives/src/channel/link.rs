//! A link: the two-way message path between this rank and one peer that every channel
//! algorithm runs over, built only from a [`Connection`] (write, update-and-sync) — or, where
//! the peer's region is mapped here, from plain stores into it.
//!
//! Each side owns one region that the other side writes into:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 8 | `ready`: messages the peer has posted into this region (monotonic; staged posting) |
//! | 64 | 8 | `freed`: messages of *this* rank the peer has consumed (monotonic) |
//! | 128 | 8 | a [`Doorbell`] the peer rings after each store into this region (posting directly) |
//! | 4096 + i·S | S | slot `i` of `SLOTS`: a 32-byte header, then up to `S - 32` bytes of payload |
//!
//! The header is four words: the message's sequence number; the call number (modulo 2³²) and
//! the call's signature; its count; and root, payload length and marks packed into one word
//! (see [`Header`]). A payload of up to 32 bytes shares the slot's first cache line with its
//! header.
//!
//! Message `m` (counted from 1) travels in slot `(m - 1) % SLOTS`. To post it, the sender waits
//! for a credit (`freed ≥ m - SLOTS`: the peer is done with the slot's previous message), then
//! posts it one of two ways, fixed per link (see [`Posting`]):
//! - **direct**, when the peer's region is mapped here (shared memory): payload and header go
//!   straight into the peer's slot, the sequence word last with release ordering; the receiver
//!   polls that word, so a small message costs the receiver one cache line;
//! - **staged**, otherwise: header and payload are staged in the same slot of a private outbox
//!   and written into the peer's region through the connection, then `ready = m` is stored with
//!   update-and-sync, which the connection orders after the write (both in one
//!   `write_and_sync`, which TCP sends with one system call); the receiver polls `ready`.
//!
//! Either way the receiver checks the header (never trusting a length from the wire), uses the
//! payload in place, and releases the slot by storing `freed` into the sender's region — after
//! every message, or, on a link built with a *credit batch* of `b` messages, after every `b`-th:
//! the sender then reloads `freed` once per `b` messages instead of once per message, and the
//! word stops bouncing between the two caches on every call. A batch holds back at most
//! `b - 1 < SLOTS` credits, so a receiver that has taken every message posted to it has always
//! returned enough for the next one; only algorithms whose receivers wait for nothing but the
//! sender's next message may batch (the eager ones), since a receiver that held credits back
//! while waiting for a third rank could make a cycle of waits that per-message credits avoid. Every
//! wait polls only local memory and is bounded by the timeout, the abort flag and the peer's
//! health; while it spins it calls the connection's `progress`, so a transport that stores the
//! peer's bytes in software (TCP) does so on the waiting thread. Both ends choose the same
//! posting (the peer's region is mapped on both sides or on neither); a staged sequence word
//! carries [`STAGED_MARK`], so ends that disagree fail with a protocol error instead of reading
//! a message before it is whole.
//!
//! Posting directly, a sender rings the receiver's doorbell after storing a sequence word and
//! a receiver rings the sender's after storing `freed` (a load while nobody sleeps, and a fence
//! on a crowded host), so a waiter that has gone to sleep on its own region's doorbell wakes at
//! once. Staged, the transport stores into the region, and a sleeping waiter naps instead.
//!
//! Posting directly on a link that batches credits, a receiver that takes a message asks the
//! cache for the first lines of the peer's next slot right away: the sender of small
//! back-to-back messages runs ahead, so the next message is usually there already, and its
//! line crosses between the cores while this call finishes instead of at the start of the
//! next. Likewise a sender that posts a message asks for ownership of its next slot's lines,
//! where the credits it knows say the receiver is done with that slot.
//!
//! Where sender and receiver do the same work per message — a pair of ranks, each the other's
//! only peer — a receiver that has caught up with such a sender (its next message is not there
//! yet) waits a moment ([`CAUGHT_UP_PAUSE`]) before it looks at the message's line
//! ([`receive_paced`](Link::receive_paced)). Polling at once, it would hold that line shared
//! just as the sender writes it: the sender's store then waits for the line, the receiver's
//! next look fetches it back, and two transfers a message keep both ranks in step, at about
//! twice the pace of a sender that runs ahead — a state the pair would not leave by itself. A
//! moment off the line lets the sender get ahead again. A sender with several receivers (the
//! root of a larger broadcast) is slower than each of them anyway; they catch up every call,
//! and a pause would only delay them.
//!
//! A staged outbox slot of message `m` is reused by message `m + SLOTS`, which is posted only
//! after the peer freed `m` — so an asynchronous transport has finished reading it by then.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::connection::{CheckedWrite, Connection};
use comm_core::doorbell::Doorbell;
use comm_core::memory::{MemoryKind, RegisteredMemory};
use comm_core::slot_credits::SlotCredits;
use comm_core::spin::{WaitContext, wait_until_rung};
use comm_core::{Error, Result};

use super::header::{HEADER_BYTES, HEADER_WORDS, Header, MAX_SLOT_PAYLOAD};

/// Offset of the `ready` word.
const READY: usize = 0;
/// Offset of the `freed` word.
const FREED: usize = 64;
/// Offset of the region's doorbell.
const DOORBELL: usize = 128;
/// Offset of slot 0.
const SLOTS_OFFSET: usize = 4096;
/// Set in the sequence word of a staged message (see the module doc).
const STAGED_MARK: u64 = 1 << 63;

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

/// How this rank's messages reach the peer's region (see the module doc).
enum Posting {
    /// The peer's region is mapped here, at this address (checked to hold the whole layout,
    /// cache-line aligned): messages are stored straight into its slots.
    Direct { theirs_base: usize },
    /// Messages are staged in a private outbox (at `outbox_base`, checked likewise) and
    /// written through the connection.
    Staged { outbox: RegisteredMemory, outbox_base: usize },
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
    posting: Posting,
    /// Address of `mine` here, checked to be host memory holding the whole layout.
    mine_base: usize,
    slot_bytes: usize,
    /// Messages posted and consumed, credits known, and how often they go back (see the
    /// module doc).
    credits: SlotCredits,
    timeout: Duration,
    abort: Arc<AtomicBool>,
}

/// Checks that `mem` is host memory mapped here, holding `len` bytes at a cache-line aligned
/// address; returns the address.
fn mapped_base(mem: &RegisteredMemory, len: usize, what: &str, label: &str) -> Result<usize> {
    if !mem.is_host_mapped() {
        return Err(Error::Unsupported(format!("{label}: {what} is not host memory mapped in this process")));
    }
    mem.check_range(0, len)?;
    let base = mem.as_ptr() as usize;
    if !base.is_multiple_of(64) {
        return Err(Error::Unsupported(format!("{label}: {what} is not cache-line aligned")));
    }
    Ok(base)
}

impl Link {
    /// Pairwise: builds the link with `peer` (both ranks call it, in the same order relative to
    /// their other pairwise setups with each other), `slots` slots of `payload` bytes each way
    /// (rounded down to a power of two, at least one, so a message finds its slot by a mask),
    /// returning credits every `credit_batch` messages (rounded down to a power of two, at
    /// least one and at most `slots`; more than one only for eager algorithms, see the module
    /// doc).
    pub(crate) fn new(
        core: &CoreCommunicator,
        peer: usize,
        slots: usize,
        payload: usize,
        credit_batch: usize,
    ) -> Result<Self> {
        let credits = SlotCredits::new(slots, credit_batch);
        let slots = credits.slots();
        let label =
            format!("weave channel link {}<->{} ({slots} x {payload} B)", core.rank().min(peer), core.rank().max(peer));
        if payload > MAX_SLOT_PAYLOAD {
            return Err(Error::invalid(format!("{label}: a slot holds at most {MAX_SLOT_PAYLOAD} payload bytes")));
        }
        let slot_bytes = (HEADER_BYTES + payload).next_multiple_of(64);
        let len = SLOTS_OFFSET + slots * slot_bytes;
        let (mine, theirs) = core.exchange_pair(peer, len, &label)?;
        // Checked once here, so that the accessors below work on plain addresses.
        let mine_base = mapped_base(&mine, len, "this rank's region", &label)?;
        // The first pass over the slots would otherwise take a page fault per slot on both
        // sides; small calls feel that.
        prefault(&mine, len, false);
        let posting = match mapped_base(&theirs, len, "the peer's region", &label) {
            Ok(theirs_base) => {
                prefault(&theirs, len, false);
                Posting::Direct { theirs_base }
            }
            Err(_) => {
                let outbox = core.register_private(len, MemoryKind::Host, &format!("{label} outbox"))?;
                let outbox_base = mapped_base(&outbox, len, "the outbox", &label)?;
                prefault(&outbox, len, true);
                Posting::Staged { outbox, outbox_base }
            }
        };
        let connection = core.connection_via(peer, theirs.transport())?;
        Ok(Link {
            peer,
            connection,
            _mine: mine,
            theirs,
            posting,
            mine_base,
            slot_bytes,
            credits,
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

    /// The word at `offset` of the region at `base` (this rank's or, posting directly, the
    /// peer's).
    ///
    /// # Safety
    /// `base` is `mine_base` or a direct posting's `theirs_base` of a link that outlives `'a`,
    /// and `offset` an 8-byte aligned word inside the layout.
    unsafe fn word_at<'a>(base: usize, offset: usize) -> &'a AtomicU64 {
        // SAFETY: the caller names a word inside a region checked to be cache-line aligned
        // host memory holding the whole layout, which the link keeps mapped while it lives
        // (and it outlives the reference). Both sides write the control and sequence words
        // only atomically.
        unsafe { AtomicU64::from_ptr((base + offset) as *mut u64) }
    }

    /// The control word at `offset` (`READY` or `FREED`) of this rank's region.
    #[inline]
    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: mine_base, and READY or FREED lie inside the layout.
        unsafe { Self::word_at(self.mine_base, offset) }
    }

    /// Offset of the slot of message `message + 1` (slots are a power of two).
    #[inline]
    fn slot_offset(&self, message: u64) -> usize {
        SLOTS_OFFSET + self.credits.slot_after(message) * self.slot_bytes
    }

    /// The doorbell of the region at `base` (this rank's, or posting directly the peer's).
    ///
    /// # Safety
    /// As for [`word_at`](Self::word_at).
    unsafe fn doorbell_at(&self, base: usize) -> &Doorbell {
        // SAFETY: the caller names a region checked to hold the layout (DOORBELL lies inside
        // its control page, 8-byte aligned), mapped while the link lives, zeroed when made;
        // both sides access these bytes only as a doorbell.
        unsafe { Doorbell::from_ptr((base + DOORBELL) as *mut u8) }
    }

    /// Waits until `ready()`, making the connection's receive progress on every iteration:
    /// what this rank waits for is written by the peer through it, so a transport that stores
    /// incoming bytes in software (TCP) stores them on this thread, without a wake-up. Posting
    /// directly, a wait that sleeps does so on this rank's doorbell, which the peer rings.
    fn wait(&self, operation: &str, ready: impl FnMut() -> bool) -> Result<()> {
        let check = || self.connection.check_peer();
        let progress = || self.connection.progress();
        let ctx = WaitContext {
            operation,
            peer: Some(self.peer),
            timeout: self.timeout,
            abort: &self.abort,
            check_peer: &check,
        };
        let doorbell = match self.posting {
            // SAFETY: mine_base.
            Posting::Direct { .. } => Some(unsafe { self.doorbell_at(self.mine_base) }),
            Posting::Staged { .. } => None,
        };
        wait_until_rung(&ctx, doorbell, &progress, ready)
    }

    /// `Err(PeerLost)` once the transport knows the peer is gone.
    pub(crate) fn check_peer(&self) -> Result<()> {
        self.connection.check_peer()
    }

    /// Whether the next message may be posted now (the peer freed its slot).
    #[inline]
    pub(crate) fn has_credit(&mut self) -> bool {
        // SAFETY: mine_base, and FREED lies inside the layout; the reference ends with the call.
        let freed = unsafe { Self::word_at(self.mine_base, FREED) };
        self.credits.has_credit(freed)
    }

    /// Waits until the next message may be posted, then returns where to put its payload
    /// (valid for [`payload`](Self::payload) bytes until [`post`](Self::post)): the peer's
    /// slot itself when posting directly, else the outbox.
    #[inline(always)]
    pub(crate) fn outbox(&mut self, operation: &str) -> Result<*mut u8> {
        if !self.has_credit() {
            self.wait_for_credit(operation)?;
        }
        let base = match &self.posting {
            Posting::Direct { theirs_base } => *theirs_base,
            Posting::Staged { outbox_base, .. } => *outbox_base,
        };
        // offset + payload lies inside the region (checked to hold the layout), which stays
        // mapped while the link lives; the peer is done with the slot (the credit above).
        Ok((base + self.slot_offset(self.credits.posted()) + HEADER_BYTES) as *mut u8)
    }

    /// Waits until the peer has freed the slot of the next message (out of line: a sender that
    /// has run a whole ring of slots ahead waits anyway).
    #[inline(never)]
    fn wait_for_credit(&mut self, operation: &str) -> Result<()> {
        let limit = self.credits.credit_limit();
        // SAFETY: as in `has_credit`.
        let word = unsafe { Self::word_at(self.mine_base, FREED) };
        self.wait(operation, || word.load(Ordering::Acquire) >= limit)?;
        self.credits.refresh(word);
        Ok(())
    }

    /// Posts the next message: `header` and the first `header.len` bytes put where
    /// [`outbox`](Self::outbox) said. Call only after `outbox` returned for this message.
    #[inline(always)]
    pub(crate) fn post(&mut self, header: Header) -> Result<()> {
        let len = usize::try_from(header.len).unwrap_or(usize::MAX);
        if len > self.payload() {
            return Err(too_long_to_post(len, self.payload()));
        }
        let offset = self.slot_offset(self.credits.posted());
        let sequence = self.credits.next_sequence();
        match &self.posting {
            Posting::Direct { theirs_base } => {
                // SAFETY: the slot's header lies inside the peer's region (checked to hold the
                // layout, 64-byte aligned, mapped while the link lives); the peer reads it only
                // after the sequence word stored below and has freed the slot's previous
                // message (the credit `outbox` waited for).
                unsafe {
                    let words = (theirs_base + offset + 8) as *mut [u64; HEADER_WORDS - 1];
                    words.write(header.to_words());
                    Self::word_at(*theirs_base, offset).store(sequence, Ordering::Release);
                    self.doorbell_at(*theirs_base).ring();
                }
                self.credits.note_posted();
                self.prefetch_next_slot(*theirs_base, len);
                Ok(())
            }
            Posting::Staged { outbox, outbox_base } => {
                self.post_staged((outbox, *outbox_base), header.to_words(), offset, len)?;
                self.credits.note_posted();
                Ok(())
            }
        }
    }

    /// Posting directly into the peer's region at `theirs_base`, asks for the lines of the slot
    /// of this rank's next message, as many as one of `len` bytes takes (at most
    /// [`PREFETCH_LINES`]), to be made this core's own — but only where the credits known
    /// already say the peer is done with that slot, so the hint never takes a line the peer
    /// still reads. A store to a line another core holds waits for it, and on x86 every later
    /// store of the thread queues behind; asked for now, the line is here by the next post.
    #[inline(always)]
    fn prefetch_next_slot(&self, theirs_base: usize, len: usize) {
        if self.sender_runs_ahead() && self.credits.knows_credit() {
            let next = theirs_base + self.slot_offset(self.credits.posted());
            for line in 0..(HEADER_BYTES + len).div_ceil(64).min(PREFETCH_LINES) {
                prefetch_for_write(next + 64 * line);
            }
        }
    }

    /// [`post`](Self::post) of a staged link, whose outbox (and its address) is `outbox`: the
    /// header `words` into the outbox slot at `offset`, whose payload is `len` bytes, then both
    /// and `ready` through the connection (out of line: the system calls and copies of a
    /// transport dwarf the call).
    #[inline(never)]
    fn post_staged(
        &self,
        (outbox, outbox_base): (&RegisteredMemory, usize),
        words: [u64; HEADER_WORDS - 1],
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let sequence = self.credits.next_sequence();
        // SAFETY: the slot's header lies inside the outbox (checked to hold the layout, 64-byte
        // aligned), private memory that only this rank writes; the transport reads it only
        // inside `write` below, or — asynchronously — before the peer frees the slot, which it
        // must have done before this slot is used again.
        unsafe {
            let slot = (outbox_base + offset) as *mut u64;
            slot.write(sequence | STAGED_MARK);
            (slot.add(1) as *mut [u64; HEADER_WORDS - 1]).write(words);
        }
        // Payload and `ready` in one operation: a transport may send them as one message.
        let write = CheckedWrite::new(&self.theirs, offset, outbox, offset, HEADER_BYTES + len)?;
        self.connection.write_and_sync(write, READY, sequence)
    }

    /// The sequence word the peer's next message carries, and the word to poll for it (the
    /// slot's sequence word posting directly, `ready` staged), with the value it reaches.
    #[inline]
    fn next_arrival(&self) -> (u64, &AtomicU64, u64) {
        let target = self.credits.next_arrival();
        match self.posting {
            Posting::Direct { .. } => {
                // SAFETY: mine_base, and the slot's first word lies inside the layout.
                let word = unsafe { Self::word_at(self.mine_base, self.slot_offset(self.credits.consumed())) };
                (target, word, target)
            }
            Posting::Staged { .. } => (target | STAGED_MARK, self.word(READY), target),
        }
    }

    /// Whether the peer's next message has arrived.
    pub(crate) fn has_message(&self) -> bool {
        let (_, word, target) = self.next_arrival();
        word.load(Ordering::Acquire) & !STAGED_MARK >= target
    }

    /// Waits until the peer's next message has arrived; with `pause`, on a link whose sender
    /// runs ahead, posting directly, the receiver first stays off the message's line for
    /// [`CAUGHT_UP_PAUSE`] (see the module doc).
    #[inline(never)]
    fn wait_for_message(&self, operation: &str, pause: bool) -> Result<()> {
        let (_, word, target) = self.next_arrival();
        if pause && self.sender_runs_ahead() && matches!(self.posting, Posting::Direct { .. }) {
            let start = Instant::now();
            while start.elapsed() < CAUGHT_UP_PAUSE {
                std::hint::spin_loop();
            }
        }
        self.wait(operation, || word.load(Ordering::Acquire) & !STAGED_MARK >= target)
    }

    /// Waits for the peer's next message; returns its header and payload (valid until
    /// [`release`](Self::release)). A header whose length exceeds the slot, or a sequence word
    /// other than the one expected, is a protocol error.
    #[inline(always)]
    pub(crate) fn receive(&mut self, operation: &str) -> Result<(Header, *const u8)> {
        self.receive_paced(operation, false)
    }

    /// [`receive`](Self::receive) by a receiver that, with `caught_up_pause`, pauses before it
    /// polls when the message is not there yet: for ranks that are each other's only peer,
    /// which do the same work per message (see the module doc).
    #[inline(always)]
    pub(crate) fn receive_paced(&mut self, operation: &str, caught_up_pause: bool) -> Result<(Header, *const u8)> {
        let (sequence, word, target) = self.next_arrival();
        if word.load(Ordering::Acquire) & !STAGED_MARK < target {
            self.wait_for_message(operation, caught_up_pause)?;
        }
        let offset = self.slot_offset(self.credits.consumed());
        // SAFETY: the slot's header lies inside this rank's region (checked to hold the layout,
        // 64-byte aligned); the peer wrote it before the store observed above with acquire
        // ordering and writes the slot again only after this rank releases it.
        let (found, words) = unsafe {
            let slot = (self.mine_base + offset) as *const u64;
            (
                Self::word_at(self.mine_base, offset).load(Ordering::Acquire),
                (slot.add(1) as *const [u64; HEADER_WORDS - 1]).read(),
            )
        };
        if found != sequence {
            return Err(out_of_sequence(self.peer, found, sequence));
        }
        let header = Header::from_words(words);
        if header.len > self.payload() as u64 {
            return Err(too_long_received(self.peer, header.len, self.payload()));
        }
        self.prefetch_next_message(header.len);
        // The payload lies inside this rank's mapped region (slot layout), and the peer wrote it
        // before the store observed above with acquire ordering.
        Ok((header, (self.mine_base + offset + HEADER_BYTES) as *const u8))
    }

    /// Whether this link's senders run ahead of their receivers: a link that batches credits
    /// (an eager algorithm's, see the module doc). Only there do the prefetch hints pay: on a
    /// link whose receiver usually waits for the next message, it is polling the very line a
    /// hint would fetch, and the line would only cross between the cores once more.
    #[inline(always)]
    fn sender_runs_ahead(&self) -> bool {
        self.credits.batch() > 1
    }

    /// Posting directly, asks the cache for the lines the peer's next message will occupy if it
    /// is as long as the one received now (`len` bytes; at most [`PREFETCH_LINES`]): a sender
    /// that runs ahead has stored it already, and its lines then cross from the sender's cache
    /// while this rank finishes the current call, instead of stalling the next one. A line the
    /// sender has not written yet is usually still in this rank's cache from the slot's
    /// previous round, so there the hint costs little; only a line the sender is storing into
    /// at that moment moves once more.
    #[inline(always)]
    fn prefetch_next_message(&self, len: u64) {
        if self.sender_runs_ahead() && matches!(self.posting, Posting::Direct { .. }) {
            let next = self.mine_base + self.slot_offset(self.credits.consumed() + 1);
            let bytes = HEADER_BYTES.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
            for line in 0..bytes.div_ceil(64).min(PREFETCH_LINES) {
                prefetch_for_read(next + 64 * line);
            }
        }
    }

    /// Gives the slot of the message last received back to the peer (its credit goes back
    /// with the credit batch's last message).
    #[inline]
    pub(crate) fn release(&mut self) -> Result<()> {
        let Some(consumed) = self.credits.note_consumed() else {
            return Ok(());
        };
        match self.posting {
            Posting::Direct { theirs_base } => {
                // SAFETY: a direct posting's theirs_base, and FREED lies inside the layout.
                unsafe {
                    SlotCredits::return_credits(Self::word_at(theirs_base, FREED), consumed);
                    self.doorbell_at(theirs_base).ring();
                }
                Ok(())
            }
            // The peer needs this credit only to reuse the slot a few messages on: a network
            // transport sends it with its next frame, or before this rank waits.
            Posting::Staged { .. } => self.connection.update_lazily(&self.theirs, FREED, consumed),
        }
    }
}

/// How long a receiver that has caught up with a sender running ahead (its next message is
/// not there yet) waits before it looks at the message's line: long enough for a sender to
/// post a message or two. Looking at once, it would hold the line the sender is about to
/// write, each message would then cost both ranks two line transfers, and the pair would stay
/// in step at that pace (see the module doc).
const CAUGHT_UP_PAUSE: Duration = Duration::from_nanos(200);

/// Lines of the peer's next message a receiver asks the cache for ahead of time: the header
/// and up to 224 bytes of payload (the hardware prefetchers follow a longer copy themselves).
const PREFETCH_LINES: usize = 4;

/// A hint that the cache line holding `addr` will be read soon. A prefetch never faults, so any
/// address may be named; elsewhere than x86-64 it does nothing.
#[inline(always)]
fn prefetch_for_read(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only moves a line into the cache: it reads no value, changes no
    // memory and never faults, whatever the address; SSE is part of every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// A hint that the cache line holding `addr` will be written soon: the line is fetched for
/// ownership. A prefetch never faults, so any address may be named; elsewhere than x86-64 it
/// does nothing.
#[inline(always)]
fn prefetch_for_write(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW only moves a line into the cache: it reads no value, changes no memory
    // and never faults, whatever the address. x86-64 CPUs without it (Intel before Broadwell)
    // execute it as a no-op; it is written out because the compiler turns a write prefetch
    // into a read prefetch unless the build targets such CPUs only.
    unsafe {
        std::arch::asm!("prefetchw byte ptr [{0}]", in(reg) addr, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// The error of a message longer than the link's slots (a caller's bug), kept off the path of
/// every post.
#[cold]
#[inline(never)]
fn too_long_to_post(len: usize, payload: usize) -> Error {
    Error::invalid(format!("channel message of {len} bytes exceeds the {payload}-byte slot"))
}

/// The error of a slot whose sequence word is not the one due, kept off the path of every
/// receive.
#[cold]
#[inline(never)]
fn out_of_sequence(peer: usize, found: u64, due: u64) -> Error {
    Error::protocol(format!(
        "rank {peer} posted message {found:#x} where message {due:#x} was due (a lost or repeated message, or two \
         ends that disagree on whether they post directly)"
    ))
}

/// The error of a received header whose length exceeds the slot, kept off the path of every
/// receive.
#[cold]
#[inline(never)]
fn too_long_received(peer: usize, len: u64, payload: usize) -> Error {
    Error::protocol(format!("rank {peer} sent a channel message of {len} bytes into a {payload}-byte slot"))
}
