//! Wire formats of this transport: the export payload carried in a memory descriptor, and the
//! request and reply of the FD server.
//!
//! Export payload (little-endian, through [`comm_core::wire`]): magic `WVCX`, version `1`, kind
//! `u8`, owner pid `u32`, owner process instance `u64`, then
//! - kind 1 (VMM allocation): allocation id `u64`, allocation size `u64`;
//! - kind 2 (legacy IPC handle): the 64-byte `CUipcMemHandle`, base address `u64` (only
//!   meaningful inside the owner's process), base allocation size `u64`, offset of the region
//!   from the base `u64`.
//!
//! FD server request: magic `WVFQ`, version `2`, kind `u8`, then
//! - kind 1 (descriptor): allocation id `u64`;
//! - kind 2 (map): key `u64`, length `u64`, then an export payload (length-prefixed bytes, legacy
//!   kind): map the client's memory in the server's process and keep it under (client pid, key);
//! - kind 3 (unmap): key `u64`: drop that mapping.
//!
//! FD server reply: magic `WVFR`, version `2`, status `u8` (0 = the file descriptor rides along as
//! `SCM_RIGHTS`, followed by the allocation size `u64`; 1 = error, followed by a message string;
//! 2 = mapped, followed by the address in the server's process `u64`; 3 = unmapped).

use comm_core::error::{Error, Result};
use comm_core::memory::MAX_REGISTRATION_LEN;
use comm_core::wire::{Decoder, Encoder};

const PAYLOAD_MAGIC: [u8; 4] = *b"WVCX";
const PAYLOAD_VERSION: u16 = 1;
const PAYLOAD_WHAT: &str = "cudaipc export payload";
const KIND_VMM: u8 = 1;
const KIND_LEGACY: u8 = 2;

const REQUEST_MAGIC: [u8; 4] = *b"WVFQ";
const REPLY_MAGIC: [u8; 4] = *b"WVFR";
const FD_VERSION: u16 = 2;
const REQUEST_FD: u8 = 1;
const REQUEST_MAP: u8 = 2;
const REQUEST_UNMAP: u8 = 3;
/// Longest export payload a map request carries (a legacy payload is about 100 bytes).
pub(crate) const MAX_MAP_PAYLOAD: usize = 256;
/// Size of a receive buffer that holds any well-formed request (and detects longer ones).
pub(crate) const REQUEST_BUFFER: usize = 4 + 2 + 1 + 8 + 8 + 4 + MAX_MAP_PAYLOAD + 32;
/// Longest error message a reply carries.
pub(crate) const MAX_REPLY_MESSAGE: usize = 1024;
/// Size of a receive buffer that holds any well-formed reply (and detects longer ones).
pub(crate) const REPLY_BUFFER: usize = 4 + 2 + 1 + 4 + MAX_REPLY_MESSAGE + 64;

/// How a region can be reached by peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Export {
    /// A cuMem allocation whose file descriptor the owner's FD server hands out.
    Vmm {
        /// The owner's allocation id (unique within the owner process).
        id: u64,
        /// Size of the whole allocation (granularity-rounded).
        size: u64,
    },
    /// A cudaMalloc/cuMemAlloc allocation exported with a legacy IPC handle.
    Legacy {
        /// `CUipcMemHandle` of the base allocation.
        handle: [u8; 64],
        /// Base address in the owner's process.
        base: u64,
        /// Size of the base allocation.
        base_size: u64,
        /// Offset of the registered region from the base.
        offset: u64,
    },
}

/// The payload a backend puts into a memory descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Payload {
    /// Owner process id (must match the owner's endpoint).
    pub(crate) pid: u32,
    /// A number that tells apart two processes that had the same pid.
    pub(crate) instance: u64,
    /// What is exported.
    pub(crate) export: Export,
}

impl Payload {
    /// Serializes the payload.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new(PAYLOAD_MAGIC, PAYLOAD_VERSION);
        match self.export {
            Export::Vmm { id, size } => {
                e.u8(KIND_VMM).u32(self.pid).u64(self.instance).u64(id).u64(size);
            }
            Export::Legacy { handle, base, base_size, offset } => {
                e.u8(KIND_LEGACY).u32(self.pid).u64(self.instance).raw(&handle).u64(base).u64(base_size).u64(offset);
            }
        }
        e.finish()
    }

    /// Parses and checks a payload: known kind, a real pid, sizes within weave's limit, the
    /// offset inside the base allocation. Garbage is [`Error::Protocol`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, PAYLOAD_MAGIC, PAYLOAD_VERSION, PAYLOAD_WHAT)?;
        let kind = d.u8()?;
        let pid = d.u32()?;
        let instance = d.u64()?;
        let export = match kind {
            KIND_VMM => {
                let id = d.u64()?;
                let size = d.u64()?;
                if size == 0 || size > MAX_REGISTRATION_LEN as u64 {
                    return Err(Error::protocol(format!("{PAYLOAD_WHAT}: allocation size {size} is out of range")));
                }
                Export::Vmm { id, size }
            }
            KIND_LEGACY => {
                let handle = d.raw::<64>()?;
                let base = d.u64()?;
                let base_size = d.u64()?;
                let offset = d.u64()?;
                if base == 0 || base_size == 0 || base_size > MAX_REGISTRATION_LEN as u64 || offset > base_size {
                    return Err(Error::protocol(format!(
                        "{PAYLOAD_WHAT}: legacy export with base {base:#x}, base size {base_size}, offset {offset}"
                    )));
                }
                Export::Legacy { handle, base, base_size, offset }
            }
            k => return Err(Error::protocol(format!("{PAYLOAD_WHAT}: unknown export kind {k}"))),
        };
        d.finish()?;
        if pid == 0 || i32::try_from(pid).is_err() {
            return Err(Error::protocol(format!("{PAYLOAD_WHAT}: {pid} is not a process id")));
        }
        Ok(Payload { pid, instance, export })
    }
}

/// What a client asks of an FD server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// A file descriptor of the server's allocation `id`.
    Fd {
        /// The allocation id from the export payload.
        id: u64,
    },
    /// Map the client's memory that `payload` exports (`len` bytes) in the server's process,
    /// keep it under (client pid, `key`) and answer its address there.
    Map {
        /// The client's name for this mapping (unique among its live ones).
        key: u64,
        /// Bytes of the region.
        len: u64,
        /// The region's export payload ([`Payload`], legacy kind).
        payload: Vec<u8>,
    },
    /// Drop the mapping kept under (client pid, `key`).
    Unmap {
        /// The key the client mapped it under.
        key: u64,
    },
}

/// Encodes a request.
pub(crate) fn encode_request(request: &Request) -> Vec<u8> {
    let mut e = Encoder::new(REQUEST_MAGIC, FD_VERSION);
    match request {
        Request::Fd { id } => e.u8(REQUEST_FD).u64(*id),
        Request::Map { key, len, payload } => e.u8(REQUEST_MAP).u64(*key).u64(*len).bytes(payload),
        Request::Unmap { key } => e.u8(REQUEST_UNMAP).u64(*key),
    };
    e.finish()
}

/// Decodes a request; garbage, an unknown kind or an oversized payload is [`Error::Protocol`].
pub(crate) fn decode_request(bytes: &[u8]) -> Result<Request> {
    let mut d = Decoder::new(bytes, REQUEST_MAGIC, FD_VERSION, "cudaipc fd request")?;
    let request = match d.u8()? {
        REQUEST_FD => Request::Fd { id: d.u64()? },
        REQUEST_MAP => {
            let key = d.u64()?;
            let len = d.u64()?;
            let payload = d.bytes()?;
            if payload.len() > MAX_MAP_PAYLOAD {
                return Err(Error::protocol(format!("cudaipc map request: payload of {} bytes", payload.len())));
            }
            if len == 0 || len > MAX_REGISTRATION_LEN as u64 {
                return Err(Error::protocol(format!("cudaipc map request: length {len} is out of range")));
            }
            Request::Map { key, len, payload: payload.to_vec() }
        }
        REQUEST_UNMAP => Request::Unmap { key: d.u64()? },
        k => return Err(Error::protocol(format!("cudaipc fd request: unknown kind {k}"))),
    };
    d.finish()?;
    Ok(request)
}

/// What the FD server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The descriptor is attached; the allocation has this size.
    Fd {
        /// Allocation size.
        size: u64,
    },
    /// The server refused or failed.
    Error(String),
    /// The memory of a map request is mapped at this address in the server's process.
    Mapped {
        /// The address there.
        address: u64,
    },
    /// The mapping of an unmap request is gone.
    Unmapped,
}

/// Encodes a reply (messages are cut to [`MAX_REPLY_MESSAGE`] bytes on a char boundary).
pub(crate) fn encode_reply(reply: &Reply) -> Vec<u8> {
    let mut e = Encoder::new(REPLY_MAGIC, FD_VERSION);
    match reply {
        Reply::Fd { size } => e.u8(0).u64(*size),
        Reply::Error(m) => {
            let mut end = m.len().min(MAX_REPLY_MESSAGE);
            while !m.is_char_boundary(end) {
                end -= 1;
            }
            e.u8(1).str(&m[..end])
        }
        Reply::Mapped { address } => e.u8(2).u64(*address),
        Reply::Unmapped => e.u8(3),
    };
    e.finish()
}

/// Decodes a reply.
pub(crate) fn decode_reply(bytes: &[u8]) -> Result<Reply> {
    let mut d = Decoder::new(bytes, REPLY_MAGIC, FD_VERSION, "cudaipc fd reply")?;
    let reply = match d.u8()? {
        0 => Reply::Fd { size: d.u64()? },
        1 => {
            let m = d.str()?;
            if m.len() > MAX_REPLY_MESSAGE {
                return Err(Error::protocol("cudaipc fd reply: error message too long"));
            }
            Reply::Error(m.to_string())
        }
        2 => Reply::Mapped { address: d.u64()? },
        3 => Reply::Unmapped,
        s => return Err(Error::protocol(format!("cudaipc fd reply: unknown status {s}"))),
    };
    d.finish()?;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Payload> {
        let mut handle = [0u8; 64];
        for (i, b) in handle.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7).wrapping_add(1);
        }
        vec![
            Payload { pid: 1234, instance: 0xfeed, export: Export::Vmm { id: 5, size: 2 << 20 } },
            Payload {
                pid: 99,
                instance: u64::MAX,
                export: Export::Legacy { handle, base: 0x7f00_0000_0000, base_size: 4096, offset: 4096 },
            },
        ]
    }

    #[test]
    fn payloads_round_trip() {
        for p in samples() {
            assert_eq!(Payload::decode(&p.encode()).unwrap(), p);
        }
    }

    #[test]
    fn every_truncation_extension_and_corruption_is_a_protocol_error() {
        for p in samples() {
            let bytes = p.encode();
            for bad in comm_core::wire::damaged_messages(&bytes) {
                assert!(matches!(Payload::decode(&bad), Err(Error::Protocol(_))), "{bad:02x?} of {p:?}");
            }
            // The kind byte, after magic and version.
            let mut bad_kind = bytes.clone();
            bad_kind[6] ^= 0x40;
            assert!(matches!(Payload::decode(&bad_kind), Err(Error::Protocol(_))), "kind of {p:?}");
        }
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        let bad = [
            Payload { pid: 0, instance: 1, export: Export::Vmm { id: 1, size: 1 } },
            Payload { pid: 1 << 31, instance: 1, export: Export::Vmm { id: 1, size: 1 } },
            Payload { pid: 1, instance: 1, export: Export::Vmm { id: 1, size: 0 } },
            Payload { pid: 1, instance: 1, export: Export::Vmm { id: 1, size: MAX_REGISTRATION_LEN as u64 + 1 } },
            Payload {
                pid: 1,
                instance: 1,
                export: Export::Legacy { handle: [0; 64], base: 0, base_size: 8, offset: 0 },
            },
            Payload {
                pid: 1,
                instance: 1,
                export: Export::Legacy { handle: [0; 64], base: 8, base_size: 0, offset: 0 },
            },
            Payload {
                pid: 1,
                instance: 1,
                export: Export::Legacy { handle: [0; 64], base: 8, base_size: 8, offset: 9 },
            },
        ];
        for p in bad {
            assert!(matches!(Payload::decode(&p.encode()), Err(Error::Protocol(_))), "{p:?}");
        }
    }

    #[test]
    fn requests_and_replies_round_trip_and_reject_garbage() {
        let requests = [
            Request::Fd { id: 77 },
            Request::Map { key: 9, len: 4096, payload: samples()[1].encode() },
            Request::Unmap { key: u64::MAX },
        ];
        for request in &requests {
            let bytes = encode_request(request);
            assert!(bytes.len() <= REQUEST_BUFFER, "{} bytes", bytes.len());
            assert_eq!(&decode_request(&bytes).unwrap(), request);
            for bad in comm_core::wire::damaged_messages(&bytes) {
                assert!(decode_request(&bad).is_err(), "{bad:02x?}");
            }
        }
        assert!(decode_request(&encode_reply(&Reply::Fd { size: 1 })).is_err());
        for bad in [
            Request::Map { key: 1, len: 0, payload: vec![1] },
            Request::Map { key: 1, len: MAX_REGISTRATION_LEN as u64 + 1, payload: vec![1] },
            Request::Map { key: 1, len: 8, payload: vec![0; MAX_MAP_PAYLOAD + 1] },
        ] {
            assert!(matches!(decode_request(&encode_request(&bad)), Err(Error::Protocol(_))), "{bad:?}");
        }
        let mut bad_kind = encode_request(&Request::Unmap { key: 1 });
        bad_kind[6] = 9;
        assert!(decode_request(&bad_kind).is_err());

        for reply in [
            Reply::Fd { size: 2 << 20 },
            Reply::Error("unknown allocation".into()),
            Reply::Mapped { address: 0x7f00_0000_1000 },
            Reply::Unmapped,
        ] {
            let bytes = encode_reply(&reply);
            assert!(bytes.len() <= REPLY_BUFFER);
            assert_eq!(decode_reply(&bytes).unwrap(), reply);
            for bad in comm_core::wire::damaged_messages(&bytes) {
                assert!(decode_reply(&bad).is_err(), "{bad:02x?}");
            }
        }
        let mut bad_status = encode_reply(&Reply::Fd { size: 1 });
        bad_status[6] = 7;
        assert!(decode_reply(&bad_status).is_err());
        // Long messages are cut to the limit (on a char boundary) and still decode.
        let long_msg = "é".repeat(MAX_REPLY_MESSAGE);
        let bytes = encode_reply(&Reply::Error(long_msg));
        assert!(bytes.len() <= REPLY_BUFFER);
        match decode_reply(&bytes).unwrap() {
            Reply::Error(m) => assert!(m.len() <= MAX_REPLY_MESSAGE && m.chars().all(|c| c == 'é')),
            r => panic!("{r:?}"),
        }
        let too_long = Encoder::new(REPLY_MAGIC, FD_VERSION).u8(1).str(&"x".repeat(MAX_REPLY_MESSAGE + 1)).finish();
        assert!(decode_reply(&too_long).is_err());
    }
}
