//! Triggers: the two-word requests that producers push through the [trigger FIFO](crate::fifo)
//! for the proxy thread — copy, signal, flush — and their encoding.
//!
//! A [`Trigger`] is exactly two `u64` words, the layout of MSCCL++'s `ProxyTrigger`:
//!
//! | word | bits | field | width | limit |
//! |---|---|---|---|---|
//! | 0 | `0..32` | size in bytes | 32 | [`MAX_TRIGGER_SIZE`] |
//! | 0 | `32..64` | source offset | 32 | [`MAX_TRIGGER_OFFSET`] |
//! | 1 | `0..32` | destination offset | 32 | [`MAX_TRIGGER_OFFSET`] |
//! | 1 | `32..41` | source memory id | 9 | [`MAX_MEMORIES`] ids |
//! | 1 | `41..50` | destination memory id | 9 | [`MAX_MEMORIES`] ids |
//! | 1 | `50..53` | type: [`TriggerType`] bits `DATA = 1`, `FLAG = 2`, `SYNC = 4` | 3 | |
//! | 1 | `53..63` | semaphore id | 10 | [`MAX_SEMAPHORES`] ids |
//! | 1 | `63` | commit bit (set by the FIFO on push, never by [`Trigger::new`]) | 1 | |
//!
//! [`Trigger::new`] refuses a field wider than its bits with [`Error::InvalidArgument`]; nothing
//! is ever masked silently.

use std::fmt;

use bitflags::bitflags;

use crate::error::{Error, Result};

/// Bits of the size field (word 0, bits `0..32`).
pub const TRIGGER_SIZE_BITS: u32 = 32;
/// Bits of each offset field (source: word 0, bits `32..64`; destination: word 1, bits `0..32`).
pub const TRIGGER_OFFSET_BITS: u32 = 32;
/// Bits of each memory id field (word 1, bits `32..41` and `41..50`).
pub const MEMORY_ID_BITS: u32 = 9;
/// Bits of the type field (word 1, bits `50..53`).
pub const TRIGGER_TYPE_BITS: u32 = 3;
/// Bits of the semaphore id field (word 1, bits `53..63`).
pub const SEMAPHORE_ID_BITS: u32 = 10;

/// Largest size one trigger can carry (4 GiB - 1); port channels split larger puts.
pub const MAX_TRIGGER_SIZE: u64 = field_mask(TRIGGER_SIZE_BITS);
/// Largest source or destination offset a trigger can carry (4 GiB - 1).
pub const MAX_TRIGGER_OFFSET: u64 = field_mask(TRIGGER_OFFSET_BITS);
/// Number of memory ids a trigger can name (ids `0..512`); also the size of a proxy's memory table.
pub const MAX_MEMORIES: usize = 1 << MEMORY_ID_BITS;
/// Number of semaphore ids a trigger can name (ids `0..1024`); also the size of a proxy's
/// semaphore table.
pub const MAX_SEMAPHORES: usize = 1 << SEMAPHORE_ID_BITS;

const SIZE_SHIFT: u32 = 0;
const SRC_OFFSET_SHIFT: u32 = 32;
const DST_OFFSET_SHIFT: u32 = 0;
const SRC_MEMORY_SHIFT: u32 = 32;
const DST_MEMORY_SHIFT: u32 = SRC_MEMORY_SHIFT + MEMORY_ID_BITS;
const TYPE_SHIFT: u32 = DST_MEMORY_SHIFT + MEMORY_ID_BITS;
const SEMAPHORE_SHIFT: u32 = TYPE_SHIFT + TRIGGER_TYPE_BITS;
pub(crate) const COMMIT_SHIFT: u32 = 63;
pub(crate) const COMMIT_BIT: u64 = 1 << COMMIT_SHIFT;

const _: () = assert!(SEMAPHORE_SHIFT + SEMAPHORE_ID_BITS == COMMIT_SHIFT);
const _: () = assert!(std::mem::size_of::<Trigger>() == 16);

const fn field_mask(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

bitflags! {
    /// What the proxy does for a trigger; flags combine and run in this order:
    /// `DATA` (copy), then `FLAG` (signal), then `SYNC` (flush) — "put with signal and flush".
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct TriggerType: u8 {
        /// Copy `size` bytes from the source memory to the destination memory.
        const DATA = 1 << 0;
        /// Signal the semaphore (after the copy, if any).
        const FLAG = 1 << 1;
        /// Flush the semaphore's connection: everything issued so far is complete at the peer.
        const SYNC = 1 << 2;
    }
}

/// Index of a registered memory in a proxy's memory table (9 bits on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MemoryId(pub u32);

/// Index of a semaphore in a proxy's semaphore table (10 bits on the wire); the semaphore also
/// selects the connection a trigger's copy and flush go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SemaphoreId(pub u32);

/// The decoded fields of a [`Trigger`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TriggerFields {
    /// What to do.
    pub kind: TriggerType,
    /// Bytes to copy (`DATA`), at most [`MAX_TRIGGER_SIZE`].
    pub size: u64,
    /// The memory copied from.
    pub src_memory: MemoryId,
    /// Byte offset in the source memory, at most [`MAX_TRIGGER_OFFSET`].
    pub src_offset: u64,
    /// The memory copied to.
    pub dst_memory: MemoryId,
    /// Byte offset in the destination memory, at most [`MAX_TRIGGER_OFFSET`].
    pub dst_offset: u64,
    /// The semaphore to signal, whose connection carries the copy and the flush.
    pub semaphore: SemaphoreId,
}

impl TriggerFields {
    /// The fields of a `kind` trigger from its raw numbers: `size` bytes from `(memory id,
    /// offset)` `src` to `dst`, through semaphore `semaphore`. Nothing is checked here;
    /// [`Trigger::new`] checks the field limits.
    pub const fn new(kind: TriggerType, size: u64, src: (u32, u64), dst: (u32, u64), semaphore: u32) -> Self {
        TriggerFields {
            kind,
            size,
            src_memory: MemoryId(src.0),
            src_offset: src.1,
            dst_memory: MemoryId(dst.0),
            dst_offset: dst.1,
            semaphore: SemaphoreId(semaphore),
        }
    }
}

/// One request to the proxy: two `u64` words, laid out as the [module docs](self) describe.
///
/// The commit bit is never part of a `Trigger` value; the FIFO adds it on push and strips it
/// on poll.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Trigger {
    words: [u64; 2],
}

fn check_field(name: &str, value: u64, max: u64) -> Result<u64> {
    if value > max {
        return Err(Error::invalid(format!(
            "trigger {name} {value} does not fit its field (at most {max}, {} bits)",
            u64::BITS - max.leading_zeros()
        )));
    }
    Ok(value)
}

impl Trigger {
    /// Encodes `fields`; `Err(InvalidArgument)` when a field is wider than its bits or the type
    /// is empty (a trigger must do something).
    pub fn new(fields: TriggerFields) -> Result<Trigger> {
        if fields.kind.is_empty() {
            return Err(Error::invalid("trigger type is empty: use DATA, FLAG, SYNC or a combination"));
        }
        let size = check_field("size", fields.size, MAX_TRIGGER_SIZE)?;
        let src_offset = check_field("source offset", fields.src_offset, MAX_TRIGGER_OFFSET)?;
        let dst_offset = check_field("destination offset", fields.dst_offset, MAX_TRIGGER_OFFSET)?;
        let id_max = field_mask(MEMORY_ID_BITS);
        let src_memory = check_field("source memory id", u64::from(fields.src_memory.0), id_max)?;
        let dst_memory = check_field("destination memory id", u64::from(fields.dst_memory.0), id_max)?;
        let semaphore = check_field("semaphore id", u64::from(fields.semaphore.0), field_mask(SEMAPHORE_ID_BITS))?;
        let kind = u64::from(fields.kind.bits());
        let w0 = (size << SIZE_SHIFT) | (src_offset << SRC_OFFSET_SHIFT);
        let w1 = (dst_offset << DST_OFFSET_SHIFT)
            | (src_memory << SRC_MEMORY_SHIFT)
            | (dst_memory << DST_MEMORY_SHIFT)
            | (kind << TYPE_SHIFT)
            | (semaphore << SEMAPHORE_SHIFT);
        Ok(Trigger { words: [w0, w1] })
    }

    /// Decodes two raw words (e.g. read from a slot); the commit bit is dropped. Every bit
    /// pattern decodes: each field's width covers exactly its values.
    pub fn from_words(words: [u64; 2]) -> Trigger {
        Trigger { words: [words[0], words[1] & !COMMIT_BIT] }
    }

    /// The two words, commit bit clear.
    pub fn words(&self) -> [u64; 2] {
        self.words
    }

    /// What to do.
    pub fn kind(&self) -> TriggerType {
        TriggerType::from_bits_truncate(((self.words[1] >> TYPE_SHIFT) & field_mask(TRIGGER_TYPE_BITS)) as u8)
    }

    /// Bytes to copy.
    pub fn size(&self) -> u64 {
        (self.words[0] >> SIZE_SHIFT) & MAX_TRIGGER_SIZE
    }

    /// Byte offset in the source memory.
    pub fn src_offset(&self) -> u64 {
        (self.words[0] >> SRC_OFFSET_SHIFT) & MAX_TRIGGER_OFFSET
    }

    /// Byte offset in the destination memory.
    pub fn dst_offset(&self) -> u64 {
        (self.words[1] >> DST_OFFSET_SHIFT) & MAX_TRIGGER_OFFSET
    }

    /// The source memory.
    pub fn src_memory(&self) -> MemoryId {
        MemoryId(((self.words[1] >> SRC_MEMORY_SHIFT) & field_mask(MEMORY_ID_BITS)) as u32)
    }

    /// The destination memory.
    pub fn dst_memory(&self) -> MemoryId {
        MemoryId(((self.words[1] >> DST_MEMORY_SHIFT) & field_mask(MEMORY_ID_BITS)) as u32)
    }

    /// The semaphore (and thereby the connection).
    pub fn semaphore(&self) -> SemaphoreId {
        SemaphoreId(((self.words[1] >> SEMAPHORE_SHIFT) & field_mask(SEMAPHORE_ID_BITS)) as u32)
    }

    /// All fields at once.
    pub fn fields(&self) -> TriggerFields {
        TriggerFields {
            kind: self.kind(),
            size: self.size(),
            src_memory: self.src_memory(),
            src_offset: self.src_offset(),
            dst_memory: self.dst_memory(),
            dst_offset: self.dst_offset(),
            semaphore: self.semaphore(),
        }
    }
}

impl fmt::Debug for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.fields();
        f.debug_struct("Trigger")
            .field("kind", &t.kind)
            .field("size", &t.size)
            .field("src", &(t.src_memory.0, t.src_offset))
            .field("dst", &(t.dst_memory.0, t.dst_offset))
            .field("semaphore", &t.semaphore.0)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(size: u64, src_offset: u64, dst_offset: u64, src: u32, dst: u32, sem: u32) -> TriggerFields {
        TriggerFields::new(TriggerType::DATA, size, (src, src_offset), (dst, dst_offset), sem)
    }

    #[test]
    fn trigger_round_trips_boundary_values() {
        let max_id = (MAX_MEMORIES - 1) as u32;
        let max_sem = (MAX_SEMAPHORES - 1) as u32;
        let kinds = [
            TriggerType::DATA,
            TriggerType::FLAG,
            TriggerType::SYNC,
            TriggerType::DATA | TriggerType::FLAG,
            TriggerType::all(),
        ];
        let values = [
            fields(0, 0, 0, 0, 0, 0),
            fields(MAX_TRIGGER_SIZE, MAX_TRIGGER_OFFSET, MAX_TRIGGER_OFFSET, max_id, max_id, max_sem),
            fields(1, 1, 1, 1, 1, 1),
            fields(MAX_TRIGGER_SIZE, 0, MAX_TRIGGER_OFFSET, 0, max_id, 0),
            fields(0, MAX_TRIGGER_OFFSET, 0, max_id, 0, max_sem),
            fields(0x1234_5678, 0x9abc_def0, 0x0fed_cba9, 0x155, 0xaa, 0x2aa),
        ];
        for kind in kinds {
            for v in values {
                let f = TriggerFields { kind, ..v };
                let t = Trigger::new(f).unwrap();
                assert_eq!(t.fields(), f);
                assert_eq!(t.words()[1] & COMMIT_BIT, 0, "new never sets the commit bit");
                let back = Trigger::from_words([t.words()[0], t.words()[1] | COMMIT_BIT]);
                assert_eq!(back, t);
                assert_eq!(back.fields(), f);
            }
        }
    }

    #[test]
    fn over_wide_fields_are_refused() {
        let good = fields(1, 2, 3, 4, 5, 6);
        let bad = [
            TriggerFields { size: MAX_TRIGGER_SIZE + 1, ..good },
            TriggerFields { src_offset: MAX_TRIGGER_OFFSET + 1, ..good },
            TriggerFields { dst_offset: MAX_TRIGGER_OFFSET + 1, ..good },
            TriggerFields { dst_offset: u64::MAX, ..good },
            TriggerFields { src_memory: MemoryId(MAX_MEMORIES as u32), ..good },
            TriggerFields { dst_memory: MemoryId(MAX_MEMORIES as u32), ..good },
            TriggerFields { dst_memory: MemoryId(u32::MAX), ..good },
            TriggerFields { semaphore: SemaphoreId(MAX_SEMAPHORES as u32), ..good },
            TriggerFields { kind: TriggerType::empty(), ..good },
        ];
        for f in bad {
            let r = Trigger::new(f);
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "{f:?} gave {r:?}");
        }
        Trigger::new(good).unwrap();
    }
}
