//! The CUDA IPC endpoint: who this rank is, as far as sharing GPU memory goes.
//!
//! Wire format (little-endian, through [`comm_core::wire`]): magic `WVCE`, version `1`, hostname
//! (`u32` length + UTF-8), boot id (`u32` length + UTF-8), inode of the pid namespace `u64`,
//! inode of the network namespace `u64` (both 0 when unknown), pid `u32`, effective uid `u32`,
//! device ordinal `u32`, PCI bus id (`u32` length + UTF-8), communicator id `u64`.

use std::os::unix::fs::MetadataExt;

use comm_core::error::{Error, Result};
use comm_core::same_host::SameHostEndpoint;
use comm_core::wire::{Decoder, Encoder};

const MAGIC: [u8; 4] = *b"WVCE";
const VERSION: u16 = 1;
const WHAT: &str = "cudaipc endpoint";
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
const PID_NS_PATH: &str = "/proc/self/ns/pid";
const NET_NS_PATH: &str = "/proc/self/ns/net";
/// Longest hostname, boot id or PCI bus id accepted from a peer.
const MAX_ID_LEN: usize = 256;

/// What one rank tells its peers about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `gethostname()`.
    pub(crate) hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: tells apart hosts that share a hostname.
    pub(crate) boot_id: String,
    /// Inode of `/proc/self/ns/pid` (0 if unknown): the peer's pid is watched for liveness.
    pub(crate) pid_ns: u64,
    /// Inode of `/proc/self/ns/net` (0 if unknown): the FD server's abstract socket is only
    /// visible inside one network namespace.
    pub(crate) net_ns: u64,
    /// Process id (always in `1..=i32::MAX`).
    pub(crate) pid: u32,
    /// Effective uid; the FD server only serves the same user.
    pub(crate) uid: u32,
    /// CUDA device ordinal in the rank's own numbering.
    pub(crate) device: u32,
    /// PCI bus id of that device (`0000:18:00.0`), which names it the same way in every process.
    pub(crate) pci_bus_id: String,
    /// The rank's communicator id, part of its FD server's socket name.
    pub(crate) communicator_id: u64,
}

impl Endpoint {
    /// The endpoint of this process for `device` (with PCI bus id `pci_bus_id`).
    pub(crate) fn local(device: u32, pci_bus_id: String, communicator_id: u64, host_id: Option<&str>) -> Result<Self> {
        // A posed node (`WEAVE_HOST_ID`) stands in for the hostname: CUDA IPC never crosses a
        // node boundary, posed or real.
        let hostname = match host_id {
            Some(id) => id.to_string(),
            None => {
                nix::unistd::gethostname().map_err(|e| Error::errno("gethostname", e))?.to_string_lossy().into_owned()
            }
        };
        let boot_id = std::fs::read_to_string(BOOT_ID_PATH)
            .map_err(|e| Error::Unsupported(format!("transport cudaipc needs {BOOT_ID_PATH} (Linux): {e}")))?
            .trim()
            .to_string();
        let ns = |p: &str| std::fs::metadata(p).map(|m| m.ino()).unwrap_or(0);
        Ok(Endpoint {
            hostname,
            boot_id,
            pid_ns: ns(PID_NS_PATH),
            net_ns: ns(NET_NS_PATH),
            pid: std::process::id(),
            uid: nix::unistd::geteuid().as_raw(),
            device,
            pci_bus_id,
            communicator_id,
        })
    }

    /// Serializes the endpoint.
    pub(crate) fn encode(&self) -> Vec<u8> {
        Encoder::new(MAGIC, VERSION)
            .str(&self.hostname)
            .str(&self.boot_id)
            .u64(self.pid_ns)
            .u64(self.net_ns)
            .u32(self.pid)
            .u32(self.uid)
            .u32(self.device)
            .str(&self.pci_bus_id)
            .u64(self.communicator_id)
            .finish()
    }

    /// Parses and checks an endpoint; garbage is [`Error::Protocol`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, WHAT)?;
        let hostname = d.str()?.to_string();
        let boot_id = d.str()?.to_string();
        let pid_ns = d.u64()?;
        let net_ns = d.u64()?;
        let pid = d.u32()?;
        let uid = d.u32()?;
        let device = d.u32()?;
        let pci_bus_id = d.str()?.to_string();
        let communicator_id = d.u64()?;
        d.finish()?;
        if hostname.len() > MAX_ID_LEN || boot_id.len() > MAX_ID_LEN || pci_bus_id.len() > MAX_ID_LEN {
            return Err(Error::protocol(format!(
                "{WHAT}: hostname, boot id or PCI bus id longer than {MAX_ID_LEN} bytes"
            )));
        }
        // kill(0 or negative) would address process groups: only real pids are accepted.
        if pid == 0 || i32::try_from(pid).is_err() {
            return Err(Error::protocol(format!("{WHAT}: {pid} is not a process id")));
        }
        if i32::try_from(device).is_err() {
            return Err(Error::protocol(format!("{WHAT}: {device} is not a device ordinal")));
        }
        Ok(Endpoint { hostname, boot_id, pid_ns, net_ns, pid, uid, device, pci_bus_id, communicator_id })
    }
}

impl SameHostEndpoint for Endpoint {
    const SHARES: &'static str = "GPU memory";

    fn decode(bytes: &[u8]) -> Result<Self> {
        Endpoint::decode(bytes)
    }

    /// Whether the two ranks can share GPU memory through this transport: same host (hostname
    /// and boot id), same pid and network namespaces (the peer's pid is watched, its FD server
    /// socket is reached by name), same user (the FD server serves only its own uid). The device
    /// does not matter: ranks on one GPU share too. Symmetric.
    fn can_share_with(&self, other: &Endpoint) -> bool {
        self.hostname == other.hostname
            && self.boot_id == other.boot_id
            && self.pid_ns == other.pid_ns
            && self.net_ns == other.net_ns
            && self.uid == other.uid
    }

    /// Why [`can_share_with`](Self::can_share_with) is false, for error messages.
    fn difference(&self, other: &Endpoint) -> String {
        if self.hostname != other.hostname || self.boot_id != other.boot_id {
            format!("it runs on host {:?}, this rank on {:?}", other.hostname, self.hostname)
        } else if self.pid_ns != other.pid_ns || self.net_ns != other.net_ns {
            "it runs in another pid or network namespace (another container?)".to_string()
        } else if self.uid != other.uid {
            format!("it runs as uid {}, this rank as uid {}", other.uid, self.uid)
        } else {
            "no difference".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Endpoint {
        Endpoint::local(3, "0000:18:00.0".into(), 42, None).unwrap()
    }

    #[test]
    fn local_round_trips_and_reaches_itself() {
        let e = sample();
        assert_eq!(e.pid, std::process::id());
        assert_eq!((e.device, e.communicator_id), (3, 42));
        assert!(!e.boot_id.is_empty());
        let d = Endpoint::decode(&e.encode()).unwrap();
        assert_eq!(d, e);
        assert!(d.can_share_with(&e));
    }

    #[test]
    fn every_truncation_and_garbage_is_a_protocol_error() {
        let bytes = sample().encode();
        for bad in comm_core::wire::damaged_messages(&bytes) {
            assert!(matches!(Endpoint::decode(&bad), Err(Error::Protocol(_))), "{bad:02x?}");
        }
        for pid in [0u32, u32::MAX, 1 << 31] {
            let mut e = sample();
            e.pid = pid;
            assert!(matches!(Endpoint::decode(&e.encode()), Err(Error::Protocol(_))), "pid {pid}");
        }
        let mut e = sample();
        e.device = u32::MAX;
        assert!(matches!(Endpoint::decode(&e.encode()), Err(Error::Protocol(_))));
        let mut e = sample();
        e.pci_bus_id = "x".repeat(MAX_ID_LEN + 1);
        assert!(matches!(Endpoint::decode(&e.encode()), Err(Error::Protocol(_))));
        // Another transport's endpoint (different magic) is refused.
        let shm_like = Encoder::new(*b"WVSE", 1).str("h").finish();
        assert!(matches!(Endpoint::decode(&shm_like), Err(Error::Protocol(_))));
    }

    #[test]
    fn any_difference_in_identity_means_no_sharing_and_device_does_not_matter() {
        let a = sample();
        let changes: [fn(&mut Endpoint); 5] =
            [|e| e.hostname.push('x'), |e| e.boot_id.push('x'), |e| e.pid_ns ^= 1, |e| e.net_ns ^= 1, |e| e.uid ^= 1];
        for change in changes {
            let mut b = a.clone();
            change(&mut b);
            assert!(!a.can_share_with(&b) && !b.can_share_with(&a));
            assert_ne!(a.difference(&b), "no difference");
        }
        let mut other = a.clone();
        other.pid += 1;
        other.device = 0;
        other.pci_bus_id = "0000:19:00.0".into();
        other.communicator_id = 9;
        assert!(a.can_share_with(&other) && other.can_share_with(&a));
        assert_eq!(a.difference(&other), "no difference");
    }
}
