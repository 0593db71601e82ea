//! Sub-communicators: a bootstrap over a subset of a job's ranks, with its own tag space.
//!
//! A [`SubBootstrap`] talks through the job's root bootstrap, translating ranks and tags. Tags
//! of a sub-communicator live in their own namespace (bit 62 set, the namespace in bits 32..62),
//! so communicators sharing a root bootstrap never see each other's messages.

use std::sync::Arc;
use std::time::Duration;

use comm_core::bootstrap::{Bootstrap, RESERVED_TAG_BASE};
use comm_core::{Error, Result};

/// Largest user tag a sub-communicator accepts.
pub const MAX_SUB_TAG: u64 = (1 << 31) - 1;
/// Largest namespace id (30 bits).
pub(crate) const MAX_NAMESPACE: u64 = (1 << 30) - 1;

/// A bootstrap over `members` (root-bootstrap ranks, in sub-rank order).
pub struct SubBootstrap {
    root: Arc<dyn Bootstrap>,
    members: Vec<usize>,
    rank: usize,
    namespace: u64,
    job_key: String,
}

impl SubBootstrap {
    /// The sub-bootstrap in which this process (root rank `root.rank()`) is member number
    /// `members.iter().position(root rank)`. `namespace` must be unique in the job for every
    /// split of the same parent and `color` distinguishes the groups of one split.
    pub(crate) fn new(root: Arc<dyn Bootstrap>, members: Vec<usize>, namespace: u64, color: u32) -> Result<Self> {
        if namespace == 0 || namespace > MAX_NAMESPACE {
            return Err(Error::Unsupported(format!(
                "communicator split namespace {namespace} is out of range: splits nest too deep or too often"
            )));
        }
        let me = root.rank();
        let rank = members
            .iter()
            .position(|&m| m == me)
            .ok_or_else(|| Error::invalid(format!("rank {me} is not a member of the sub-communicator")))?;
        let parent = root.job_key();
        let digest = comm_core::wire::digest64(&[parent.as_bytes(), &namespace.to_le_bytes(), &color.to_le_bytes()]);
        let job_key = format!("{}x{:012x}", &parent[..parent.len().min(16)], digest & 0xffff_ffff_ffff);
        Ok(SubBootstrap { root, members, rank, namespace, job_key })
    }

    fn map_tag(&self, tag: u64) -> Result<u64> {
        let internal = tag >= RESERVED_TAG_BASE;
        let low = tag & !RESERVED_TAG_BASE;
        if low > MAX_SUB_TAG {
            return Err(Error::invalid(format!(
                "tag {tag:#x} is too large for a sub-communicator (at most {MAX_SUB_TAG:#x})"
            )));
        }
        Ok((1 << 62) | (self.namespace << 32) | (u64::from(internal) << 31) | low)
    }

    fn member(&self, peer: usize) -> Result<usize> {
        self.members.get(peer).copied().ok_or_else(|| {
            Error::invalid(format!("rank {peer} is not in this {}-rank sub-communicator", self.members.len()))
        })
    }

    /// Root-bootstrap ranks of the members, in sub-rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }
}

impl Bootstrap for SubBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn peer_lost(&self, peer: usize) -> Option<String> {
        self.root.peer_lost(self.member(peer).ok()?)
    }
    fn world_size(&self) -> usize {
        self.members.len()
    }
    /// Exact when the whole job runs on one host; across hosts the root bootstrap does not say
    /// which members share this host, so this is this rank's index among members on hosts
    /// counted by the root (an upper bound).
    fn local_rank(&self) -> usize {
        if self.root.local_world_size() == self.root.world_size() {
            self.rank
        } else {
            self.rank.min(self.root.local_rank())
        }
    }
    fn local_world_size(&self) -> usize {
        if self.root.local_world_size() == self.root.world_size() {
            self.members.len()
        } else {
            self.members.len().min(self.root.local_world_size())
        }
    }
    fn job_key(&self) -> String {
        self.job_key.clone()
    }
    fn timeout(&self) -> Duration {
        self.root.timeout()
    }
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.root.send(self.member(peer)?, self.map_tag(tag)?, data)
    }
    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.root.recv(self.member(peer)?, self.map_tag(tag)?)
    }
    fn recv_or_abort(&self, peer: usize, tag: u64, abort: &std::sync::atomic::AtomicBool) -> Result<Vec<u8>> {
        self.root.recv_or_abort(self.member(peer)?, self.map_tag(tag)?, abort)
    }
    fn carries_notices(&self) -> bool {
        self.root.carries_notices()
    }
    /// The root bootstrap's notices (senders in root ranks): notices name their communicator.
    fn recv_notice(&self, timeout: Duration) -> Result<Option<(usize, Vec<u8>)>> {
        self.root.recv_notice(timeout)
    }
}
