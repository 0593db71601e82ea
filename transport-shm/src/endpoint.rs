//! The shared-memory endpoint: who this rank is, as far as sharing `/dev/shm` goes.
//!
//! Wire format (little-endian, through [`comm_core::wire`]): magic `WVSE`, version `1`, hostname
//! (`u32` length + UTF-8), boot id (`u32` length + UTF-8), device number of the `/dev/shm` mount
//! `u64`, inode of the pid namespace `u64` (0 when unknown), pid `u32`, effective uid `u32`.

use std::os::unix::fs::MetadataExt;

use comm_core::error::{Error, Result};
use comm_core::same_host::SameHostEndpoint;
use comm_core::wire::{Decoder, Encoder};

use crate::segment::SHM_DIR;

const MAGIC: [u8; 4] = *b"WVSE";
const VERSION: u16 = 2;
const WHAT: &str = "shm endpoint";
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
const PID_NS_PATH: &str = "/proc/self/ns/pid";
/// Longest hostname or boot id accepted from a peer (Linux allows 64 bytes for a hostname).
const MAX_ID_LEN: usize = 256;

/// What one rank tells its peers about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `gethostname()`.
    pub(crate) hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: tells apart hosts that share a hostname, and one host
    /// before and after a reboot.
    pub(crate) boot_id: String,
    /// `st_dev` of `/dev/shm`: two containers on one host with private `/dev/shm` mounts differ.
    pub(crate) shm_dev: u64,
    /// Inode of `/proc/self/ns/pid` (0 if unknown): pids are only comparable inside one namespace.
    pub(crate) pid_ns: u64,
    /// Process id (always in `1..=i32::MAX`).
    pub(crate) pid: u32,
    /// Effective uid; segments are 0600, so only ranks of the same user can share them.
    pub(crate) uid: u32,
    /// Host identity (see `comm_core::host`): `WEAVE_HOST_ID` splits one machine into posed
    /// nodes, and shared memory must not cross a node boundary.
    pub(crate) host: String,
}

impl Endpoint {
    /// The endpoint of this process. Fails (as [`Error::Unsupported`]) where there is no
    /// `/dev/shm` or no boot id, i.e. off Linux.
    pub(crate) fn local(host: &str) -> Result<Self> {
        let hostname =
            nix::unistd::gethostname().map_err(|e| Error::errno("gethostname", e))?.to_string_lossy().into_owned();
        let boot_id = std::fs::read_to_string(BOOT_ID_PATH)
            .map_err(|e| Error::Unsupported(format!("transport shm needs {BOOT_ID_PATH} (Linux): {e}")))?
            .trim()
            .to_string();
        let shm_dev = std::fs::metadata(SHM_DIR)
            .map_err(|e| Error::Unsupported(format!("transport shm needs a {SHM_DIR} mount: {e}")))?
            .dev();
        let pid_ns = std::fs::metadata(PID_NS_PATH).map(|m| m.ino()).unwrap_or(0);
        Ok(Endpoint {
            hostname,
            boot_id,
            shm_dev,
            pid_ns,
            pid: std::process::id(),
            uid: nix::unistd::geteuid().as_raw(),
            host: host.to_string(),
        })
    }

    /// Serializes the endpoint.
    pub(crate) fn encode(&self) -> Vec<u8> {
        Encoder::new(MAGIC, VERSION)
            .str(&self.hostname)
            .str(&self.boot_id)
            .u64(self.shm_dev)
            .u64(self.pid_ns)
            .u32(self.pid)
            .u32(self.uid)
            .str(&self.host)
            .finish()
    }

    /// Parses and checks an endpoint; garbage is [`Error::Protocol`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, WHAT)?;
        let hostname = d.str()?.to_string();
        let boot_id = d.str()?.to_string();
        let shm_dev = d.u64()?;
        let pid_ns = d.u64()?;
        let pid = d.u32()?;
        let uid = d.u32()?;
        let host = d.str()?.to_string();
        d.finish()?;
        if hostname.len() > MAX_ID_LEN || boot_id.len() > MAX_ID_LEN {
            return Err(Error::protocol(format!("{WHAT}: hostname or boot id longer than {MAX_ID_LEN} bytes")));
        }
        if host.len() > comm_core::host::MAX_HOST_ID_LEN {
            return Err(Error::protocol(format!("{WHAT}: host identity of {} bytes", host.len())));
        }
        // kill(0 or negative) would address process groups: only real pids are accepted.
        if pid == 0 || i32::try_from(pid).is_err() {
            return Err(Error::protocol(format!("{WHAT}: {pid} is not a process id")));
        }
        Ok(Endpoint { hostname, boot_id, shm_dev, pid_ns, pid, uid, host })
    }
}

impl SameHostEndpoint for Endpoint {
    const SHARES: &'static str = "memory";

    fn decode(bytes: &[u8]) -> Result<Self> {
        Endpoint::decode(bytes)
    }

    /// Whether the two ranks can share segments: same host (hostname and boot id), same
    /// `/dev/shm` mount, same pid namespace (so the peer's pid means something here), same user
    /// (segments are 0600). Symmetric.
    fn can_share_with(&self, other: &Endpoint) -> bool {
        self.hostname == other.hostname
            && self.boot_id == other.boot_id
            && self.shm_dev == other.shm_dev
            && self.pid_ns == other.pid_ns
            && self.uid == other.uid
            && self.host == other.host
    }

    /// Why [`can_share_with`](Self::can_share_with) is false, for error messages.
    fn difference(&self, other: &Endpoint) -> String {
        if self.hostname != other.hostname || self.boot_id != other.boot_id {
            format!("it runs on host {:?}, this rank on {:?}", other.hostname, self.hostname)
        } else if self.shm_dev != other.shm_dev {
            format!("it sees a different {SHM_DIR} mount (another container?)")
        } else if self.pid_ns != other.pid_ns {
            "it runs in another pid namespace".to_string()
        } else if self.uid != other.uid {
            format!("it runs as uid {}, this rank as uid {}", other.uid, self.uid)
        } else if self.host != other.host {
            format!("it is on node {:?}, this rank on {:?} (WEAVE_HOST_ID)", other.host, self.host)
        } else {
            "no difference".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_round_trips_and_reaches_itself() {
        let e = Endpoint::local("test-host").unwrap();
        assert_eq!(e.pid, std::process::id());
        assert!(!e.boot_id.is_empty());
        let bytes = e.encode();
        let d = Endpoint::decode(&bytes).unwrap();
        assert_eq!(d, e);
        assert!(d.can_share_with(&e));
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        let bytes = Endpoint::local("test-host").unwrap().encode();
        for bad in comm_core::wire::damaged_messages(&bytes) {
            assert!(matches!(Endpoint::decode(&bad), Err(Error::Protocol(_))), "{bad:02x?}");
        }
        for pid in [0u32, u32::MAX, 1 << 31] {
            let mut e = Endpoint::local("test-host").unwrap();
            e.pid = pid;
            assert!(matches!(Endpoint::decode(&e.encode()), Err(Error::Protocol(_))), "pid {pid}");
        }
    }

    #[test]
    fn any_difference_means_no_sharing() {
        let a = Endpoint::local("test-host").unwrap();
        let changes: [fn(&mut Endpoint); 6] = [
            |e| e.hostname.push('x'),
            |e| e.boot_id.push('x'),
            |e| e.shm_dev ^= 1,
            |e| e.pid_ns ^= 1,
            |e| e.uid ^= 1,
            |e| e.host.push('x'),
        ];
        for change in changes {
            let mut b = a.clone();
            change(&mut b);
            assert!(!a.can_share_with(&b) && !b.can_share_with(&a));
            assert_ne!(a.difference(&b), "no difference");
        }
        let mut other_pid = a.clone();
        other_pid.pid += 1;
        assert!(a.can_share_with(&other_pid));
    }
}
