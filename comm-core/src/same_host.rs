//! Endpoints of transports that share memory between processes of one host (shared memory,
//! CUDA IPC): the identity of a process every such endpoint carries, what such an endpoint must
//! tell, and the check each of those transports makes before it imports from or connects to a
//! peer.

use std::os::unix::fs::MetadataExt;

use crate::error::{Error, Result};
use crate::wire::{Decoder, Encoder};

const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
const PID_NS_PATH: &str = "/proc/self/ns/pid";
/// Longest hostname or boot id accepted from a peer (Linux allows 64 bytes for a hostname).
pub const MAX_ID_LEN: usize = 256;

/// Who a process is on its host, as far as sharing memory with another process goes: the part
/// of a same-host transport's endpoint that every such transport checks.
///
/// Wire format (inside the transport's endpoint, through [`crate::wire`]): hostname (`u32`
/// length + UTF-8), boot id (`u32` length + UTF-8), inode of the pid namespace `u64` (0 when
/// unknown), pid `u32`, effective uid `u32`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// `gethostname()`, or the node a transport puts in its place.
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: tells apart hosts that share a hostname, and one host
    /// before and after a reboot.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/pid` (0 if unknown): a peer's pid is only meaningful (and
    /// watchable for liveness) inside one pid namespace.
    pub pid_ns: u64,
    /// Process id (always in `1..=i32::MAX`).
    pub pid: u32,
    /// Effective uid: shared segments are 0600 and the CUDA IPC FD server serves only its own
    /// user.
    pub uid: u32,
}

impl ProcessIdentity {
    /// This process. Fails (as [`Error::Unsupported`] naming `transport`, which needs it) where
    /// there is no boot id, i.e. off Linux.
    pub fn local(transport: &str) -> Result<Self> {
        let hostname =
            nix::unistd::gethostname().map_err(|e| Error::errno("gethostname", e))?.to_string_lossy().into_owned();
        let boot_id = std::fs::read_to_string(BOOT_ID_PATH)
            .map_err(|e| Error::Unsupported(format!("transport {transport} needs {BOOT_ID_PATH} (Linux): {e}")))?
            .trim()
            .to_string();
        Ok(ProcessIdentity {
            hostname,
            boot_id,
            pid_ns: std::fs::metadata(PID_NS_PATH).map(|m| m.ino()).unwrap_or(0),
            pid: std::process::id(),
            uid: nix::unistd::geteuid().as_raw(),
        })
    }

    /// Appends the identity to an endpoint being written (wire format above).
    pub fn encode<'e>(&self, e: &'e mut Encoder) -> &'e mut Encoder {
        e.str(&self.hostname).str(&self.boot_id).u64(self.pid_ns).u32(self.pid).u32(self.uid)
    }

    /// Reads and checks an identity written by [`encode`](Self::encode); garbage is
    /// [`Error::Protocol`] naming the endpoint being read.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        let what = d.what();
        let hostname = d.str()?.to_string();
        let boot_id = d.str()?.to_string();
        let (pid_ns, pid, uid) = (d.u64()?, d.u32()?, d.u32()?);
        if hostname.len() > MAX_ID_LEN || boot_id.len() > MAX_ID_LEN {
            return Err(Error::protocol(format!("{what}: hostname or boot id longer than {MAX_ID_LEN} bytes")));
        }
        // kill(0 or negative) would address process groups: only real pids are accepted.
        if pid == 0 || i32::try_from(pid).is_err() {
            return Err(Error::protocol(format!("{what}: {pid} is not a process id")));
        }
        Ok(ProcessIdentity { hostname, boot_id, pid_ns, pid, uid })
    }

    /// Whether the two processes may share memory: same host (hostname and boot id), same pid
    /// namespace, same user. Symmetric.
    pub fn can_share_with(&self, other: &Self) -> bool {
        self.difference(other).is_none()
    }

    /// Why [`can_share_with`](Self::can_share_with) is false, for error messages; `None` when
    /// it is true.
    pub fn difference(&self, other: &Self) -> Option<String> {
        if self.hostname != other.hostname || self.boot_id != other.boot_id {
            Some(format!("it runs on host {:?}, this rank on {:?}", other.hostname, self.hostname))
        } else if self.pid_ns != other.pid_ns {
            Some("it runs in another pid namespace (another container?)".to_string())
        } else if self.uid != other.uid {
            Some(format!("it runs as uid {}, this rank as uid {}", other.uid, self.uid))
        } else {
            None
        }
    }
}

/// A rank's endpoint for a transport that maps a peer's memory into this process: it tells
/// whether two ranks may share memory (same host, namespaces, user…) and, if not, why.
pub trait SameHostEndpoint: Sized {
    /// What the transport shares, for error messages ("memory", "GPU memory").
    const SHARES: &'static str;

    /// Parses and checks a peer's endpoint bytes; garbage is [`Error::Protocol`].
    fn decode(bytes: &[u8]) -> Result<Self>;

    /// Whether the two ranks can share memory through this transport. Symmetric.
    fn can_share_with(&self, other: &Self) -> bool;

    /// Why [`can_share_with`](Self::can_share_with) is false, for error messages.
    fn difference(&self, other: &Self) -> String;

    /// [`TransportBackend::can_reach`](crate::transport::TransportBackend::can_reach) of such a
    /// transport: a pure function of the two endpoints, so every rank gives the same answer for
    /// `(a, b)` and `(b, a)`.
    fn can_reach(a: &[u8], b: &[u8]) -> Result<bool> {
        Ok(Self::decode(a)?.can_share_with(&Self::decode(b)?))
    }
}

/// The endpoint of `peer` (its bytes `peer_endpoint`) after checking that `peer` is one of the
/// `world_size` ranks ([`Error::InvalidArgument`]), that the bytes decode, and that the peer can
/// share memory with this rank `rank`, whose endpoint is `mine` ([`Error::Transport`] of
/// `transport`, saying what differs).
pub fn checked_peer_endpoint<E: SameHostEndpoint>(
    transport: &str,
    mine: &E,
    rank: usize,
    world_size: usize,
    peer: usize,
    peer_endpoint: &[u8],
) -> Result<E> {
    if peer >= world_size {
        return Err(Error::invalid(format!("transport {transport}: peer rank {peer} of {world_size} ranks")));
    }
    let theirs = E::decode(peer_endpoint)?;
    if !mine.can_share_with(&theirs) {
        return Err(Error::transport(
            transport,
            format!("rank {peer} cannot share {} with rank {rank}: {}", E::SHARES, mine.difference(&theirs)),
        ));
    }
    Ok(theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGIC: [u8; 4] = *b"WVTI";

    fn encoded(p: &ProcessIdentity) -> Vec<u8> {
        let mut e = Encoder::new(MAGIC, 1);
        p.encode(&mut e).finish()
    }

    fn decoded(bytes: &[u8]) -> Result<ProcessIdentity> {
        let mut d = Decoder::new(bytes, MAGIC, 1, "test identity")?;
        let p = ProcessIdentity::decode(&mut d)?;
        d.finish()?;
        Ok(p)
    }

    #[test]
    fn this_process_round_trips_and_shares_with_itself() {
        let me = ProcessIdentity::local("test").unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(!me.boot_id.is_empty());
        assert_eq!(decoded(&encoded(&me)).unwrap(), me);
        assert!(me.can_share_with(&me));
        assert_eq!(me.difference(&me), None);
    }

    #[test]
    fn garbage_bad_pids_and_long_names_are_protocol_errors() {
        let me = ProcessIdentity::local("test").unwrap();
        for bad in crate::wire::damaged_messages(&encoded(&me)) {
            assert!(matches!(decoded(&bad), Err(Error::Protocol(_))), "{bad:02x?}");
        }
        for pid in [0u32, u32::MAX, 1 << 31] {
            let p = ProcessIdentity { pid, ..me.clone() };
            assert!(matches!(decoded(&encoded(&p)), Err(Error::Protocol(_))), "pid {pid}");
        }
        let p = ProcessIdentity { hostname: "h".repeat(MAX_ID_LEN + 1), ..me };
        assert!(matches!(decoded(&encoded(&p)), Err(Error::Protocol(_))));
    }

    #[test]
    fn host_pid_namespace_and_user_matter_and_the_pid_does_not() {
        let a = ProcessIdentity::local("test").unwrap();
        let changes: [fn(&mut ProcessIdentity); 4] =
            [|p| p.hostname.push('x'), |p| p.boot_id.push('x'), |p| p.pid_ns ^= 1, |p| p.uid ^= 1];
        for change in changes {
            let mut b = a.clone();
            change(&mut b);
            assert!(!a.can_share_with(&b) && !b.can_share_with(&a));
            assert!(a.difference(&b).is_some());
        }
        let other_pid = ProcessIdentity { pid: a.pid + 1, ..a.clone() };
        assert!(a.can_share_with(&other_pid));
    }
}
