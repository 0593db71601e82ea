//! A rank's TCP endpoint: where its listener is and the token a socket must present there, and
//! how the address to listen on is chosen.
//!
//! Wire format (little-endian, through [`comm_core::wire`]): magic `WVTE`, version `1`, address
//! family `u8` (4 or 6), the address (4 or 16 bytes), port `u16`, token (16 bytes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use comm_core::local_address;
use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

const MAGIC: [u8; 4] = *b"WVTE";
const VERSION: u16 = 1;

/// Where a rank listens and what a socket must present there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) addr: SocketAddr,
    pub(crate) token: [u8; 16],
}

impl Endpoint {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new(MAGIC, VERSION);
        match self.addr.ip() {
            IpAddr::V4(ip) => e.u8(4).raw(&ip.octets()),
            IpAddr::V6(ip) => e.u8(6).raw(&ip.octets()),
        };
        e.u16(self.addr.port()).raw(&self.token).finish()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, "tcp endpoint")?;
        let ip = match d.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(d.raw::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(d.raw::<16>()?)),
            f => return Err(Error::protocol(format!("tcp endpoint: address family {f}"))),
        };
        let port = d.u16()?;
        let token = d.raw::<16>()?;
        d.finish()?;
        if port == 0 || ip.is_unspecified() {
            return Err(Error::protocol(format!("tcp endpoint: {ip}:{port} is not an address to connect to")));
        }
        Ok(Endpoint { addr: SocketAddr::new(ip, port), token })
    }
}

/// The address to listen on: the IPv4 address of `interface` when given; else the local address
/// of the route to `master` (the job's rendezvous host); else loopback.
pub(crate) fn listen_ip(interface: Option<&str>, master: Option<&str>) -> Result<IpAddr> {
    if let Some(name) = interface {
        return match local_address::interface_ipv4(name)? {
            Some(ip) => Ok(IpAddr::V4(ip)),
            None => Err(Error::invalid(format!(
                "WEAVE_SOCKET_IFNAME={name:?}: no interface of that name with an IPv4 address"
            ))),
        };
    }
    Ok(master.and_then(local_address::route_to).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_garbage_is_refused() {
        for addr in ["127.0.0.1:4000", "[::1]:5"] {
            let e = Endpoint { addr: addr.parse().unwrap(), token: [3; 16] };
            let bytes = e.encode();
            assert_eq!(Endpoint::decode(&bytes).unwrap(), e);
            for cut in 0..bytes.len() {
                assert!(matches!(Endpoint::decode(&bytes[..cut]), Err(Error::Protocol(_))), "{addr} cut {cut}");
            }
        }
        let zero = Endpoint { addr: "0.0.0.0:0".parse().unwrap(), token: [0; 16] }.encode();
        assert!(matches!(Endpoint::decode(&zero), Err(Error::Protocol(_))));
    }

    #[test]
    fn the_listen_address_follows_the_interface_or_the_route() {
        assert_eq!(listen_ip(Some("lo"), None).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(matches!(listen_ip(Some("no-such-if0"), None), Err(Error::InvalidArgument(_))));
        assert_eq!(listen_ip(None, Some("127.0.0.1")).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(listen_ip(None, None).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
}
