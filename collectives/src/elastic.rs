//! Carrying on after a failure: revoke a communicator, agree on the ranks it lost, and shrink it
//! into a communicator of the survivors — built without the lost ranks taking part.
//!
//! ```text
//! match comm.all_reduce(&mine, &mut sum, ReduceOp::Sum) {
//!     Err(e) if e.is_fatal() => {
//!         comm.revoke();                          // every rank stops, within milliseconds
//!         let lost = comm.agree_on_failed()?;     // the same list on every survivor
//!         comm = comm.shrink(&lost)?;             // survivors, renumbered in order
//!     }
//!     r => r?,
//! }
//! ```
//!
//! The protocols live in comm-core ([`comm_core::resilience`] for the revocation's spread,
//! [`comm_core::agreement`] for the agreement); this module is the communicator's side: which
//! ranks this one already knows failed, and the survivors' communicator.

use std::collections::BTreeSet;
use std::sync::Arc;

use comm_core::bootstrap::Bootstrap;
use comm_core::{Error, Result};

use crate::communicator::{Builder, Communicator, Lineage};
use crate::split::SubBootstrap;

/// The split color of a shrink's members (a namespace is never shared with a split's).
const SHRINK_COLOR: u32 = u32::MAX - 1;

impl Communicator {
    /// Revokes this communicator: its pending and later calls fail with [`Error::Revoked`] on
    /// every rank that can be reached — host waits and GPU kernels alike — within milliseconds,
    /// whatever those ranks are doing. Idempotent. Agreement and shrink still work on a revoked
    /// communicator; nothing else does.
    pub fn revoke(&self) {
        self.resilience.revoke();
    }

    /// Whether this communicator was revoked, here or by another rank.
    pub fn is_revoked(&self) -> bool {
        self.resilience.is_revoked()
    }

    /// Collective over the surviving ranks: agrees with them on the ranks this communicator
    /// lost, and returns them sorted — the same list on every survivor, even when more ranks die
    /// while it runs. Each wait for a peer is bounded by the timeout (`WEAVE_TIMEOUT`); a peer
    /// silent that long (a stopped process) counts as lost. Works on a revoked communicator and
    /// after [`Error::PeerLost`] or [`Error::Timeout`]; call [`shrink`](Self::shrink) with the
    /// result to go on.
    ///
    /// # Errors
    /// [`Error::Revoked`] when the others hold this rank failed (it was too slow to answer);
    /// [`Error::Unsupported`] over a bootstrap that carries no notices.
    pub fn agree_on_failed(&self) -> Result<Vec<usize>> {
        if !self.notices.supported() {
            return Err(Error::Unsupported(
                "agree_on_failed needs a bootstrap that carries notices (weave's TCP bootstrap does)".into(),
            ));
        }
        // Only what is known already: asking the bootstrap about every peer would open a link to
        // each (O(n) per rank); the agreement finds the others while it waits for them.
        let known = self.known_failed.borrow().clone();
        let lost = comm_core::agreement::agree(&self.resilience, &known, self.config.timeout)?;
        self.known_failed.borrow_mut().extend(lost.iter().copied());
        Ok(lost)
    }

    /// Collective over the ranks not in `exclude`: the communicator of those ranks, renumbered
    /// in order (the lowest surviving rank becomes rank 0). The excluded ranks take no part,
    /// dead or alive; only survivors call it, all with the same list (pass what
    /// [`agree_on_failed`](Self::agree_on_failed) returned). It runs over the links the survivors
    /// already hold (the root bootstrap), works on a revoked communicator and after
    /// [`Error::PeerLost`] or [`Error::Timeout`]; dropping this communicator afterwards waits
    /// for no excluded rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a rank is out of range or listed twice, when this rank is
    /// excluded, when every rank is, or when the survivors passed different lists.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let n = self.world_size();
        let mut excluded = BTreeSet::new();
        for &r in exclude {
            if r >= n {
                return Err(Error::invalid(format!("shrink: rank {r} is not a rank of this {n}-rank communicator")));
            }
            if !excluded.insert(r) {
                return Err(Error::invalid(format!("shrink: rank {r} is excluded twice")));
            }
        }
        if excluded.contains(&self.rank()) {
            return Err(Error::invalid(format!(
                "shrink: this rank ({}) is in the exclusion list; only the ranks that stay call shrink",
                self.rank()
            )));
        }
        let survivors: Vec<usize> = (0..n).filter(|r| !excluded.contains(r)).collect();
        let seq = self.splits.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        if seq >= 64 {
            return Err(Error::Unsupported("a communicator can be split or shrunk at most 63 times".into()));
        }
        let root_ranks: Vec<usize> = survivors.iter().map(|&r| self.root_ranks[r]).collect();
        let namespace = self.namespace * 64 + seq;
        let sub = SubBootstrap::new(self.root.clone(), root_ranks.clone(), namespace, SHRINK_COLOR)?;
        // Every survivor must have excluded the same ranks; differing lists fail on every one.
        let mine =
            comm_core::wire::digest64(&[&excluded.iter().flat_map(|r| (*r as u64).to_le_bytes()).collect::<Vec<u8>>()]);
        let all = sub.all_gather(&mine.to_le_bytes())?;
        if let Some(other) = all.iter().position(|d| d[..] != mine.to_le_bytes()[..]) {
            return Err(Error::invalid(format!(
                "shrink: rank {} (new rank {other}) excluded other ranks than this one did ({excluded:?}); every \
                 survivor must pass the same list",
                survivors[other]
            )));
        }
        let builder = Builder::for_child(self, Arc::new(sub));
        let lineage =
            Lineage { root: Some(self.root.clone()), namespace, root_ranks, notices: Some(self.notices.clone()) };
        let comm = Communicator::build_child(builder, lineage, self)?;
        tracing::info!(
            target: comm_core::diagnostics::INIT,
            rank = self.rank(),
            new_rank = comm.rank(),
            "shrunk a {n}-rank communicator to {} ranks, excluding {excluded:?}",
            comm.world_size()
        );
        Ok(comm)
    }
}
