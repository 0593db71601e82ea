//! Sub-communicators: [`Communicator::split`], and the bootstrap a sub-communicator (a split's or
//! a shrink's) talks through — a subset of a job's ranks, with its own tag space.
//!
//! A [`SubBootstrap`] talks through the job's root bootstrap, translating ranks and tags. Tags
//! of a sub-communicator live in their own namespace (bit 62 set, the namespace in bits 32..62),
//! so communicators sharing a root bootstrap never see each other's messages.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::Ordering;

use comm_core::bootstrap::{AbortableBootstrap, Bootstrap, RESERVED_TAG_BASE};
use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

use crate::api::builder::{Builder, Lineage, fit_to_placement};
use crate::api::communicator::Communicator;
use crate::host::HostSource;
use crate::table::Algorithm;

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
        // The parent's first 16 characters (a user's bootstrap may give a key that is not hex).
        let head: String = parent.chars().take(16).collect();
        let job_key = format!("{head}x{:012x}", digest & 0xffff_ffff_ffff);
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

/// Splits, the communicators of their groups.
impl Communicator {
    /// Collective over this communicator's ranks: every rank's `data`, by rank, through the
    /// bootstrap, for setting up a communicator derived from this one (what each rank asks of a
    /// split). Ends with [`Error::Aborted`] once this communicator is aborted
    /// ([`AbortHandle`](crate::AbortHandle)), so that an abort ends a split waiting for a rank that
    /// never comes; a revocation does not end it, since a member that finished the exchange may
    /// revoke this communicator before a slower member has received everything.
    pub fn all_gather_for_derivation(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        AbortableBootstrap::new(self.core().bootstrap().as_ref(), self.resilience.aborted()).all_gather(data)
    }

    /// Collective: the sub-communicator of the ranks passing `color`, ordered by `key`, for the
    /// steps of hierarchical calls: as [`split`](Self::split), with a table that cannot choose
    /// the hierarchical algorithm again.
    pub(crate) fn split_for_steps(&self, color: usize, key: usize) -> Result<Option<Communicator>> {
        let color = u32::try_from(color).map_err(|_| Error::invalid(format!("split color {color} is too large")))?;
        let sub = self.split(Some(color), key as i64)?;
        Ok(sub.map(|mut c| {
            c.table.clear_overrides_of(Algorithm::Hierarchical);
            // A step's wait must end when this communicator is revoked, not at its timeout.
            c.resilience.follow(&self.resilience);
            c
        }))
    }

    /// Collective: splits this communicator into groups of ranks with equal `color`, ordered by
    /// `key` (then by rank). Ranks passing `None` take part but get no communicator. Each
    /// sub-communicator has its own registrations, workspace and tag space.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let seq = self.splits.fetch_add(1, Ordering::AcqRel) + 1;
        let mine = Encoder::new(*b"WVSP", 1)
            .u32(color.map_or(u32::MAX, |c| c))
            .u64(key as u64)
            .u32(self.rank() as u32)
            .finish();
        let all = self.all_gather_for_derivation(&mine)?;
        let mut members = Vec::new();
        for (r, bytes) in all.iter().enumerate() {
            let mut d = Decoder::new(bytes, *b"WVSP", 1, "split request")?;
            let (c, k, claimed) = (d.u32()?, d.u64()? as i64, d.u32()? as usize);
            d.finish()?;
            if claimed != r {
                return Err(Error::protocol(format!("split request from rank {r} claims rank {claimed}")));
            }
            if Some(c) == color && c != u32::MAX {
                members.push((k, r));
            }
        }
        let Some(color) = color else { return Ok(None) };
        if color == u32::MAX {
            return Err(Error::invalid("split color u32::MAX is reserved for 'no group'; pass None"));
        }
        if seq >= 64 {
            return Err(Error::Unsupported("a communicator can be split at most 63 times".into()));
        }
        members.sort();
        let root_ranks: Vec<usize> = members.iter().map(|&(_, r)| self.root_ranks[r]).collect();
        let namespace = self.namespace * 64 + seq;
        let sub = SubBootstrap::new(self.root.clone(), root_ranks.clone(), namespace, color)?;
        let builder = Builder::for_child(self, Arc::new(sub));
        let lineage =
            Lineage { root: Some(self.root.clone()), namespace, root_ranks, notices: Some(self.notices.clone()) };
        Communicator::build_child(builder, lineage, self).map(Some)
    }

    /// Collective over `lineage`'s members: a split's or shrink's communicator, with this
    /// communicator's algorithm table fitted to where the members run.
    pub(crate) fn build_child(builder: Builder, lineage: Lineage, parent: &Communicator) -> Result<Communicator> {
        Self::build_child_with(builder, lineage, parent, HostSource::Fresh)
    }

    /// [`build_child`](Self::build_child) with the host engine from `host`.
    pub(crate) fn build_child_with(
        builder: Builder,
        lineage: Lineage,
        parent: &Communicator,
        host: HostSource<'_>,
    ) -> Result<Communicator> {
        let mut comm = Communicator::build_with(builder, lineage, host)?;
        comm.table = parent.table.clone();
        // A rail of a grid is one rank per node where its parent was not.
        fit_to_placement(&mut comm.table, &comm.core);
        Ok(comm)
    }
}
