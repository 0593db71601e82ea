//! The CUDA IPC endpoint: who this rank is, as far as sharing GPU memory goes.
//!
//! Wire format (little-endian, through [`comm_core::wire`]): magic `WVCE`, version `2`, the
//! process identity ([`ProcessIdentity`]: hostname, boot id, pid namespace, pid, uid), inode of
//! the network namespace `u64` (0 when unknown), device ordinal `u32`, PCI bus id (`u32` length
//! + UTF-8), communicator id `u64`.

use std::os::unix::fs::MetadataExt;

use comm_core::error::{Error, Result};
use comm_core::same_host::{MAX_ID_LEN, ProcessIdentity, SameHostEndpoint};
use comm_core::wire::{Decoder, Encoder};

const MAGIC: [u8; 4] = *b"WVCE";
const VERSION: u16 = 2;
const WHAT: &str = "cudaipc endpoint";
const NET_NS_PATH: &str = "/proc/self/ns/net";

/// What one rank tells its peers about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// Host (the posed node in place of the hostname), pid namespace (the peer's pid is watched
    /// for liveness), pid and user (the FD server only serves the same user).
    pub(crate) process: ProcessIdentity,
    /// Inode of `/proc/self/ns/net` (0 if unknown): the FD server's abstract socket is only
    /// visible inside one network namespace.
    pub(crate) net_ns: u64,
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
        let mut process = ProcessIdentity::local(crate::NAME)?;
        // A posed node (`WEAVE_HOST_ID`) stands in for the hostname: CUDA IPC never crosses a
        // node boundary, posed or real.
        if let Some(id) = host_id {
            process.hostname = id.to_string();
        }
        let net_ns = std::fs::metadata(NET_NS_PATH).map(|m| m.ino()).unwrap_or(0);
        Ok(Endpoint { process, net_ns, device, pci_bus_id, communicator_id })
    }

    /// Serializes the endpoint.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new(MAGIC, VERSION);
        self.process
            .encode(&mut e)
            .u64(self.net_ns)
            .u32(self.device)
            .str(&self.pci_bus_id)
            .u64(self.communicator_id)
            .finish()
    }

    /// Parses and checks an endpoint; garbage is [`Error::Protocol`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, WHAT)?;
        let process = ProcessIdentity::decode(&mut d)?;
        let net_ns = d.u64()?;
        let device = d.u32()?;
        let pci_bus_id = d.str()?.to_string();
        let communicator_id = d.u64()?;
        d.finish()?;
        if pci_bus_id.len() > MAX_ID_LEN {
            return Err(Error::protocol(format!("{WHAT}: PCI bus id longer than {MAX_ID_LEN} bytes")));
        }
        if i32::try_from(device).is_err() {
            return Err(Error::protocol(format!("{WHAT}: {device} is not a device ordinal")));
        }
        Ok(Endpoint { process, net_ns, device, pci_bus_id, communicator_id })
    }
}

impl SameHostEndpoint for Endpoint {
    const SHARES: &'static str = "GPU memory";

    fn decode(bytes: &[u8]) -> Result<Self> {
        Endpoint::decode(bytes)
    }

    /// Whether the two ranks can share GPU memory through this transport: same process identity
    /// (host, pid namespace, user) and same network namespace (the peer's FD server socket is
    /// reached by name). The device does not matter: ranks on one GPU share too. Symmetric.
    fn can_share_with(&self, other: &Endpoint) -> bool {
        self.process.can_share_with(&other.process) && self.net_ns == other.net_ns
    }

    /// Why [`can_share_with`](Self::can_share_with) is false, for error messages.
    fn difference(&self, other: &Endpoint) -> String {
        if let Some(why) = self.process.difference(&other.process) {
            why
        } else if self.net_ns != other.net_ns {
            "it runs in another network namespace (another container?)".to_string()
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
        assert_eq!(e.process.pid, std::process::id());
        assert_eq!((e.device, e.communicator_id), (3, 42));
        assert!(!e.process.boot_id.is_empty());
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
            e.process.pid = pid;
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
        let changes: [fn(&mut Endpoint); 5] = [
            |e| e.process.hostname.push('x'),
            |e| e.process.boot_id.push('x'),
            |e| e.process.pid_ns ^= 1,
            |e| e.net_ns ^= 1,
            |e| e.process.uid ^= 1,
        ];
        for change in changes {
            let mut b = a.clone();
            change(&mut b);
            assert!(!a.can_share_with(&b) && !b.can_share_with(&a));
            assert_ne!(a.difference(&b), "no difference");
        }
        let mut other = a.clone();
        other.process.pid += 1;
        other.device = 0;
        other.pci_bus_id = "0000:19:00.0".into();
        other.communicator_id = 9;
        assert!(a.can_share_with(&other) && other.can_share_with(&a));
        assert_eq!(a.difference(&other), "no difference");
    }
}
