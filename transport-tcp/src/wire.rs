//! What travels on a TCP connection's sockets, byte for byte (little-endian).
//!
//! **Handshake** (connector → listener, once per socket): magic `WVTH`, version `u16`, the
//! listener's 16-byte token (which only ranks of the job learned, from the endpoint exchanged
//! over the authenticated bootstrap), the connector's rank `u32`, this socket's stripe `u16` and
//! the connection's stripe count `u16`. The listener answers one byte, `HANDSHAKE_OK` (`0x5a`), or
//! closes the socket.
//!
//! **Frames**, in both directions once the handshake is done (a socket carries the frames of
//! both ranks of a pair, so each side's messages carry the TCP acknowledgement of the other's):
//! a 40-byte header — kind `u8`, seven zero bytes, region id `u64`, offset `u64`, length or
//! value `u64`, sequence `u64` — then:
//! - data: `length` bytes to store at `offset` of the receiver's region;
//! - flag: one `u64` per stripe (the data frames sent on it so far); the
//!   receiver stores `value` into the 8-byte word at `offset` once every stripe has applied
//!   that many data frames, so the flag never lands before the data it covers;
//! - flush: the same counts; once they are applied the receiver answers on the same socket;
//! - answer: nothing more; `sequence` is the highest flush of the receiver's that the sender
//!   has applied everything before.
//!
//! Nothing from the wire is trusted: kinds, region ids, ranges, lengths and counts are checked,
//! and anything wrong is [`Error::Protocol`] for that connection.

use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

/// Magic of the handshake.
pub(crate) const HANDSHAKE_MAGIC: [u8; 4] = *b"WVTH";
/// Version of the handshake and frame formats.
pub(crate) const WIRE_VERSION: u16 = 2;
/// Bytes of an encoded handshake.
pub(crate) const HANDSHAKE_BYTES: usize = 4 + 2 + 16 + 4 + 2 + 2;
/// The listener's answer to a good handshake.
pub(crate) const HANDSHAKE_OK: u8 = 0x5a;
/// Bytes of a frame header.
pub(crate) const FRAME_HEADER_BYTES: usize = 40;
/// Largest data frame: larger writes are cut into frames of this size (and striped).
pub(crate) const MAX_FRAME_BYTES: usize = 1 << 20;

/// What one socket says when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handshake {
    /// The listener's token, as its endpoint announced it.
    pub(crate) token: [u8; 16],
    /// The connecting rank.
    pub(crate) rank: u32,
    /// This socket's stripe.
    pub(crate) stripe: u16,
    /// Stripes of the connection.
    pub(crate) stripes: u16,
}

impl Handshake {
    pub(crate) fn encode(&self) -> Vec<u8> {
        Encoder::new(HANDSHAKE_MAGIC, WIRE_VERSION)
            .raw(&self.token)
            .u32(self.rank)
            .u16(self.stripe)
            .u16(self.stripes)
            .finish()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, HANDSHAKE_MAGIC, WIRE_VERSION, "tcp handshake")?;
        let token = d.raw::<16>()?;
        let (rank, stripe, stripes) = (d.u32()?, d.u16()?, d.u16()?);
        d.finish()?;
        if stripes == 0 || stripe >= stripes || usize::from(stripes) > crate::config::MAX_SOCKETS {
            return Err(Error::protocol(format!("tcp handshake: stripe {stripe} of {stripes}")));
        }
        Ok(Handshake { token, rank, stripe, stripes })
    }
}

/// The kinds of frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// Bytes for a region.
    Data = 1,
    /// An 8-byte store, after the data it covers.
    Flag = 2,
    /// A request for an answer once everything before it is applied.
    Flush = 3,
    /// The answer to the flushes up to `sequence`.
    Answer = 4,
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub(crate) kind: FrameKind,
    pub(crate) region: u64,
    pub(crate) offset: u64,
    /// Data: bytes that follow; flag: the value to store.
    pub(crate) value: u64,
    /// Flush: the sequence number to answer.
    pub(crate) sequence: u64,
}

impl FrameHeader {
    pub(crate) fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut out = [0u8; FRAME_HEADER_BYTES];
        out[0] = self.kind as u8;
        for (i, w) in [self.region, self.offset, self.value, self.sequence].into_iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8; FRAME_HEADER_BYTES]) -> Result<Self> {
        let kind = match bytes[0] {
            1 => FrameKind::Data,
            2 => FrameKind::Flag,
            3 => FrameKind::Flush,
            4 => FrameKind::Answer,
            k => return Err(Error::protocol(format!("tcp frame of unknown kind {k}"))),
        };
        if bytes[1..8].iter().any(|&b| b != 0) {
            return Err(Error::protocol("tcp frame header with non-zero padding"));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        let header = FrameHeader { kind, region: word(0), offset: word(1), value: word(2), sequence: word(3) };
        if kind == FrameKind::Data && header.value > MAX_FRAME_BYTES as u64 {
            return Err(Error::protocol(format!(
                "tcp data frame of {} bytes (at most {MAX_FRAME_BYTES})",
                header.value
            )));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_round_trip_and_garbage_is_refused() {
        let h = Handshake { token: [7; 16], rank: 3, stripe: 1, stripes: 2 };
        let bytes = h.encode();
        assert_eq!(bytes.len(), HANDSHAKE_BYTES);
        assert_eq!(Handshake::decode(&bytes).unwrap(), h);
        for cut in 0..bytes.len() {
            assert!(matches!(Handshake::decode(&bytes[..cut]), Err(Error::Protocol(_))), "cut {cut}");
        }
        for (stripe, stripes) in [(2, 2), (0, 0), (0, 17)] {
            let bad = Handshake { stripe, stripes, ..h }.encode();
            assert!(matches!(Handshake::decode(&bad), Err(Error::Protocol(_))), "{stripe}/{stripes}");
        }
    }

    #[test]
    fn frame_headers_round_trip_and_bad_ones_are_refused() {
        let f = FrameHeader { kind: FrameKind::Flag, region: 9, offset: 64, value: u64::MAX, sequence: 5 };
        assert_eq!(FrameHeader::decode(&f.encode()).unwrap(), f);
        let mut bad = f.encode();
        bad[0] = 9;
        assert!(matches!(FrameHeader::decode(&bad), Err(Error::Protocol(_))));
        let mut bad = f.encode();
        bad[3] = 1;
        assert!(matches!(FrameHeader::decode(&bad), Err(Error::Protocol(_))));
        let big = FrameHeader { kind: FrameKind::Data, value: MAX_FRAME_BYTES as u64 + 1, ..f };
        assert!(matches!(FrameHeader::decode(&big.encode()), Err(Error::Protocol(_))));
    }
}
