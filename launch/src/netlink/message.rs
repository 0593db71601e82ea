//! The requests of the rtnetlink client, encoded: the message builder ([`Message`]: header,
//! family header, attributes, nests), one constructor per request, and the `tbf` parameters
//! ([`Tbf`]). Numbers are the kernel's uapi values; everything is in the host's byte order.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

// Request types and flags (linux/netlink.h, linux/rtnetlink.h).
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
pub(super) const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWQDISC: u16 = 36;

// Link attributes (linux/if_link.h, linux/veth.h).
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFF_UP: u32 = 0x1;

// Address attributes (linux/if_addr.h).
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_BROADCAST: u16 = 4;
const AF_INET: u8 = 2;

// Traffic control (linux/rtnetlink.h, linux/pkt_sched.h).
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
/// `tcm_parent` of a root qdisc.
const TC_H_ROOT: u32 = 0xFFFF_FFFF;
/// Handle `1:` of the qdisc we add.
const TBF_HANDLE: u32 = 0x0001_0000;
/// `tc_ratespec.linklayer`: Ethernet (so the kernel does not look for a rate table).
const TC_LINKLAYER_ETHERNET: u8 = 1;
/// The kernel's scheduler clock: one tick is 64 ns (`PSCHED_SHIFT`).
const PSCHED_SHIFT: u32 = 6;

/// One netlink request under construction: header, family header, attributes.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    buf: Vec<u8>,
}

impl Message {
    /// A request of type `ty` with `NLM_F_REQUEST | NLM_F_ACK` and `flags`; its length and
    /// sequence number are filled in by [`Message::finish`].
    fn new(ty: u16, flags: u16) -> Self {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | flags).to_ne_bytes());
        buf.extend_from_slice(&[0; 8]);
        Message { buf }
    }

    /// Appends `bytes` and pads to 4 bytes.
    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
        self
    }

    /// Appends an attribute. Payloads here are a few bytes, far below the 64 KiB limit.
    fn attr(&mut self, ty: u16, payload: &[u8]) -> &mut Self {
        let len = u16::try_from(4 + payload.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.push(payload)
    }

    fn attr_u32(&mut self, ty: u16, v: u32) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    fn attr_str(&mut self, ty: u16, s: &str) -> &mut Self {
        let mut payload = s.as_bytes().to_vec();
        payload.push(0);
        self.attr(ty, &payload)
    }

    /// A nested attribute whose payload `inner` appends.
    fn nest(&mut self, ty: u16, inner: impl FnOnce(&mut Self)) -> &mut Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        inner(self);
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    /// The bytes to send, with the total length and sequence number `seq` set.
    pub(super) fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// `struct ifinfomsg`: family `AF_UNSPEC`, the link `index` (0: none), `flags` under `change`.
pub(super) fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// Token-bucket shaping of one link's egress: the parameters of a `tbf` qdisc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tbf {
    /// Long-run rate, bytes per second.
    pub(crate) rate: u64,
    /// Bucket size, bytes: how much may leave at line speed after an idle spell.
    pub(crate) burst: u32,
    /// Queue length, bytes: what waits for tokens before packets are dropped.
    pub(crate) limit: u32,
}

impl Tbf {
    /// The shaping the launcher uses for `rate` bytes per second: a bucket of 4 ms worth of
    /// data (at least 64 KiB, so a full-size GSO packet fits) and a queue of 50 ms worth plus
    /// the bucket, as `tc … tbf latency 50ms` computes it.
    pub(crate) fn for_rate(rate: u64) -> Tbf {
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let burst = clamp((rate / 250).max(64 << 10)).min(u32::MAX / 2);
        let limit = clamp((rate / 20).saturating_add(u64::from(burst)));
        Tbf { rate, burst, limit }
    }

    /// `struct tc_tbf_qopt`: rate and (unused) peak rate as `tc_ratespec`s, then limit, buffer
    /// (the bucket in scheduler ticks; the kernel prefers `TCA_TBF_BURST`) and mtu (peak only).
    pub(super) fn qopt(&self) -> [u8; 36] {
        let mut b = [0u8; 36];
        // tc_ratespec: cell_log u8, linklayer u8, overhead u16, cell_align i16, mpu u16, rate u32.
        b[1] = TC_LINKLAYER_ETHERNET;
        b[8..12].copy_from_slice(&u32::try_from(self.rate).unwrap_or(u32::MAX).to_ne_bytes());
        b[13] = TC_LINKLAYER_ETHERNET;
        b[24..28].copy_from_slice(&self.limit.to_ne_bytes());
        let burst_ns = u128::from(self.burst) * 1_000_000_000 / u128::from(self.rate.max(1));
        let ticks = u32::try_from(burst_ns >> PSCHED_SHIFT).unwrap_or(u32::MAX);
        b[28..32].copy_from_slice(&ticks.to_ne_bytes());
        b
    }
}

/// `RTM_NEWLINK` creating a bridge `name`.
pub(super) fn new_bridge(name: &str) -> Message {
    let mut m = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
    m.push(&ifinfomsg(0, 0, 0)).attr_str(IFLA_IFNAME, name).nest(IFLA_LINKINFO, |m| {
        m.attr_str(IFLA_INFO_KIND, "bridge");
    });
    m
}

/// `RTM_NEWLINK` creating a veth pair: `name` here, `peer` in the network namespace `peer_ns`.
pub(super) fn new_veth(name: &str, peer: &str, peer_ns: RawFd) -> Message {
    let mut m = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
    m.push(&ifinfomsg(0, 0, 0)).attr_str(IFLA_IFNAME, name).nest(IFLA_LINKINFO, |m| {
        m.attr_str(IFLA_INFO_KIND, "veth").nest(IFLA_INFO_DATA, |m| {
            m.nest(VETH_INFO_PEER, |m| {
                m.push(&ifinfomsg(0, 0, 0))
                    .attr_str(IFLA_IFNAME, peer)
                    .attr_u32(IFLA_NET_NS_FD, u32::try_from(peer_ns).unwrap_or(u32::MAX));
            });
        });
    });
    m
}

/// `RTM_GETLINK` for the link named `name`.
pub(super) fn get_link(name: &str) -> Message {
    let mut m = Message::new(RTM_GETLINK, 0);
    m.push(&ifinfomsg(0, 0, 0)).attr_str(IFLA_IFNAME, name);
    m
}

/// `RTM_NEWLINK` changing link `index`: up (`IFF_UP`) when `up`, and enslaved to `master`.
pub(super) fn set_link(index: u32, up: bool, master: Option<u32>) -> Message {
    let mut m = Message::new(RTM_NEWLINK, 0);
    let (flags, change) = if up { (IFF_UP, IFF_UP) } else { (0, 0) };
    m.push(&ifinfomsg(index, flags, change));
    if let Some(master) = master {
        m.attr_u32(IFLA_MASTER, master);
    }
    m
}

/// `RTM_NEWADDR` adding `addr/prefix` (with its broadcast address) to link `index`.
pub(super) fn new_ipv4(index: u32, addr: Ipv4Addr, prefix: u8) -> Message {
    let mut m = Message::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
    // ifaddrmsg: family, prefix length, flags, scope (universe), index.
    let mut hdr = [AF_INET, prefix, 0, 0, 0, 0, 0, 0];
    hdr[4..8].copy_from_slice(&index.to_ne_bytes());
    let host_mask = u32::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
    let broadcast = Ipv4Addr::from(u32::from(addr) | host_mask);
    m.push(&hdr)
        .attr(IFA_LOCAL, &addr.octets())
        .attr(IFA_ADDRESS, &addr.octets())
        .attr(IFA_BROADCAST, &broadcast.octets());
    m
}

/// `RTM_NEWQDISC` adding `tbf` as the root qdisc (handle `1:`) of link `index`.
pub(super) fn new_tbf(index: u32, tbf: &Tbf) -> Message {
    let mut m = Message::new(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL);
    // tcmsg: family, pad, pad, ifindex, handle, parent, info.
    let mut hdr = [0u8; 20];
    hdr[4..8].copy_from_slice(&index.to_ne_bytes());
    hdr[8..12].copy_from_slice(&TBF_HANDLE.to_ne_bytes());
    hdr[12..16].copy_from_slice(&TC_H_ROOT.to_ne_bytes());
    m.push(&hdr).attr_str(TCA_KIND, "tbf").nest(TCA_OPTIONS, |m| {
        m.attr(TCA_TBF_PARMS, &tbf.qopt());
        if tbf.rate > u64::from(u32::MAX) {
            m.attr(TCA_TBF_RATE64, &tbf.rate.to_ne_bytes());
        }
        m.attr_u32(TCA_TBF_BURST, tbf.burst);
    });
    m
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::netlink::ne_u32;

    /// Builds the bytes of a message by hand, independent of [`Message`].
    pub(in crate::netlink) struct Bytes(pub(in crate::netlink) Vec<u8>);
    impl Bytes {
        pub(in crate::netlink) fn u8s(mut self, b: &[u8]) -> Self {
            self.0.extend_from_slice(b);
            self
        }
        pub(in crate::netlink) fn u16(self, v: u16) -> Self {
            self.u8s(&v.to_ne_bytes())
        }
        pub(in crate::netlink) fn u32(self, v: u32) -> Self {
            self.u8s(&v.to_ne_bytes())
        }
    }

    pub(in crate::netlink) fn b() -> Bytes {
        Bytes(Vec::new())
    }

    #[test]
    fn a_veth_request_nests_the_peer_with_its_namespace() {
        let got = new_veth("node0", "eth0", 7).finish(9);
        let peer = b()
            .u16(4 + 16 + 12 + 8)
            .u16(VETH_INFO_PEER)
            .u8s(&[0; 16])
            .u16(9)
            .u16(IFLA_IFNAME)
            .u8s(b"eth0\0\0\0\0")
            .u16(8)
            .u16(IFLA_NET_NS_FD)
            .u32(7);
        let data = b().u16(4 + peer.0.len() as u16).u16(IFLA_INFO_DATA).u8s(&peer.0);
        let info = b().u16(9).u16(IFLA_INFO_KIND).u8s(b"veth\0\0\0\0").u8s(&data.0);
        let body = b()
            .u8s(&[0; 16])
            .u16(10)
            .u16(IFLA_IFNAME)
            .u8s(b"node0\0\0\0")
            .u16(4 + info.0.len() as u16)
            .u16(IFLA_LINKINFO)
            .u8s(&info.0);
        let want = b()
            .u32(16 + body.0.len() as u32)
            .u16(RTM_NEWLINK)
            .u16(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
            .u32(9)
            .u32(0)
            .u8s(&body.0);
        assert_eq!(got, want.0);
        assert_eq!(got.len() % 4, 0);
    }

    #[test]
    fn link_changes_addresses_and_bridges_encode_their_fields() {
        let up = set_link(5, true, Some(3)).finish(1);
        let want = b()
            .u32(16 + 16 + 8)
            .u16(RTM_NEWLINK)
            .u16(NLM_F_REQUEST | NLM_F_ACK)
            .u32(1)
            .u32(0)
            .u8s(&[0, 0, 0, 0])
            .u32(5)
            .u32(IFF_UP)
            .u32(IFF_UP)
            .u16(8)
            .u16(IFLA_MASTER)
            .u32(3);
        assert_eq!(up, want.0);

        let addr = new_ipv4(4, Ipv4Addr::new(10, 57, 0, 2), 24).finish(2);
        let want = b()
            .u32(16 + 8 + 3 * 8)
            .u16(RTM_NEWADDR)
            .u16(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
            .u32(2)
            .u32(0)
            .u8s(&[AF_INET, 24, 0, 0])
            .u32(4)
            .u16(8)
            .u16(IFA_LOCAL)
            .u8s(&[10, 57, 0, 2])
            .u16(8)
            .u16(IFA_ADDRESS)
            .u8s(&[10, 57, 0, 2])
            .u16(8)
            .u16(IFA_BROADCAST)
            .u8s(&[10, 57, 0, 255]);
        assert_eq!(addr, want.0);

        let br = new_bridge("br0").finish(3);
        assert_eq!(&br[32..40], b().u16(8).u16(IFLA_IFNAME).u8s(b"br0\0").0.as_slice());
        assert_eq!(&br[40..56], b().u16(16).u16(IFLA_LINKINFO).u16(11).u16(IFLA_INFO_KIND).u8s(b"bridge\0\0").0);
        assert_eq!(br.len(), 56);
    }

    #[test]
    fn a_tbf_request_carries_rate_burst_and_64_bit_rates() {
        let tbf = Tbf::for_rate(125_000_000);
        assert_eq!((tbf.burst, tbf.limit), (500_000, 6_250_000 + 500_000));
        let small = Tbf::for_rate(1000);
        assert_eq!(small.burst, 64 << 10);
        let msg = new_tbf(6, &tbf).finish(4);
        // nlmsghdr, tcmsg, TCA_KIND "tbf", TCA_OPTIONS { PARMS (36), BURST }.
        assert_eq!(msg.len(), 16 + 20 + 8 + 4 + 40 + 8);
        assert_eq!(&msg[16..36], b().u32(0).u32(6).u32(TBF_HANDLE).u32(TC_H_ROOT).u32(0).0);
        assert_eq!(&msg[36..44], b().u16(8).u16(TCA_KIND).u8s(b"tbf\0").0);
        assert_eq!(&msg[44..48], b().u16(52).u16(TCA_OPTIONS).0);
        assert_eq!(&msg[48..52], b().u16(40).u16(TCA_TBF_PARMS).0);
        let qopt = &msg[52..88];
        assert_eq!(qopt[1], TC_LINKLAYER_ETHERNET);
        assert_eq!(ne_u32(qopt, 8), Some(125_000_000));
        assert_eq!(ne_u32(qopt, 24), Some(tbf.limit));
        // 500 kB at 125 MB/s is 4 ms: 62,500 ticks of 64 ns.
        assert_eq!(ne_u32(qopt, 28), Some(62_500));
        assert_eq!(&msg[88..96], b().u16(8).u16(TCA_TBF_BURST).u32(500_000).0);

        let fast = Tbf::for_rate(10 * 1_250_000_000);
        let msg = new_tbf(6, &fast).finish(5);
        assert_eq!(ne_u32(&msg, 52 + 8), Some(u32::MAX), "the 32-bit rate saturates");
        assert_eq!(&msg[88..100], b().u16(12).u16(TCA_TBF_RATE64).u8s(&12_500_000_000u64.to_ne_bytes()).0);
    }
}
