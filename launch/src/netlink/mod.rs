//! A small rtnetlink client: the few requests that wire namespace nodes together (a bridge,
//! veth pairs, link state, IPv4 addresses, `tbf` qdiscs), sent over a raw `NETLINK_ROUTE`
//! socket. GPU hosts often have no `ip` or `tc` binary, so the launcher speaks the protocol
//! itself.
//!
//! ## Protocol
//!
//! A request is one netlink message: a 16-byte header (`nlmsghdr`: total length, type, flags,
//! sequence number, port id 0), a fixed family header (`ifinfomsg`, `ifaddrmsg` or `tcmsg`),
//! then attributes. An attribute is `{u16 length, u16 type}` followed by its payload, padded
//! to 4 bytes; the length counts header and payload but not the padding. A nested attribute's
//! payload is more attributes. Everything is in the host's byte order.
//!
//! Every request carries `NLM_F_ACK`, so the kernel answers each with an `NLMSG_ERROR`
//! message whose first field is 0 (done) or a negative errno; a `GET` request gets its reply
//! first, then that acknowledgement. With `NETLINK_EXT_ACK` the kernel adds a text explaining
//! a refusal, which goes into the error. Replies are read with a receive timeout, so a request
//! never waits forever, and every length in a reply is checked before it is used.
//!
//! A netlink socket acts on the network namespace it was created in, so
//! [`RouteSocket::open_in`] creates it on a short-lived thread that first enters the target
//! namespace with `setns` (which moves only that thread); the socket keeps the namespace after
//! the thread ends. Links created through it never appear in the caller's namespace.

use std::ffi::c_void;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sched::CloneFlags;

use crate::error::{Error, Result};

mod message;

pub(crate) use message::Tbf;
use message::{Message, get_link, new_bridge, new_ipv4, new_tbf, new_veth, set_link};

// Answers (linux/netlink.h).
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// In an `NLMSG_ERROR` reply: extended-ack attributes follow the echoed request header.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// The extended-ack attribute holding the kernel's message text.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// How long a request waits for the kernel's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Not complete yet: no acknowledgement for our sequence number in this datagram. Holds
    /// the payload of a reply message, if one came.
    Pending(Option<Vec<u8>>),
    /// Acknowledged; the reply's payload (after its `nlmsghdr`) if the request had one.
    Done(Option<Vec<u8>>),
    /// Refused with this errno and, with extended acks, the kernel's explanation.
    Refused(i32, Option<String>),
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads one received datagram of possibly several messages, looking for the answer to
/// sequence number `seq`; `reply` is what an earlier datagram brought. Messages of other
/// sequence numbers are skipped. `None` for a malformed datagram.
fn parse_answer(datagram: &[u8], seq: u32, mut reply: Option<Vec<u8>>) -> Option<Answer> {
    let mut at = 0;
    while at + 16 <= datagram.len() {
        let len = usize::try_from(ne_u32(datagram, at)?).ok()?;
        let ty = ne_u16(datagram, at + 4)?;
        let flags = ne_u16(datagram, at + 6)?;
        let msg_seq = ne_u32(datagram, at + 8)?;
        let msg = datagram.get(at..at.checked_add(len)?)?;
        if len < 16 {
            return None;
        }
        if msg_seq == seq {
            let payload = &msg[16..];
            match ty {
                NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?);
                    if errno == 0 {
                        return Some(Answer::Done(reply));
                    }
                    let text = (flags & NLM_F_ACK_TLVS != 0).then(|| ext_ack_message(payload)).flatten();
                    return Some(Answer::Refused(errno.checked_neg().unwrap_or(i32::MAX), text));
                }
                NLMSG_DONE => return Some(Answer::Done(reply)),
                _ => reply = Some(payload.to_vec()),
            }
        }
        at = at.checked_add(len.next_multiple_of(4))?;
    }
    Some(Answer::Pending(reply))
}

/// The `NLMSGERR_ATTR_MSG` text of an `NLMSG_ERROR` payload: errno, the echoed request header
/// (only the header: the socket sets `NETLINK_CAP_ACK`), then attributes.
fn ext_ack_message(payload: &[u8]) -> Option<String> {
    let echoed_len = 16;
    let mut at = 4 + echoed_len;
    while at + 4 <= payload.len() {
        let len = usize::from(ne_u16(payload, at)?);
        let ty = ne_u16(payload, at + 2)?;
        let body = payload.get(at + 4..at.checked_add(len)?)?;
        if len < 4 {
            return None;
        }
        if ty & 0x3fff == NLMSGERR_ATTR_MSG {
            let text = body.split(|&b| b == 0).next().unwrap_or(body);
            return Some(String::from_utf8_lossy(text).trim().to_string()).filter(|t| !t.is_empty());
        }
        at = at.checked_add(len.next_multiple_of(4))?;
    }
    None
}

/// An error for a request the kernel refused: the operation, then the errno by name, its
/// description and the kernel's explanation where it gave one.
fn refused(what: &str, errno: i32, text: Option<String>) -> Error {
    let e = Errno::from_raw(errno);
    let kind = std::io::Error::from_raw_os_error(errno).kind();
    let because = text.map(|t| format!("; the kernel says: {t}")).unwrap_or_default();
    Error::io(what, std::io::Error::new(kind, format!("{e:?} ({}, errno {errno}){because}", e.desc())))
}

/// A `NETLINK_ROUTE` socket acting on one network namespace.
#[derive(Debug)]
pub(crate) struct RouteSocket {
    fd: OwnedFd,
    seq: u32,
    /// The namespace, for error messages ("the switch namespace").
    place: String,
}

impl RouteSocket {
    /// A socket in the network namespace `netns` (an open `/proc/PID/ns/net`), created on a
    /// thread of its own that enters it (see the module documentation). `place` names the
    /// namespace in errors.
    pub(crate) fn open_in(netns: BorrowedFd<'_>, place: &str) -> Result<Self> {
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("weave-netlink".into())
                .spawn_scoped(s, move || {
                    nix::sched::setns(netns, CloneFlags::CLONE_NEWNET)
                        .map_err(|e| Error::errno(format!("enter {place} (setns CLONE_NEWNET)"), e))?;
                    RouteSocket::open(place)
                })
                .map_err(|e| Error::io(format!("start a thread to open a netlink socket in {place}"), e))?
                .join()
                .map_err(|_| Error::invalid(format!("the thread opening a netlink socket in {place} panicked")))?
        })
    }

    /// A socket in the calling thread's network namespace, with a receive timeout and
    /// extended acknowledgements.
    fn open(place: &str) -> Result<Self> {
        let what = |op: &str| format!("{op} for a NETLINK_ROUTE socket in {place}");
        // SAFETY: plain system call with constant arguments; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
        if raw < 0 {
            return Err(Error::io(what("socket(AF_NETLINK)"), std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let timeout = nix::sys::time::TimeVal::new(
            REPLY_TIMEOUT.as_secs().try_into().unwrap_or(5),
            REPLY_TIMEOUT.subsec_micros().into(),
        );
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| Error::errno(what("setsockopt(SO_RCVTIMEO)"), e))?;
        for opt in [libc::NETLINK_EXT_ACK, libc::NETLINK_CAP_ACK] {
            let one: libc::c_int = 1;
            // SAFETY: `fd` is open; the option value is a c_int that outlives the call, and its
            // size is passed. Failure only means older kernels without extended acks.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_NETLINK,
                    opt,
                    (&raw const one).cast::<c_void>(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        Ok(RouteSocket { fd, seq: 0, place: place.to_string() })
    }

    /// Sends `msg` and waits for its acknowledgement; returns the reply payload of a `GET`.
    /// `what` describes the request for errors ("create bridge br0").
    fn request(&mut self, what: &str, msg: Message) -> Result<Option<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let what = format!("netlink: {what} in {}", self.place);
        let bytes = msg.finish(self.seq);
        // SAFETY: `fd` is open; the buffer is valid for `bytes.len()` bytes during the call.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), bytes.as_ptr().cast::<c_void>(), bytes.len(), 0) };
        if sent < 0 {
            return Err(Error::io(format!("{what} (send)"), std::io::Error::last_os_error()));
        }
        let mut reply = None;
        let mut buf = vec![0u8; 32 << 10];
        loop {
            // SAFETY: `fd` is open; `buf` is valid and writable for `buf.len()` bytes.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast::<c_void>(), buf.len(), 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                let op = if e.kind() == std::io::ErrorKind::WouldBlock {
                    format!("{what} (no answer from the kernel within {REPLY_TIMEOUT:?})")
                } else {
                    format!("{what} (receive the answer)")
                };
                return Err(Error::io(op, e));
            }
            let datagram = buf.get(..usize::try_from(n).unwrap_or(0)).unwrap_or_default();
            match parse_answer(datagram, self.seq, reply) {
                Some(Answer::Done(r)) => return Ok(r),
                Some(Answer::Refused(errno, text)) => return Err(refused(&what, errno, text)),
                Some(Answer::Pending(r)) => reply = r,
                None => {
                    return Err(Error::io(
                        format!("{what} (read the answer)"),
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "malformed netlink message from the kernel",
                        ),
                    ));
                }
            }
        }
    }

    /// Creates a bridge named `name`.
    pub(crate) fn create_bridge(&mut self, name: &str) -> Result<()> {
        self.request(&format!("create bridge {name} (RTM_NEWLINK)"), new_bridge(name)).map(drop)
    }

    /// Creates a veth pair: `name` in this namespace, `peer` in the network namespace `peer_ns`.
    pub(crate) fn create_veth(
        &mut self,
        name: &str,
        peer: &str,
        peer_ns: BorrowedFd<'_>,
        peer_place: &str,
    ) -> Result<()> {
        let what = format!("create veth pair {name} <-> {peer} in {peer_place} (RTM_NEWLINK)");
        self.request(&what, new_veth(name, peer, peer_ns.as_raw_fd())).map(drop)
    }

    /// The index of the link named `name`.
    pub(crate) fn link_index(&mut self, name: &str) -> Result<u32> {
        let what = format!("look up link {name} (RTM_GETLINK)");
        let reply = self.request(&what, get_link(name))?;
        // The reply is an RTM_NEWLINK message: ifinfomsg (index at offset 4), attributes.
        reply.as_deref().and_then(|r| ne_u32(r, 4)).filter(|&i| i != 0).ok_or_else(|| {
            Error::io(
                format!("netlink: {what} in {}", self.place),
                std::io::Error::new(std::io::ErrorKind::InvalidData, "the kernel's reply holds no link index"),
            )
        })
    }

    /// Sets link `index` (named `name` in errors) up.
    pub(crate) fn set_up(&mut self, index: u32, name: &str) -> Result<()> {
        self.request(&format!("set link {name} up (RTM_NEWLINK)"), set_link(index, true, None)).map(drop)
    }

    /// Enslaves link `index` (named `name`) to the bridge `master`.
    pub(crate) fn set_master(&mut self, index: u32, name: &str, master: u32) -> Result<()> {
        let what = format!("enslave link {name} to bridge index {master} (RTM_NEWLINK IFLA_MASTER)");
        self.request(&what, set_link(index, false, Some(master))).map(drop)
    }

    /// Adds `addr/prefix` to link `index` (named `name`).
    pub(crate) fn add_ipv4(&mut self, index: u32, name: &str, addr: Ipv4Addr, prefix: u8) -> Result<()> {
        self.request(&format!("add address {addr}/{prefix} to {name} (RTM_NEWADDR)"), new_ipv4(index, addr, prefix))
            .map(drop)
    }

    /// Shapes the egress of link `index` (named `name`) with a root `tbf` qdisc.
    pub(crate) fn add_tbf(&mut self, index: u32, name: &str, tbf: &Tbf) -> Result<()> {
        let what = format!(
            "add a tbf qdisc (rate {} bytes/s, burst {}, limit {}) on {name} (RTM_NEWQDISC)",
            tbf.rate, tbf.burst, tbf.limit
        );
        self.request(&what, new_tbf(index, tbf)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::message::tests::b;
    use super::message::{RTM_NEWLINK, ifinfomsg};
    use super::*;

    /// An NLMSG_ERROR message answering `seq` with `errno` (0: ack), with an extended-ack text.
    fn error_msg(seq: u32, errno: i32, text: Option<&str>) -> Vec<u8> {
        let mut tlv = Vec::new();
        if let Some(t) = text {
            let payload = [t.as_bytes(), b"\0"].concat();
            tlv = b().u16(4 + payload.len() as u16).u16(NLMSGERR_ATTR_MSG).u8s(&payload).0;
            tlv.resize(tlv.len().next_multiple_of(4), 0);
        }
        let flags = if text.is_some() { NLM_F_ACK_TLVS } else { 0 };
        let len = 16 + 4 + 16 + tlv.len() as u32;
        b().u32(len).u16(NLMSG_ERROR).u16(flags).u32(seq).u32(0).u32(errno as u32).u8s(&[0; 16]).u8s(&tlv).0
    }

    #[test]
    fn answers_are_acks_refusals_or_replies_and_garbage_is_refused() {
        assert_eq!(parse_answer(&error_msg(7, 0, None), 7, None), Some(Answer::Done(None)));
        assert_eq!(parse_answer(&error_msg(7, -17, None), 7, None), Some(Answer::Refused(17, None)));
        assert_eq!(
            parse_answer(&error_msg(7, -22, Some("Invalid burst")), 7, None),
            Some(Answer::Refused(22, Some("Invalid burst".into())))
        );
        // Another sequence number is skipped.
        assert_eq!(parse_answer(&error_msg(6, -1, None), 7, None), Some(Answer::Pending(None)));
        // A reply, then its ack in the same datagram.
        let link = b().u32(16 + 16).u16(RTM_NEWLINK).u16(0).u32(7).u32(0).u8s(&ifinfomsg(42, 0, 0)).0;
        let both = [link.clone(), error_msg(7, 0, None)].concat();
        let Some(Answer::Done(Some(reply))) = parse_answer(&both, 7, None) else { panic!() };
        assert_eq!(ne_u32(&reply, 4), Some(42));
        assert_eq!(parse_answer(&link, 7, None), Some(Answer::Pending(Some(ifinfomsg(42, 0, 0).to_vec()))));
        // Truncated or lying lengths never panic.
        let ack = error_msg(7, -1, Some("x"));
        for cut in 0..ack.len() {
            let _ = parse_answer(&ack[..cut], 7, None);
        }
        let mut lying = ack.clone();
        lying[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(parse_answer(&lying, 7, None), None);
        lying[0..4].copy_from_slice(&3u32.to_ne_bytes());
        assert_eq!(parse_answer(&lying, 7, None), None);
    }

    #[test]
    #[ignore = "needs root (a network namespace): cargo xtask test runs it as root"]
    fn kernel_refusals_in_a_namespace_name_the_operation_and_the_errno() {
        use crate::holder::{Holder, HolderKind};
        use std::os::fd::AsFd;
        let holder = Holder::spawn(HolderKind::Net, "a test namespace")
            .unwrap_or_else(|e| panic!("this test needs root to make a network namespace: {e}"));
        let net = std::fs::File::open(format!("/proc/{}/ns/net", holder.pid())).unwrap();
        let mut s = RouteSocket::open_in(net.as_fd(), "the test namespace").unwrap();
        s.create_bridge("br0").unwrap();
        let bridge = s.link_index("br0").unwrap();
        s.set_up(bridge, "br0").unwrap();
        let e = s.create_bridge("br0").unwrap_err().to_string();
        assert!(e.starts_with("netlink: create bridge br0 (RTM_NEWLINK) in the test namespace failed: EEXIST"), "{e}");
        let e = s.link_index("nope0").unwrap_err().to_string();
        assert!(e.contains("look up link nope0") && e.contains("ENODEV"), "{e}");
        let tbf = Tbf::for_rate(125_000_000);
        s.add_tbf(bridge, "br0", &tbf).unwrap();
        let e = s.add_tbf(bridge, "br0", &tbf).unwrap_err().to_string();
        assert!(e.contains("add a tbf qdisc") && e.contains("EEXIST"), "{e}");
        let e = s.set_master(bridge, "br0", 9999).unwrap_err().to_string();
        assert!(e.contains("enslave link br0") && e.contains("errno"), "{e}");
    }

    #[test]
    fn refusals_name_the_operation_and_the_errno() {
        let e = refused("netlink: create bridge br0 in the switch namespace", 1, Some("denied".into()));
        let s = e.to_string();
        assert!(s.starts_with("netlink: create bridge br0 in the switch namespace failed: EPERM"), "{s}");
        assert!(s.contains("errno 1") && s.contains("the kernel says: denied"), "{s}");
    }
}
