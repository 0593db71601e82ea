//! Slot credits: the flow control of a ring of message slots that one sender fills in a
//! receiver's memory and the receiver empties (a channel link's, in `collectives`).
//!
//! Message `m` (counted from 1) travels in slot `(m - 1) % slots`. The receiver keeps a
//! `freed` word in the *sender's* memory: how many messages it has consumed. The sender may
//! post message `m` once `freed ≥ m - slots` — the slot's previous message is consumed — and
//! publishes the message by storing its sequence number `m` (release) after its payload; the
//! receiver loads that word (acquire) before it reads the payload, and stores `freed`
//! (release) only after it is done reading.
//!
//! A receiver may hold its credits back and return them in batches of `batch` messages (a
//! power of two, at most `slots`): it stores `freed` after every `batch`-th message only. The
//! sender then reloads `freed` once per batch rather than once per message. A receiver that
//! has consumed everything posted to it has always returned enough credits for the next
//! message: it holds back at most `batch - 1 < slots`.
//!
//! [`SlotCredits`] is the arithmetic of both ends and the two loads and stores of `freed`. The
//! loom models (`crate::loom_models`) run it with a sender and a receiver over every
//! interleaving, checking that no slot is written while it is read and no wait hangs.

use std::sync::atomic::Ordering;

use crate::sync::AtomicU64;

/// One end's view of a slot ring: what it has posted, consumed, and knows to be freed.
#[derive(Debug, Clone)]
pub struct SlotCredits {
    slots: u64,
    batch: u64,
    /// Messages posted to the peer.
    posted: u64,
    /// Messages of the peer consumed.
    consumed: u64,
    /// Credits known: messages of this end the peer has freed.
    freed: u64,
}

impl SlotCredits {
    /// The credits of a ring of `slots` slots (rounded down to a power of two, at least one),
    /// whose receiver returns credits every `batch` messages (rounded down to a power of two,
    /// at least one, at most `slots`).
    pub fn new(slots: usize, batch: usize) -> Self {
        let slots = 1u64 << slots.max(1).ilog2();
        let batch = 1u64 << (batch.max(1) as u64).min(slots).ilog2();
        SlotCredits { slots, batch, posted: 0, consumed: 0, freed: 0 }
    }

    /// Slots in the ring (a power of two).
    #[inline]
    pub fn slots(&self) -> usize {
        self.slots as usize
    }

    /// Messages per returned credit (a power of two, at most [`slots`](Self::slots)).
    #[inline]
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// Messages posted so far.
    #[inline]
    pub fn posted(&self) -> u64 {
        self.posted
    }

    /// Messages consumed so far.
    #[inline]
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The slot of the message that follows `count` messages (message `count + 1`).
    #[inline]
    pub fn slot_after(&self, count: u64) -> usize {
        (count & (self.slots - 1)) as usize
    }

    /// Whether the credits this end already knows free the next message's slot (no load).
    #[inline]
    pub fn knows_credit(&self) -> bool {
        self.posted < self.freed + self.slots
    }

    /// Whether the next message may be posted: known credits, or else `freed` (the word the
    /// receiver stores, loaded with acquire ordering) frees its slot.
    #[inline]
    pub fn has_credit(&mut self, freed: &AtomicU64) -> bool {
        if self.knows_credit() {
            return true;
        }
        self.refresh(freed);
        self.knows_credit()
    }

    /// The value of `freed` that frees the next message's slot; a sender without credit waits
    /// for `freed` to reach it, then [`refresh`](Self::refresh)es.
    #[inline]
    pub fn credit_limit(&self) -> u64 {
        (self.posted + 1).saturating_sub(self.slots)
    }

    /// Learns the credits returned so far from `freed`.
    #[inline]
    pub fn refresh(&mut self, freed: &AtomicU64) {
        // Acquire: pairs with the receiver's release store in its credit return, so its reads
        // of the slots it freed happen before this end writes them again.
        self.freed = freed.load(Ordering::Acquire);
    }

    /// The sequence number the next message carries (its number, counted from 1).
    #[inline]
    pub fn next_sequence(&self) -> u64 {
        self.posted + 1
    }

    /// Counts the next message as posted (call after its sequence word is stored).
    #[inline]
    pub fn note_posted(&mut self) {
        self.posted += 1;
    }

    /// The sequence number the peer's next message carries.
    #[inline]
    pub fn next_arrival(&self) -> u64 {
        self.consumed + 1
    }

    /// Counts the message received last as consumed (call once its slot is no longer read);
    /// returns the value to store into the peer's `freed` word when a batch of credits goes
    /// back now.
    #[inline]
    pub fn note_consumed(&mut self) -> Option<u64> {
        self.consumed += 1;
        (self.consumed & (self.batch - 1) == 0).then_some(self.consumed)
    }

    /// Returns credits: stores `count` (from [`note_consumed`](Self::note_consumed)) into the
    /// peer's `freed` word, where it is mapped here.
    #[inline]
    pub fn return_credits(freed: &AtomicU64, count: u64) {
        // Release: this end's reads of the freed slots happen before the sender rewrites them.
        freed.store(count, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_down_to_powers_of_two_and_batches_fit_the_ring() {
        let c = SlotCredits::new(6, 3);
        assert_eq!((c.slots(), c.batch()), (4, 2));
        let c = SlotCredits::new(0, 0);
        assert_eq!((c.slots(), c.batch()), (1, 1));
        let c = SlotCredits::new(4, 64);
        assert_eq!((c.slots(), c.batch()), (4, 4));
    }

    #[test]
    fn a_sender_runs_a_ring_ahead_and_a_batch_returns_its_credits_at_once() {
        let freed = AtomicU64::new(0);
        let mut sender = SlotCredits::new(4, 2);
        let mut receiver = SlotCredits::new(4, 2);
        for m in 1..=4 {
            assert!(sender.has_credit(&freed), "message {m}");
            assert_eq!(sender.next_sequence(), m);
            assert_eq!(sender.slot_after(sender.posted()), (m - 1) as usize);
            sender.note_posted();
        }
        assert!(!sender.has_credit(&freed), "the ring is full");
        assert_eq!(sender.credit_limit(), 1);
        assert_eq!(receiver.next_arrival(), 1);
        assert_eq!(receiver.note_consumed(), None, "the first of a batch holds its credit");
        assert_eq!(receiver.note_consumed(), Some(2));
        SlotCredits::return_credits(&freed, 2);
        assert!(sender.has_credit(&freed));
        assert_eq!(sender.slot_after(sender.posted()), 0, "message 5 reuses slot 0");
        sender.note_posted();
        sender.note_posted();
        assert!(!sender.has_credit(&freed), "message 7 needs the credit of message 3");
        assert_eq!(sender.credit_limit(), 3);
    }
}
