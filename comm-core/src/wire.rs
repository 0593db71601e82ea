//! Explicit, versioned little-endian encoding for everything weave sends between processes.
//!
//! Every message starts with a 4-byte magic and a 2-byte version. [`Decoder`] checks every
//! length against what is left, so truncated or corrupted bytes give [`Error::Protocol`],
//! never a panic or an out-of-bounds read.

use crate::error::{Error, Result};

/// Largest length prefix a decoder accepts for one byte string (1 GiB).
pub const MAX_FIELD_LEN: usize = 1 << 30;

/// Builds one message: magic, version, then fields in order.
#[derive(Debug)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// Starts a message with its magic and version.
    pub fn new(magic: [u8; 4], version: u16) -> Self {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&magic);
        buf.extend_from_slice(&version.to_le_bytes());
        Encoder { buf }
    }

    /// Appends a `u8`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// Appends a `u16`, little-endian.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `u32`, little-endian.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `u64`, little-endian.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `usize` as a `u64`.
    pub fn usize(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }

    /// Appends fixed-size bytes with no length prefix.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self
    }

    /// Appends a byte string with a `u32` length prefix.
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.u32(bytes.len() as u32);
        self.buf.extend_from_slice(bytes);
        self
    }

    /// Appends a UTF-8 string with a `u32` length prefix.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    /// The finished message.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Reads one message written by [`Encoder`], checking every step.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Decoder<'a> {
    /// Checks the magic and version of `buf`; `what` names the message in errors.
    pub fn new(buf: &'a [u8], magic: [u8; 4], version: u16, what: &'static str) -> Result<Self> {
        let mut d = Decoder { buf, pos: 0, what };
        let got_magic = d.array::<4>()?;
        if got_magic != magic {
            return Err(Error::protocol(format!(
                "{what}: bad magic {got_magic:02x?}, expected {magic:02x?} (not a weave message, or a different kind)"
            )));
        }
        let got_version = d.u16()?;
        if got_version != version {
            return Err(Error::protocol(format!(
                "{what}: wire version {got_version}, this build speaks {version}; run the same weave version on every rank"
            )));
        }
        Ok(d)
    }

    /// What the message is, as errors about it name it.
    pub fn what(&self) -> &'static str {
        self.what
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(Error::protocol(format!(
                "{}: truncated at byte {} (needed {n} more bytes, {left} left)",
                self.what, self.pos
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Reads a `u8`.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads a `u64` that must fit a `usize`.
    pub fn usize(&mut self) -> Result<usize> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| Error::protocol(format!("{}: value {v} does not fit usize", self.what)))
    }

    /// Reads `N` raw bytes.
    pub fn raw<const N: usize>(&mut self) -> Result<[u8; N]> {
        self.array()
    }

    /// Reads a `u32`-length-prefixed byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > MAX_FIELD_LEN {
            return Err(Error::protocol(format!("{}: field length {n} exceeds {MAX_FIELD_LEN}", self.what)));
        }
        self.take(n)
    }

    /// Reads a `u32`-length-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<&'a str> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|_| Error::protocol(format!("{}: string field is not UTF-8", self.what)))
    }

    /// Checks that nothing is left over.
    pub fn finish(self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(Error::protocol(format!(
                "{}: {} unexpected trailing bytes",
                self.what,
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

/// A 64-bit FNV-1a digest: cheap, stable across builds and machines; used to compare what ranks
/// registered, never for security.
pub fn digest64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate parts so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses lower- or upper-case hex into exactly `N` bytes.
pub fn parse_hex<const N: usize>(s: &str) -> Result<[u8; N]> {
    let s = s.trim();
    if s.len() != 2 * N || !s.is_ascii() {
        return Err(Error::invalid(format!("expected {} hex digits, got {:?}", 2 * N, s)));
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| Error::invalid(format!("not a hex string: {s:?}")))?;
    }
    Ok(out)
}

/// `N` random bytes from `/dev/urandom`, for secrets and tokens that messages carry; a failed
/// read is [`Error::Io`] of `operation` (what was being read, and why).
pub fn random_bytes<const N: usize>(operation: &str) -> Result<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io(operation, e))?;
    Ok(bytes)
}

/// Bytes of the header [`Encoder::new`] writes: the magic and the version.
const HEADER_LEN: usize = 4 + 2;

/// Damaged copies of `bytes`, a valid message in this module's format, that its decoder must
/// refuse (as [`Error::Protocol`], which [`Decoder`] gives): every strict prefix, the message
/// with one byte appended, and the message with each byte of its magic and version changed. The
/// tests of each wire format check them all.
pub fn damaged_messages(bytes: &[u8]) -> Vec<Vec<u8>> {
    let prefixes = (0..bytes.len()).map(|cut| bytes[..cut].to_vec());
    let extended = std::iter::once([bytes, &[0]].concat());
    let bad_header = (0..HEADER_LEN.min(bytes.len())).map(|i| {
        let mut bad = bytes.to_vec();
        bad[i] ^= 0x5a;
        bad
    });
    prefixes.chain(extended).chain(bad_header).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGIC: [u8; 4] = *b"TEST";

    #[test]
    fn round_trip() {
        let msg = Encoder::new(MAGIC, 3).u8(7).u16(513).u32(70_000).u64(u64::MAX).str("héllo").bytes(&[1, 2]).finish();
        let mut d = Decoder::new(&msg, MAGIC, 3, "test").unwrap();
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u16().unwrap(), 513);
        assert_eq!(d.u32().unwrap(), 70_000);
        assert_eq!(d.u64().unwrap(), u64::MAX);
        assert_eq!(d.str().unwrap(), "héllo");
        assert_eq!(d.bytes().unwrap(), &[1, 2]);
        d.finish().unwrap();
    }

    #[test]
    fn every_truncation_and_damaged_message_is_an_error() {
        let msg = Encoder::new(MAGIC, 1).u64(5).str("abc").finish();
        let damaged = damaged_messages(&msg);
        assert_eq!(damaged.len(), msg.len() + 1 + HEADER_LEN, "every prefix, one extension, each header byte");
        for bad in damaged {
            let r = Decoder::new(&bad, MAGIC, 1, "test").and_then(|mut d| {
                d.u64()?;
                d.str()?;
                d.finish()
            });
            assert!(matches!(r, Err(Error::Protocol(_))), "{bad:02x?} gave {r:?}");
        }
    }

    #[test]
    fn wrong_magic_version_and_trailing_bytes_are_errors() {
        let msg = Encoder::new(MAGIC, 1).u8(1).finish();
        assert!(Decoder::new(&msg, *b"NOPE", 1, "t").is_err());
        assert!(Decoder::new(&msg, MAGIC, 2, "t").is_err());
        let d = Decoder::new(&msg, MAGIC, 1, "t").unwrap();
        assert!(d.finish().is_err());
    }

    #[test]
    fn huge_length_prefix_is_refused() {
        let msg = Encoder::new(MAGIC, 1).u32(u32::MAX).finish();
        let mut d = Decoder::new(&msg, MAGIC, 1, "t").unwrap();
        assert!(d.bytes().is_err());
    }

    #[test]
    fn digest_separates_parts_and_hex_round_trips() {
        assert_ne!(digest64(&[b"ab", b"c"]), digest64(&[b"a", b"bc"]));
        let h = hex(&[0xde, 0xad, 0x01]);
        assert_eq!(h, "dead01");
        assert_eq!(parse_hex::<3>(&h).unwrap(), [0xde, 0xad, 0x01]);
        assert!(parse_hex::<3>("zz0000").is_err());
        assert!(parse_hex::<2>("abc").is_err());
    }
}
