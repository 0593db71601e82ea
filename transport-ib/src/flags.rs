//! How a flag travels: `update_and_sync` and the flag behind `write_and_sync` store a value into
//! an 8-byte word of the peer, after the data posted before them. Two ways, picked by
//! `WEAVE_IB_FLAG` ([`FlagPath`]); each is the sending rank's own choice (the receiver needs
//! nothing from either but its posted receives), so ranks may differ.
//!
//! **Immediates** (`imm`, the default): not atomics on the peer's memory but messages its
//! receive queue takes, which the peer applies itself (see [`crate::inbound`]). A flag word is
//! named by (region number, offset); stores into it arrive in the order they were posted.
//!
//! - The first store into a word goes as a *record* (a 24-byte send: region, offset, value, and
//!   a slot number), which gives the word one of [`SLOTS`] slots of this connection. A later
//!   store whose value exceeds the last one by less than 2^20 (modulo 2^64) travels in the
//!   32-bit immediate of an RDMA write: the slot (12 bits) and the difference (20 bits). That
//!   write is the data's last one, or one of no bytes for a flag alone, so a small message and
//!   its flag are one verbs operation and one packet.
//! - **Records** carry every other store: the first into a word, one whose difference does not
//!   fit, and every store into a word once the slots ran out.
//!
//! Both ends keep the last value of each slot (sender: [`Outbound`]; receiver: [`InboundSlots`]),
//! changed by the same stores in the same order, so a difference applies to the value the
//! sender meant. The words a peer updates (semaphores, flags, link counters) are written only by
//! that peer, through one connection.
//!
//! **Atomics** (`atomic`): a fetch-and-add on the word itself, posted behind the data on the
//! same queue pair, whose addend takes the word from the value the sender knows it holds to the
//! new one ([`AtomicWords`]); the receiver polls its memory and takes no completion. The first
//! store into a word learns that value with an RDMA read (waited for, once per word and
//! connection): a read returns the word's bytes as they are in memory, where the old value a
//! fetch-and-add returns is big-endian on some HCAs. Stores are values, not increments: any
//! sequence of values works (the addend wraps modulo 2^64), given, as above, that only this
//! connection writes the word. Why the word changes only after the data is placed: see
//! [`crate::connection`]'s module doc.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Weak;
use std::sync::atomic::Ordering;

use comm_core::{Error, Result};

use crate::region::{IbRegion, LocalRegions};

/// Bytes of a record on the wire.
pub(crate) const RECORD_BYTES: usize = 24;
/// Bits of an immediate that name the slot; the rest carry the difference.
const SLOT_BITS: u32 = 12;
const DELTA_BITS: u32 = 32 - SLOT_BITS;
/// Slots of one connection's direction.
pub(crate) const SLOTS: u32 = 1 << SLOT_BITS;
/// A record's slot field when the word has no slot.
const NO_SLOT: u32 = u32::MAX;

/// One store, in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// The receiver's number of the region holding the word.
    pub(crate) region: u32,
    /// The slot the word takes (or keeps), if any.
    pub(crate) slot: Option<u32>,
    /// The word's offset in the region.
    pub(crate) offset: u64,
    /// The value to store.
    pub(crate) value: u64,
}

impl Record {
    /// The record's bytes on the wire (little-endian fields).
    pub(crate) fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[..4].copy_from_slice(&self.region.to_le_bytes());
        b[4..8].copy_from_slice(&self.slot.unwrap_or(NO_SLOT).to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// A record from the wire; a slot out of range is a protocol error.
    pub(crate) fn decode(b: &[u8; RECORD_BYTES]) -> Result<Self> {
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        let half = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
        let slot = match half(4) {
            NO_SLOT => None,
            s if s < SLOTS => Some(s),
            s => return Err(Error::protocol(format!("an ib flag record names slot {s} of {SLOTS}"))),
        };
        Ok(Record { region: half(0), slot, offset: word(8), value: word(16) })
    }
}

/// How one store travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// In the immediate of a write.
    Immediate(u32),
    /// As a record (a send).
    Record(Record),
}

/// The sending side: the slot and last value of each word this connection stored into.
#[derive(Debug, Default)]
pub(crate) struct Outbound {
    /// Each word's slot, by (region, offset).
    slots: HashMap<(u32, u64), u32, BuildHasherDefault<WordHasher>>,
    /// The last value stored into each slot's word, by slot.
    last: Vec<u64>,
    /// The word of the last store and its slot: most stores go where the one before went (a
    /// link's flag, message after message), found without hashing.
    recent: Option<((u32, u64), u32)>,
}

/// A multiplicative hash of a (region, offset) key: the keys are this rank's own, so SipHash's
/// defence against chosen keys buys nothing, and it cost as much as the rest of a post's own
/// work on the emulated guest.
#[derive(Debug, Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(23) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Outbound {
    /// How the store of `value` into the word at `offset` of the peer's region `region` travels;
    /// the caller must post it (or give up on the connection: the two ends' views would part).
    #[inline]
    pub(crate) fn signal(&mut self, region: u32, offset: u64, value: u64) -> Signal {
        let word = (region, offset);
        let known = match self.recent {
            Some((recent, slot)) if recent == word => Some(slot),
            _ => self.slots.get(&word).copied(),
        };
        if let Some(slot) = known
            && let Some(last) = self.last.get_mut(slot as usize)
        {
            self.recent = Some((word, slot));
            let delta = value.wrapping_sub(*last);
            *last = value;
            if delta < 1 << DELTA_BITS {
                return Signal::Immediate(slot << DELTA_BITS | delta as u32);
            }
            return Signal::Record(Record { region, slot: Some(slot), offset, value });
        }
        let slot = u32::try_from(self.last.len()).ok().filter(|&s| s < SLOTS);
        if let Some(slot) = slot {
            self.last.push(value);
            self.slots.insert(word, slot);
            self.recent = Some((word, slot));
        }
        Signal::Record(Record { region, slot, offset, value })
    }
}

/// How this rank stores flags into its peers' words (`WEAVE_IB_FLAG`; see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagPath {
    /// In immediates and records that the peer applies (`imm`, the default).
    Immediate,
    /// As fetch-and-adds on the word (`atomic`).
    Atomic,
}

impl FlagPath {
    /// The path `WEAVE_IB_FLAG` names (`imm` or `atomic`; unset is `imm`).
    pub(crate) fn from_env() -> Result<Self> {
        match std::env::var("WEAVE_IB_FLAG") {
            Err(_) => Ok(FlagPath::Immediate),
            Ok(v) => Self::parse(&v),
        }
    }

    fn parse(v: &str) -> Result<Self> {
        match v {
            "" | "imm" => Ok(FlagPath::Immediate),
            "atomic" => Ok(FlagPath::Atomic),
            other => Err(Error::invalid(format!("WEAVE_IB_FLAG={other:?}: use imm or atomic"))),
        }
    }
}

/// The sending side of atomic flags: the value each of the peer's words holds once this
/// connection's stores into it so far are done.
#[derive(Debug, Default)]
pub(crate) struct AtomicWords {
    words: HashMap<(u32, u64), u64, BuildHasherDefault<WordHasher>>,
}

impl AtomicWords {
    /// The addend that takes the word at `offset` of the peer's region `region` to `value`,
    /// counting the store as done (the caller must post it, or give up on the connection);
    /// `None` while the word's value is unknown (see [`learn`](Self::learn)).
    pub(crate) fn addend(&mut self, region: u32, offset: u64, value: u64) -> Option<u64> {
        let last = self.words.get_mut(&(region, offset))?;
        let addend = value.wrapping_sub(*last);
        *last = value;
        Some(addend)
    }

    /// Records that the word holds `current` (read from the peer before any store into it).
    pub(crate) fn learn(&mut self, region: u32, offset: u64, current: u64) {
        self.words.insert((region, offset), current);
    }
}

/// The receiving side: the word and last value of each slot the peer defined.
#[derive(Default)]
pub(crate) struct InboundSlots {
    slots: Vec<Option<InWord>>,
}

struct InWord {
    region: Weak<IbRegion>,
    offset: u64,
    last: u64,
}

impl InboundSlots {
    /// Stores a record's value into this rank's word it names, and gives the word its slot.
    /// `Err` (what the peer got wrong) for a region that does not exist here or a word outside
    /// it.
    pub(crate) fn apply_record(&mut self, regions: &LocalRegions, r: Record) -> std::result::Result<(), String> {
        let region = regions
            .get(r.region)
            .ok_or_else(|| format!("a flag record names region {} of this rank, which does not exist", r.region))?;
        let word = region.word(r.offset).ok_or_else(|| {
            format!("a flag record names offset {} of region {}, not an aligned word inside it", r.offset, r.region)
        })?;
        word.store(r.value, Ordering::Release);
        if let Some(slot) = r.slot {
            let slot = slot as usize;
            if self.slots.len() <= slot {
                self.slots.resize_with(slot + 1, || None);
            }
            self.slots[slot] =
                Some(InWord { region: std::sync::Arc::downgrade(&region), offset: r.offset, last: r.value });
        }
        Ok(())
    }

    /// Applies an immediate: adds its difference to its slot's last value and stores the sum.
    /// `Err` for a slot never defined. A region dropped here since is skipped: its owner is
    /// done with it, so nobody waits on the word.
    pub(crate) fn apply_immediate(&mut self, imm: u32) -> std::result::Result<(), String> {
        let (slot, delta) = ((imm >> DELTA_BITS) as usize, u64::from(imm & ((1 << DELTA_BITS) - 1)));
        let word = self
            .slots
            .get_mut(slot)
            .and_then(Option::as_mut)
            .ok_or_else(|| format!("an immediate names flag slot {slot}, which no record defined"))?;
        word.last = word.last.wrapping_add(delta);
        if let Some(region) = word.region.upgrade() {
            // Checked when the slot was defined; the region cannot have changed size.
            if let Some(w) = region.word(word.offset) {
                w.store(word.last, Ordering::Release);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_slots_are_refused() {
        let r = Record { region: 7, slot: Some(SLOTS - 1), offset: 4096, value: u64::MAX - 3 };
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let none = Record { slot: None, ..r };
        assert_eq!(Record::decode(&none.encode()).unwrap(), none);
        let mut bad = r.encode();
        bad[4..8].copy_from_slice(&SLOTS.to_le_bytes());
        assert!(matches!(Record::decode(&bad), Err(Error::Protocol(_))));
    }

    #[test]
    fn first_stores_are_records_then_small_steps_are_immediates() {
        let mut out = Outbound::default();
        assert_eq!(out.signal(3, 0, 1), Signal::Record(Record { region: 3, slot: Some(0), offset: 0, value: 1 }));
        assert_eq!(out.signal(3, 64, 5), Signal::Record(Record { region: 3, slot: Some(1), offset: 64, value: 5 }));
        assert_eq!(out.signal(3, 0, 2), Signal::Immediate(1), "slot 0, +1");
        assert_eq!(out.signal(3, 64, 5), Signal::Immediate(1 << DELTA_BITS), "slot 1, +0");
        // A step that does not fit in 20 bits, and one backwards, go in full.
        let big = 2 + (1 << DELTA_BITS);
        assert_eq!(out.signal(3, 0, big), Signal::Record(Record { region: 3, slot: Some(0), offset: 0, value: big }));
        assert!(matches!(out.signal(3, 0, 1), Signal::Record(Record { value: 1, slot: Some(0), .. })));
        assert_eq!(out.signal(3, 0, 9), Signal::Immediate(8));
    }

    #[test]
    fn words_past_the_last_slot_always_go_as_records() {
        let mut out = Outbound::default();
        for w in 0..u64::from(SLOTS) {
            assert!(matches!(out.signal(1, 8 * w, 1), Signal::Record(Record { slot: Some(_), .. })));
        }
        let extra = 8 * u64::from(SLOTS);
        for v in 1..3 {
            assert_eq!(
                out.signal(1, extra, v),
                Signal::Record(Record { region: 1, slot: None, offset: extra, value: v })
            );
        }
    }

    #[test]
    fn atomic_addends_take_the_word_to_each_value() {
        let mut words = AtomicWords::default();
        assert_eq!(words.addend(2, 8, 5), None, "unknown until read");
        words.learn(2, 8, 3);
        // The word as the peer's memory would hold it after each fetch-and-add.
        let mut word = 3u64;
        for value in [5, 5, 6, 1 << 40, 2, u64::MAX, 0] {
            word = word.wrapping_add(words.addend(2, 8, value).unwrap());
            assert_eq!(word, value);
        }
        assert_eq!(words.addend(2, 16, 1), None, "another word is unknown");
    }

    #[test]
    fn flag_paths_parse() {
        assert_eq!(FlagPath::parse("imm").unwrap(), FlagPath::Immediate);
        assert_eq!(FlagPath::parse("").unwrap(), FlagPath::Immediate);
        assert_eq!(FlagPath::parse("atomic").unwrap(), FlagPath::Atomic);
        assert!(FlagPath::parse("cas").unwrap_err().to_string().contains("WEAVE_IB_FLAG"));
    }

    #[test]
    fn an_immediate_for_a_slot_never_defined_is_refused() {
        let mut slots = InboundSlots::default();
        assert!(slots.apply_immediate(5 << DELTA_BITS | 1).unwrap_err().contains("slot 5"));
    }
}
