//! Which of this host's addresses peers on other hosts can reach it at, for a listener that
//! must be found from elsewhere (a bootstrap root, a TCP transport): the local address of the
//! route towards a host the job names (its rendezvous host), else of the default route, else
//! the first interface that is up and not loopback (Docker bridges left out, as NCCL leaves
//! them out), else loopback. A route is found with a UDP `connect`, which asks the kernel for
//! the route and sends nothing.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};

use nix::net::if_::InterfaceFlags;

use crate::error::{Error, Result};

/// An address in a private network, for the default route (any host without a more specific
/// route to it takes the default one).
const PRIVATE_PROBE: Ipv4Addr = Ipv4Addr::new(10, 255, 255, 255);

/// The local address of this host's route to `host` (an address, or a name to resolve), or
/// `None` when there is no route to it.
pub fn route_to(host: &str) -> Option<IpAddr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect((host, 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// The IPv4 address of the interface named `name`, or `None` when no interface of that name
/// has one.
pub fn interface_ipv4(name: &str) -> Result<Option<Ipv4Addr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| Error::errno("getifaddrs", e))?;
    Ok(addrs
        .filter(|a| a.interface_name == name)
        .find_map(|a| a.address.as_ref().and_then(|s| s.as_sockaddr_in()).map(|s| s.ip())))
}

/// The IPv4 address of the first interface that is up, not loopback and not a Docker bridge.
fn first_interface() -> Option<Ipv4Addr> {
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    addrs
        .filter(|a| a.flags.contains(InterfaceFlags::IFF_UP) && !a.flags.contains(InterfaceFlags::IFF_LOOPBACK))
        .filter(|a| !a.interface_name.starts_with("docker"))
        .find_map(|a| a.address.as_ref().and_then(|s| s.as_sockaddr_in()).map(|s| s.ip()))
}

/// The address peers on other hosts reach this one at (see the module documentation):
/// towards `rendezvous` when given (loopback when that host is this one), else by the
/// default route, else the first interface up, else loopback.
pub fn reachable_ip(rendezvous: Option<&str>) -> IpAddr {
    if let Some(ip) = rendezvous.and_then(route_to) {
        return ip;
    }
    if let Some(ip) = route_to(&PRIVATE_PROBE.to_string()).filter(|ip| !ip.is_loopback()) {
        return ip;
    }
    first_interface().map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_interfaces_and_the_fallbacks() {
        assert_eq!(route_to("127.0.0.1"), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(interface_ipv4("lo").unwrap(), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(interface_ipv4("no-such-if0").unwrap(), None);
        // Towards this host itself: loopback.
        assert_eq!(reachable_ip(Some("127.0.0.1")), IpAddr::V4(Ipv4Addr::LOCALHOST));
        // Without a rendezvous host: never unspecified, and loopback only where no other
        // interface is up.
        let ip = reachable_ip(None);
        assert!(!ip.is_unspecified());
        assert_eq!(
            ip.is_loopback(),
            first_interface().is_none() && route_to("10.255.255.255").is_none_or(|r| r.is_loopback())
        );
    }
}
