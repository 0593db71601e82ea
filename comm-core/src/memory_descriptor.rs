//! [`MemoryDescriptor`]: the serialized form of a registration that its owner sends to peers,
//! who import the memory through a transport it names.

use crate::error::{Error, Result};
use crate::memory::{MAX_REGISTRATION_LEN, MemoryKind};
use crate::transport::Transport;
use crate::wire::{Decoder, Encoder, digest64};

/// The serialized form of a registration, sent to peers.
///
/// Wire format (little-endian): magic `WVMR`, version, owner rank `u32`, sequence `u64`, digest
/// `u64`, kind (`u8` tag + `u32` device), length `u64`, label (`u32` length + UTF-8), number of
/// exports `u8`, then per export a transport name (`u32` length + bytes, see
/// [`Transport::encode`]) and a payload (`u32` length + bytes). Exports through transports this
/// process never registered are left out when decoding: this rank cannot import through them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryDescriptor {
    /// Rank that owns the memory.
    pub owner: usize,
    /// Position of this registration in its communicator's registration order.
    pub seq: u64,
    /// Digest of (sequence, label, kind): equal on every rank for the same registration step.
    pub digest: u64,
    /// Where the memory lives on its owner.
    pub kind: MemoryKind,
    /// Length in bytes.
    pub len: usize,
    /// The name the owner gave the registration.
    pub label: String,
    /// How each transport can reach it: (transport, transport-specific payload).
    pub exports: Vec<(Transport, Vec<u8>)>,
}

const DESCRIPTOR_MAGIC: [u8; 4] = *b"WVMR";
/// 2: exports name their transports, not flag bits.
const DESCRIPTOR_VERSION: u16 = 2;

impl MemoryDescriptor {
    /// The descriptor of registration step `seq` of rank `owner`: `len` bytes of `kind` memory
    /// labelled `label`, exported through `exports`, with the digest of
    /// [`digest_for`](Self::digest_for).
    pub fn new(
        owner: usize,
        seq: u64,
        label: &str,
        kind: MemoryKind,
        len: usize,
        exports: Vec<(Transport, Vec<u8>)>,
    ) -> Self {
        MemoryDescriptor {
            owner,
            seq,
            digest: MemoryDescriptor::digest_for(seq, label, kind),
            kind,
            len,
            label: label.to_string(),
            exports,
        }
    }

    /// The digest every rank computes for registration step `seq` with this label and kind.
    /// Only host versus device enters it: each rank registers memory of its own GPU, so device
    /// ordinals legitimately differ between ranks.
    pub fn digest_for(seq: u64, label: &str, kind: MemoryKind) -> u64 {
        let class: &[u8] = match kind {
            MemoryKind::Host => b"host",
            MemoryKind::Device(_) => b"device",
        };
        digest64(&[&seq.to_le_bytes(), label.as_bytes(), class])
    }

    /// Serializes the descriptor.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new(DESCRIPTOR_MAGIC, DESCRIPTOR_VERSION);
        e.u32(self.owner as u32).u64(self.seq).u64(self.digest);
        self.kind.encode(&mut e);
        e.usize(self.len).str(&self.label).u8(self.exports.len() as u8);
        for (t, payload) in &self.exports {
            t.encode(&mut e);
            e.bytes(payload);
        }
        e.finish()
    }

    /// Parses and checks a descriptor: every length, the memory kind, and each export's
    /// transport name. Exports through transports this process never registered are dropped;
    /// a transport named twice is an [`Error::Protocol`].
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, DESCRIPTOR_MAGIC, DESCRIPTOR_VERSION, "memory descriptor")?;
        let owner = d.u32()? as usize;
        let seq = d.u64()?;
        let digest = d.u64()?;
        let kind = MemoryKind::decode(&mut d)?;
        let len = d.usize()?;
        if len > MAX_REGISTRATION_LEN {
            return Err(Error::protocol(format!(
                "memory descriptor: length {len} is larger than {MAX_REGISTRATION_LEN}"
            )));
        }
        let label = d.str()?.to_string();
        let exports = Transport::decode_entries(&mut d, "memory descriptor", |t| {
            format!("memory descriptor: transport {t} exported twice")
        })?;
        d.finish()?;
        Ok(MemoryDescriptor { owner, seq, digest, kind, len, label, exports })
    }

    /// The payload for transport `t`, if the owner exported through it.
    pub fn export_for(&self, t: Transport) -> Option<&[u8]> {
        self.exports.iter().find(|(x, _)| *x == t).map(|(_, p)| p.as_slice())
    }
}

/// The kind as the descriptor carries it: a tag and the device ordinal (0 for host memory).
impl MemoryKind {
    fn encode(self, e: &mut Encoder) {
        match self {
            MemoryKind::Host => e.u8(0).u32(0),
            MemoryKind::Device(d) => e.u8(1).u32(d),
        };
    }

    fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let tag = d.u8()?;
        let ordinal = d.u32()?;
        match tag {
            0 => Ok(MemoryKind::Host),
            1 => Ok(MemoryKind::Device(ordinal)),
            t => Err(Error::protocol(format!("memory descriptor: unknown memory kind {t}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(len: usize) -> MemoryDescriptor {
        let exports = vec![(named("mem-test-a"), vec![1, 2, 3]), (named("mem-test-b"), vec![])];
        MemoryDescriptor::new(3, 9, "buf", MemoryKind::Host, len, exports)
    }

    fn named(name: &str) -> Transport {
        Transport::named(name).unwrap()
    }

    /// `descriptor(8)`'s bytes with `exports` in place of its own.
    fn with_exports(exports: &[(&[u8], &[u8])]) -> Vec<u8> {
        let d = descriptor(8);
        let mut e = Encoder::new(DESCRIPTOR_MAGIC, DESCRIPTOR_VERSION);
        e.u32(d.owner as u32).u64(d.seq).u64(d.digest);
        d.kind.encode(&mut e);
        e.usize(d.len).str(&d.label).u8(exports.len() as u8);
        for (name, payload) in exports {
            e.bytes(name).bytes(payload);
        }
        e.finish()
    }

    #[test]
    fn exports_through_unknown_transports_are_dropped() {
        assert_eq!(MemoryDescriptor::decode(&with_exports(&[])).unwrap().exports, vec![]);
        let bytes =
            with_exports(&[(b"mem-test-unknown", b"xyz"), (b"mem-test-a", b"\x01"), (b"mem-test-unknown-2", b"")]);
        let d = MemoryDescriptor::decode(&bytes).unwrap();
        assert_eq!(d.exports, vec![(named("mem-test-a"), vec![1])]);
        assert_eq!(d.export_for(named("mem-test-a")), Some(&[1u8][..]));
        assert_eq!(Transport::lookup("mem-test-unknown"), None, "decoding registered a name");
    }

    #[test]
    fn malformed_or_repeated_export_names_are_protocol_errors() {
        let long = [b'm'; 33];
        for bad in [&b""[..], b"Mem", b"mem test", b"\xff", &long] {
            let r = MemoryDescriptor::decode(&with_exports(&[(bad, b"p")]));
            assert!(matches!(r, Err(Error::Protocol(_))), "{bad:?} gave {r:?}");
        }
        let twice = with_exports(&[(b"mem-test-a", b"1"), (b"mem-test-a", b"2")]);
        assert!(matches!(MemoryDescriptor::decode(&twice), Err(Error::Protocol(_))));
    }

    #[test]
    fn descriptor_round_trips_and_rejects_damage() {
        let d = descriptor(4096);
        let bytes = d.encode();
        assert_eq!(MemoryDescriptor::decode(&bytes).unwrap(), d);
        for cut in 0..bytes.len() {
            assert!(MemoryDescriptor::decode(&bytes[..cut]).is_err(), "truncated at {cut} decoded");
        }
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(MemoryDescriptor::decode(&bad).is_err());
        let mut huge = descriptor(MAX_REGISTRATION_LEN + 1).encode();
        assert!(MemoryDescriptor::decode(&huge).is_err());
        huge.push(0);
        assert!(MemoryDescriptor::decode(&huge).is_err());
    }

    #[test]
    fn digests_ignore_the_device_ordinal_but_not_host_versus_device() {
        let d = |k| MemoryDescriptor::digest_for(3, "x", k);
        assert_eq!(d(MemoryKind::Device(0)), d(MemoryKind::Device(1)));
        assert_ne!(d(MemoryKind::Device(0)), d(MemoryKind::Host));
        assert_ne!(
            MemoryDescriptor::digest_for(3, "x", MemoryKind::Host),
            MemoryDescriptor::digest_for(4, "x", MemoryKind::Host)
        );
    }
}
