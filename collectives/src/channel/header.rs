//! The header every channel message carries in its slot: the message's sequence word, then the
//! call it belongs to (call number and signature), its count, and root, payload length and marks
//! packed into one word. Receivers check it against their own call ([`Header::agrees_with`]).
//! How the words travel: [`super::link`].

/// Words of the header at the start of a slot.
pub(super) const HEADER_WORDS: usize = 4;
/// Bytes of the header at the start of a slot.
pub(crate) const HEADER_BYTES: usize = 8 * HEADER_WORDS;
/// Payload bytes a slot may hold at most: the length field of the packed header word.
pub(super) const MAX_SLOT_PAYLOAD: usize = (1 << LEN_BITS) - 1;
/// Bits of the packed header word: root (0..32), payload length (32..56), marks (56..59),
/// variant (59..63).
const LEN_SHIFT: u32 = 32;
const LEN_BITS: u32 = 24;
const TAINTED_BIT: u64 = 1 << 56;
const LAST_BIT: u64 = 1 << 57;
const INVALID_BIT: u64 = 1 << 58;
const VARIANT_SHIFT: u32 = 59;
/// Variants a header can tell apart (see [`Header::variant`]).
pub(crate) const VARIANTS: u8 = 1 << 4;
/// The signature bits that travel in the call word; the top bit, [`INVALID_SIGNATURE`],
/// travels as [`INVALID_BIT`].
const SIGNATURE_BITS: u64 = u32::MAX as u64;
/// The signature's mark of a sender whose own arguments were invalid.
pub(crate) const INVALID_SIGNATURE: u64 = 1 << 63;

/// What every message says about the call it belongs to; receivers check it against their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Header {
    /// The channel call this message belongs to, modulo 2³² (every rank counts calls the same
    /// way).
    pub(crate) call: u64,
    /// Collective, dtype, op and algorithm of the call, packed in the low 32 bits (see
    /// `host::signature`); [`INVALID_SIGNATURE`] marks a sender whose own arguments were
    /// invalid.
    pub(crate) signature: u64,
    /// Element count as the collective defines it (per pair for all-to-all-v).
    pub(crate) count: u64,
    /// Root rank, or 0 (at most `u32::MAX`: larger roots are sent as that).
    pub(crate) root: u64,
    /// Set when the sender (or a rank upstream of it) found a mismatch in this call.
    pub(crate) tainted: bool,
    /// Payload bytes of this message.
    pub(crate) len: u64,
    /// The sender's last message of the call to this receiver (set by the eager algorithms,
    /// whose receivers take messages until they see it, so that a mismatched call still
    /// leaves the link in step).
    pub(crate) last: bool,
    /// Which form of its collective the call takes, where a caller runs one collective in
    /// forms that must not meet (below [`VARIANTS`]; 0 for an ordinary call).
    pub(crate) variant: u8,
}

impl Header {
    /// Whether this header (a peer's) says the same call as `mine`, with nothing to report:
    /// same call number, signature, count and root, neither side invalid, not tainted.
    #[inline]
    pub(crate) fn agrees_with(&self, mine: &Header) -> bool {
        self.call == mine.call
            && self.signature == mine.signature
            && self.count == mine.count
            && self.root == mine.root
            && self.variant == mine.variant
            && !self.tainted
    }

    /// The header words after the sequence word; `len` must fit the length field, `call` and
    /// the signature's bits other than the invalid mark 32 bits, `variant` 4 bits.
    #[inline(always)]
    pub(super) fn to_words(self) -> [u64; HEADER_WORDS - 1] {
        let packed = self.root.min(u64::from(u32::MAX))
            | (self.len << LEN_SHIFT)
            | if self.tainted { TAINTED_BIT } else { 0 }
            | if self.last { LAST_BIT } else { 0 }
            | if self.signature & INVALID_SIGNATURE != 0 { INVALID_BIT } else { 0 }
            | u64::from(self.variant % VARIANTS) << VARIANT_SHIFT;
        [(self.call & SIGNATURE_BITS) | (self.signature & SIGNATURE_BITS) << 32, self.count, packed]
    }

    #[inline(always)]
    pub(super) fn from_words(w: [u64; HEADER_WORDS - 1]) -> Self {
        let packed = w[2];
        Header {
            call: w[0] & SIGNATURE_BITS,
            signature: w[0] >> 32 | if packed & INVALID_BIT != 0 { INVALID_SIGNATURE } else { 0 },
            count: w[1],
            root: packed & u64::from(u32::MAX),
            tainted: packed & TAINTED_BIT != 0,
            len: (packed >> LEN_SHIFT) & ((1 << LEN_BITS) - 1),
            last: packed & LAST_BIT != 0,
            variant: (packed >> VARIANT_SHIFT) as u8 % VARIANTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_survive_their_words_with_every_mark() {
        let plain = Header { call: 7, signature: 0x0403_0201, count: 1 << 40, root: 3, len: 24, ..Header::default() };
        let marked = Header {
            call: u64::from(u32::MAX),
            signature: 0xff02_0304 | INVALID_SIGNATURE,
            count: u64::MAX,
            root: u64::from(u32::MAX),
            tainted: true,
            len: MAX_SLOT_PAYLOAD as u64,
            last: true,
            variant: VARIANTS - 1,
        };
        for h in [plain, marked, Header::default()] {
            assert_eq!(Header::from_words(h.to_words()), h);
        }
        // Only the marks differ: each must come back as it went.
        let invalid = Header { signature: plain.signature | INVALID_SIGNATURE, ..plain };
        assert_ne!(Header::from_words(invalid.to_words()), plain);
        assert!(!Header::from_words(invalid.to_words()).agrees_with(&plain));
        // Another form of the same call disagrees, and leaves every other field as it was.
        let other_form = Header::from_words(Header { variant: 1, ..plain }.to_words());
        assert!(!other_form.agrees_with(&plain));
        assert_eq!(Header { variant: 0, ..other_form }, plain);
    }
}
