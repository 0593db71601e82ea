//! The identity of one job: where its root listens and the secret every connection must show.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener};
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::wire::{self, Decoder, Encoder};

/// Magic of a serialized [`UniqueId`].
const UNIQUE_ID_MAGIC: [u8; 4] = *b"WVID";
/// Wire version of a serialized [`UniqueId`].
const UNIQUE_ID_VERSION: u16 = 1;
/// Prefix of the text form; the digit is the text-format version.
const TEXT_PREFIX: &str = "weave1:";

/// Address family tags in the wire format.
const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;

/// Everything a rank needs to join a job: the root's address and the job's 128-bit secret.
///
/// Rank 0 listens on [`addr`](UniqueId::addr); every other rank connects there. Every bootstrap
/// connection opens with [`secret`](UniqueId::secret), and connections showing another secret
/// are refused, so jobs sharing a host never talk to each other by accident. The secret travels
/// in clear text: it guards against mistakes and strays, not against someone who can read the
/// network.
///
/// The text form (for environment variables and command lines) is `weave1:<32 hex digits>@<addr>`;
/// `Debug` never prints the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    /// Where rank 0 listens and every other rank connects.
    pub addr: SocketAddr,
    /// The job's secret; every bootstrap connection must present it.
    pub secret: [u8; 16],
}

impl UniqueId {
    /// A new id for a root at `addr`, with a fresh random secret from `/dev/urandom`.
    pub fn new(addr: SocketAddr) -> Result<Self> {
        Ok(UniqueId { addr, secret: wire::random_bytes("read 16 bytes from /dev/urandom")? })
    }

    /// An id with a given secret (for launchers that derive or pass the secret themselves).
    pub fn with_secret(addr: SocketAddr, secret: [u8; 16]) -> Self {
        UniqueId { addr, secret }
    }

    /// A new id (random secret) on a port of `ip` that was free a moment ago.
    ///
    /// The port is found by binding port 0 and closing the listener again, so another process
    /// could take it before rank 0 binds it; good for tests and for a launcher that starts the
    /// ranks right away.
    pub fn on_free_port(ip: IpAddr) -> Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(format!("bind {ip} port 0 to find a free port"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("read the address of a port-0 listener", e))?;
        drop(listener);
        UniqueId::new(addr)
    }

    /// 16 hex digits derived from the secret, unique to this job; safe to show (it does not
    /// reveal the secret) and used to name OS objects.
    pub fn job_key(&self) -> String {
        format!("{:016x}", wire::digest64(&[b"weave job key", &self.secret]))
    }

    /// The explicit versioned little-endian wire form: magic `WVID`, version, address, secret.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut enc = Encoder::new(UNIQUE_ID_MAGIC, UNIQUE_ID_VERSION);
        encode_socket_addr(&mut enc, &self.addr);
        enc.raw(&self.secret);
        enc.finish()
    }

    /// Parses [`UniqueId::to_bytes`]; truncated, corrupted or trailing bytes give
    /// [`Error::Protocol`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut dec = Decoder::new(bytes, UNIQUE_ID_MAGIC, UNIQUE_ID_VERSION, "unique id")?;
        let addr = decode_socket_addr(&mut dec)?;
        let secret = dec.raw::<16>()?;
        dec.finish()?;
        Ok(UniqueId { addr, secret })
    }

    /// True when `candidate` equals this id's secret; compares every byte (no early exit), so
    /// the time taken does not tell how many leading bytes were right.
    pub(crate) fn secret_matches(&self, candidate: &[u8; 16]) -> bool {
        let difference = self.secret.iter().zip(candidate.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(difference) == 0
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("addr", &self.addr)
            .field("job_key", &self.job_key())
            .field("secret", &format_args!("<hidden>"))
            .finish()
    }
}

impl fmt::Display for UniqueId {
    /// `weave1:<32 hex digits>@<addr>` — this prints the secret; pass it only to the job's ranks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TEXT_PREFIX}{}@{}", wire::hex(&self.secret), self.addr)
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// Parses `weave1:<32 hex digits>@<addr>` (`addr` as `ip:port` or `[ipv6]:port`). Errors never
    /// echo the secret part.
    fn from_str(text: &str) -> Result<Self> {
        let text = text.trim();
        let rest = text.strip_prefix(TEXT_PREFIX).ok_or_else(|| {
            Error::invalid(format!(
                "a weave unique id starts with {TEXT_PREFIX:?} (form weave1:<32 hex digits>@<ip:port>)"
            ))
        })?;
        let (secret_hex, addr_text) = rest.split_once('@').ok_or_else(|| {
            Error::invalid("a weave unique id has the form weave1:<32 hex digits>@<ip:port>; '@' is missing")
        })?;
        let secret = wire::parse_hex::<16>(secret_hex)
            .map_err(|_| Error::invalid("the secret of a weave unique id must be exactly 32 hex digits"))?;
        let addr = SocketAddr::from_str(addr_text).map_err(|_| {
            Error::invalid(format!(
                "the address of a weave unique id must be ip:port or [ipv6]:port, got {addr_text:?}"
            ))
        })?;
        Ok(UniqueId { addr, secret })
    }
}

/// Appends a socket address: family (`4` or `6`), address bytes, (IPv6: flow info and scope
/// id), port.
pub(crate) fn encode_socket_addr(enc: &mut Encoder, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            enc.u8(FAMILY_V4).raw(&a.ip().octets()).u16(a.port());
        }
        SocketAddr::V6(a) => {
            enc.u8(FAMILY_V6).raw(&a.ip().octets()).u32(a.flowinfo()).u32(a.scope_id()).u16(a.port());
        }
    }
}

/// Reads what [`encode_socket_addr`] wrote.
pub(crate) fn decode_socket_addr(dec: &mut Decoder<'_>) -> Result<SocketAddr> {
    match dec.u8()? {
        FAMILY_V4 => {
            let ip = Ipv4Addr::from(dec.raw::<4>()?);
            let port = dec.u16()?;
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        FAMILY_V6 => {
            let ip = Ipv6Addr::from(dec.raw::<16>()?);
            let flowinfo = dec.u32()?;
            let scope_id = dec.u32()?;
            let port = dec.u16()?;
            Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, flowinfo, scope_id)))
        }
        other => Err(Error::protocol(format!("socket address: unknown address family {other} (expected 4 or 6)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> UniqueId {
        UniqueId::with_secret("127.0.0.1:29500".parse().unwrap(), *b"0123456789abcdef")
    }

    #[test]
    fn new_ids_get_different_random_secrets() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let a = UniqueId::new(addr).unwrap();
        let b = UniqueId::new(addr).unwrap();
        assert_ne!(a.secret, b.secret);
        assert_ne!(a.job_key(), b.job_key());
    }

    #[test]
    fn string_round_trip_v4_and_v6() {
        let id = sample();
        let text = id.to_string();
        assert_eq!(text, format!("weave1:{}@127.0.0.1:29500", wire::hex(b"0123456789abcdef")));
        assert_eq!(text.parse::<UniqueId>().unwrap(), id);

        let v6 = UniqueId::with_secret("[::1]:7000".parse().unwrap(), [0xab; 16]);
        assert_eq!(v6.to_string().parse::<UniqueId>().unwrap(), v6);
    }

    #[test]
    fn malformed_strings_are_invalid_arguments_that_hide_the_secret() {
        let hex = wire::hex(b"0123456789abcdef");
        for bad in [
            String::new(),
            format!("weave2:{hex}@127.0.0.1:1"),
            format!("weave1:{hex}"),
            format!("weave1:{}@127.0.0.1:1", &hex[..30]),
            format!("weave1:{}zz@127.0.0.1:1", &hex[..30]),
            format!("weave1:{hex}@localhost:1"),
            format!("weave1:{hex}@127.0.0.1"),
        ] {
            match bad.parse::<UniqueId>() {
                Err(Error::InvalidArgument(message)) => assert!(!message.contains(&hex[..30]), "{message}"),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn bytes_round_trip_v4_and_v6() {
        let id = sample();
        assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
        let v6 = UniqueId::with_secret(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 9, 3, 7)), [1; 16]);
        assert_eq!(UniqueId::from_bytes(&v6.to_bytes()).unwrap(), v6);
    }

    #[test]
    fn truncated_and_corrupted_bytes_are_protocol_errors() {
        let bytes = sample().to_bytes();
        for bad in wire::damaged_messages(&bytes) {
            assert!(matches!(UniqueId::from_bytes(&bad), Err(Error::Protocol(_))), "{bad:02x?}");
        }
        let mut bad_family = bytes;
        bad_family[6] = 5;
        assert!(matches!(UniqueId::from_bytes(&bad_family), Err(Error::Protocol(_))));
    }

    #[test]
    fn debug_hides_the_secret_and_job_key_does_not_reveal_it() {
        let id = sample();
        let debug = format!("{id:?}");
        assert!(debug.contains("<hidden>"), "{debug}");
        assert!(!debug.contains(&wire::hex(&id.secret)), "{debug}");
        assert!(!debug.contains("0123456789abcdef"), "{debug}");
        let key = id.job_key();
        assert_eq!(key.len(), 16);
        assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!wire::hex(&id.secret).contains(&key));
    }

    #[test]
    fn secret_comparison() {
        let id = sample();
        assert!(id.secret_matches(b"0123456789abcdef"));
        assert!(!id.secret_matches(b"0123456789abcdeF"));
        assert!(!id.secret_matches(&[0; 16]));
    }

    #[test]
    fn free_port_ids_are_bindable() {
        let id = UniqueId::on_free_port(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert_ne!(id.addr.port(), 0);
        TcpListener::bind(id.addr).unwrap();
    }
}
