//! The shared-memory endpoint: who this rank is, as far as sharing `/dev/shm` goes.
//!
//! Wire format (little-endian, through [`comm_core::wire`]): magic `WVSE`, version `3`, the
//! process identity ([`ProcessIdentity`]: hostname, boot id, pid namespace, pid, uid), device
//! number of the `/dev/shm` mount `u64`, host identity (`u32` length + UTF-8).

use std::os::unix::fs::MetadataExt;

use comm_core::error::{Error, Result};
use comm_core::same_host::{ProcessIdentity, SameHostEndpoint};
use comm_core::wire::{Decoder, Encoder};

use crate::segment::SHM_DIR;

const MAGIC: [u8; 4] = *b"WVSE";
const VERSION: u16 = 3;
const WHAT: &str = "shm endpoint";

/// What one rank tells its peers about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// Host, pid namespace, pid and user: segments are 0600, so only ranks of the same user can
    /// share them, and pids are only comparable inside one namespace.
    pub(crate) process: ProcessIdentity,
    /// `st_dev` of `/dev/shm`: two containers on one host with private `/dev/shm` mounts differ.
    pub(crate) shm_dev: u64,
    /// Host identity (see `comm_core::host`): `WEAVE_HOST_ID` splits one machine into posed
    /// nodes, and shared memory must not cross a node boundary.
    pub(crate) host: String,
}

impl Endpoint {
    /// The endpoint of this process. Fails (as [`Error::Unsupported`]) where there is no
    /// `/dev/shm` or no boot id, i.e. off Linux.
    pub(crate) fn local(host: &str) -> Result<Self> {
        let process = ProcessIdentity::local(crate::NAME)?;
        let shm_dev = std::fs::metadata(SHM_DIR)
            .map_err(|e| Error::Unsupported(format!("transport shm needs a {SHM_DIR} mount: {e}")))?
            .dev();
        Ok(Endpoint { process, shm_dev, host: host.to_string() })
    }

    /// Serializes the endpoint.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new(MAGIC, VERSION);
        self.process.encode(&mut e).u64(self.shm_dev).str(&self.host).finish()
    }

    /// Parses and checks an endpoint; garbage is [`Error::Protocol`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, WHAT)?;
        let process = ProcessIdentity::decode(&mut d)?;
        let shm_dev = d.u64()?;
        let host = d.str()?.to_string();
        d.finish()?;
        if host.len() > comm_core::host::MAX_HOST_ID_LEN {
            return Err(Error::protocol(format!("{WHAT}: host identity of {} bytes", host.len())));
        }
        Ok(Endpoint { process, shm_dev, host })
    }
}

impl SameHostEndpoint for Endpoint {
    const SHARES: &'static str = "memory";

    fn decode(bytes: &[u8]) -> Result<Self> {
        Endpoint::decode(bytes)
    }

    /// Whether the two ranks can share segments: same process identity (host, pid namespace,
    /// user), same `/dev/shm` mount, same node. Symmetric.
    fn can_share_with(&self, other: &Endpoint) -> bool {
        self.process.can_share_with(&other.process) && self.shm_dev == other.shm_dev && self.host == other.host
    }

    /// Why [`can_share_with`](Self::can_share_with) is false, for error messages.
    fn difference(&self, other: &Endpoint) -> String {
        if let Some(why) = self.process.difference(&other.process) {
            why
        } else if self.shm_dev != other.shm_dev {
            format!("it sees a different {SHM_DIR} mount (another container?)")
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
        assert_eq!(e.process.pid, std::process::id());
        assert!(!e.process.boot_id.is_empty());
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
            e.process.pid = pid;
            assert!(matches!(Endpoint::decode(&e.encode()), Err(Error::Protocol(_))), "pid {pid}");
        }
    }

    #[test]
    fn any_difference_means_no_sharing() {
        let a = Endpoint::local("test-host").unwrap();
        let changes: [fn(&mut Endpoint); 6] = [
            |e| e.process.hostname.push('x'),
            |e| e.process.boot_id.push('x'),
            |e| e.shm_dev ^= 1,
            |e| e.process.pid_ns ^= 1,
            |e| e.process.uid ^= 1,
            |e| e.host.push('x'),
        ];
        for change in changes {
            let mut b = a.clone();
            change(&mut b);
            assert!(!a.can_share_with(&b) && !b.can_share_with(&a));
            assert_ne!(a.difference(&b), "no difference");
        }
        let mut other_pid = a.clone();
        other_pid.process.pid += 1;
        assert!(a.can_share_with(&other_pid));
    }
}
