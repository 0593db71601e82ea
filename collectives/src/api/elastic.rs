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
use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

use crate::api::builder::{Builder, Lineage};
use crate::api::communicator::Communicator;
use crate::api::split::SubBootstrap;
use crate::host::{HostSource, Progress};

/// The split color of a shrink's members (a namespace is never shared with a split's).
const SHRINK_COLOR: u32 = u32::MAX - 1;

/// What a survivor tells the others when a shrink begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShrinkOffer {
    /// Digest of the exclusion list it passed.
    pub(crate) digest: u64,
    /// Whether it hands its communicator over (it failed here), and how far it got in its host
    /// workspace (nothing without one; see [`Communicator::handover_offer`]).
    pub(crate) handover: Option<Progress>,
}

impl ShrinkOffer {
    /// Magic and version of an encoded offer ([`comm_core::wire`]).
    const MAGIC: [u8; 4] = *b"WVSO";
    const VERSION: u16 = 1;

    pub(crate) fn encode(&self) -> Vec<u8> {
        let p = self.handover.unwrap_or_default();
        Encoder::new(Self::MAGIC, Self::VERSION)
            .u64(self.digest)
            .u8(u8::from(self.handover.is_some()))
            .u64(p.phase)
            .u64(p.step)
            .finish()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, Self::MAGIC, Self::VERSION, "shrink offer")?;
        let (digest, offers, phase, step) = (d.u64()?, d.u8()?, d.u64()?, d.u64()?);
        d.finish()?;
        let handover = match offers {
            0 if phase == 0 && step == 0 => None,
            0 => return Err(Error::protocol("shrink offer: a declined handover with progress")),
            1 => Some(Progress { phase, step }),
            x => return Err(Error::protocol(format!("shrink offer: handover flag {x}"))),
        };
        Ok(ShrinkOffer { digest, handover })
    }
}

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

    /// Whether this rank hands its communicator over to a shrink — when it failed here:
    /// revoked, an agreement found lost ranks, or a failure broke an executor — and how far it
    /// got in its host workspace (zero without one). A healthy communicator keeps what it has
    /// (and stays usable) and the shrink builds anew; so does every survivor unless all hand
    /// theirs over.
    fn handover_offer(&self) -> Result<Option<Progress>> {
        let busy = |_| crate::call::already_in_a_call();
        let host = self.host.as_ref().map(|h| h.try_borrow().map_err(busy)).transpose()?;
        let channel_broken = self.channel.try_borrow().map_err(busy)?.is_broken();
        let failed = self.is_revoked()
            || !self.known_failed.borrow().is_empty()
            || channel_broken
            || host.as_ref().is_some_and(|h| h.is_broken());
        Ok(failed.then(|| host.map(|h| h.progress()).unwrap_or_default()))
    }

    /// The shrink's primitives layer, carried over from this communicator's
    /// ([`CoreCommunicator::carry_over`]) — or `None` when some survivor could not flush what
    /// it carried (the shrink then opens transports of its own). Every survivor calls it, and
    /// none returns before every survivor flushed, so nothing this communicator sent lands
    /// after a survivor released its memory. First stops what of this communicator issues work
    /// through the connections on its own (the GPU channel family's proxy), then retires it:
    /// the two share the transports' abort flag, which a revocation raised and the shrink needs
    /// lowered.
    ///
    /// [`CoreCommunicator::carry_over`]: comm_core::communicator::Communicator::carry_over
    fn carry_transports_over(
        &self,
        bootstrap: Arc<dyn Bootstrap>,
        members: &[usize],
    ) -> Result<Option<comm_core::communicator::Communicator>> {
        #[cfg(feature = "cuda")]
        if let Some(gpu) = &self.gpu {
            gpu.try_borrow().map_err(|_| crate::call::already_in_a_call())?.stop_proxy();
        }
        self.resilience.retire();
        let carried = self.core.carry_over(bootstrap.clone(), members).and_then(|core| {
            core.flush_carried()?;
            Ok(core)
        });
        let all = bootstrap.all_gather(&[u8::from(carried.is_ok())])?;
        let why = match (carried, all.iter().position(|b| b[..] != [1])) {
            (Ok(core), None) => return Ok(Some(core)),
            (Err(e), _) => format!("this rank could not carry them: {e}"),
            (Ok(_), Some(r)) => format!("rank {} (new rank {r}) could not carry them", members[r]),
        };
        tracing::warn!(
            target: comm_core::diagnostics::FAULT,
            rank = self.rank(),
            "the shrink opens transports of its own instead of carrying this communicator's over: {why}"
        );
        Ok(None)
    }

    /// Collective over the ranks not in `exclude`: the communicator of those ranks, renumbered
    /// in order (the lowest surviving rank becomes rank 0). The excluded ranks take no part,
    /// dead or alive; only survivors call it, all with the same list (pass what
    /// [`agree_on_failed`](Self::agree_on_failed) returned). It runs over the links the survivors
    /// already hold (the root bootstrap), works on a revoked communicator and after
    /// [`Error::PeerLost`] or [`Error::Timeout`]; dropping this communicator afterwards waits
    /// for no excluded rank.
    ///
    /// When this communicator failed on every survivor — revoked, an agreement found lost
    /// ranks, or a failure broke an executor — the new communicator takes over what the
    /// survivors hold: the host workspaces (memory, mappings, point-to-point mailboxes: nothing
    /// registered, exchanged or probed again; a message sent here and never received is
    /// dropped), the transports and the connections (flushed first; none opened or made
    /// again). This communicator is retired: its calls fail, it reports itself revoked, and
    /// neither its [`AbortHandle`](crate::AbortHandle) nor a late revocation reaches the new one.
    /// A GPU workspace is always new: a stopped, excluded rank's kernels could still write into
    /// the old one. A healthy communicator keeps everything and stays usable; the shrink then
    /// builds the new one's.
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
        // One exchange among the survivors: the exclusion list they passed (every survivor must
        // pass the same), whether this one can hand its host workspace over, and how far it got
        // there. Every survivor has left the parent's calls once it has everyone's answer.
        let digest =
            comm_core::wire::digest64(&[&excluded.iter().flat_map(|r| (*r as u64).to_le_bytes()).collect::<Vec<u8>>()]);
        let mine = ShrinkOffer { digest, handover: self.handover_offer()? };
        let all = sub.all_gather(&mine.encode())?;
        let mut offers = Vec::with_capacity(all.len());
        for (r, bytes) in all.iter().enumerate() {
            offers.push(ShrinkOffer::decode(bytes).map_err(|e| {
                Error::protocol(format!("shrink: rank {} (new rank {r}) sent a malformed offer: {e}", survivors[r]))
            })?);
        }
        if let Some(other) = offers.iter().position(|o| o.digest != digest) {
            return Err(Error::invalid(format!(
                "shrink: rank {} (new rank {other}) excluded other ranks than this one did ({excluded:?}); every \
                 survivor must pass the same list",
                survivors[other]
            )));
        }
        let sub: Arc<dyn Bootstrap> = Arc::new(sub);
        let lineage =
            Lineage { root: Some(self.root.clone()), namespace, root_ranks, notices: Some(self.notices.clone()) };
        // Every survivor sees the same offers, so all take the same road.
        let handover =
            offers.iter().map(|o| o.handover).try_fold(Progress::default(), |far, h| h.map(|p| far.furthest(p)));
        let carried = match handover {
            Some(_) => self.carry_transports_over(sub.clone(), &survivors)?,
            None => None,
        };
        let builder = match carried {
            Some(core) => Builder::for_child_over(self, core),
            None => Builder::for_child(self, sub),
        };
        let comm = match (handover, &self.host) {
            (Some(progress), Some(host)) => {
                let parent = host.try_borrow().map_err(|_| crate::call::already_in_a_call())?;
                let host = HostSource::Handover { parent: &parent, members: &survivors, progress };
                Communicator::build_child_with(builder, lineage, self, host)?
            }
            _ => Communicator::build_child(builder, lineage, self)?,
        };
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

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::time::Duration;

    use comm_core::config::Config;
    use comm_core::loopback::{LoopbackBootstrap, LoopbackTransport};

    use super::*;
    use crate::op::ReduceOp;

    /// Addresses of every rank's host workspace as this rank maps them.
    fn workspaces(comm: &Communicator) -> Vec<usize> {
        let host = comm.host.as_ref().expect("a host workspace").borrow();
        host.ws.memories().iter().map(|m| m.as_ptr() as usize).collect()
    }

    /// Whether `child` goes on with `parent`'s transports and connections (the same objects).
    fn carries(child: &Communicator, parent: &Communicator) -> bool {
        let me = child.rank();
        let same_connections = (0..child.world_size()).filter(|&p| p != me).all(|p| {
            let theirs = parent.core().connection(p).expect("the parent's connection");
            Arc::ptr_eq(&child.core().connection(p).expect("the child's connection"), &theirs)
        });
        child.core().shares_transports_with(parent.core()) && same_connections
    }

    /// Four thread ranks; rank 3 leaves. Before it does, ranks 0 and 1 exchange messages and
    /// rank 1 sends one that rank 0 never receives; after, rank 0 alone arrives in an
    /// all-reduce (it times out), so the survivors' workspaces are one arrival apart. The
    /// shrink must hand the survivors' workspaces, transports and connections over (the same
    /// objects), drop the message nobody took, go on past the stray arrival, and leave the
    /// parent failing (its abort and revocation then touch the shrunk one no more); a healthy
    /// shrink of the result builds anew and leaves it usable.
    #[test]
    fn a_failed_communicator_hands_its_host_workspace_to_the_shrink() {
        const N: usize = 4;
        // Rank 0's lone call waits this long; the agreement takes a rank silent this long for lost.
        let timeout = Duration::from_secs(3);
        let group = LoopbackBootstrap::group(N, Duration::from_secs(20));
        let (left, stray) = (Barrier::new(N), Barrier::new(N - 1));
        let (left, stray) = (&left, &stray);
        std::thread::scope(|s| {
            let handles: Vec<_> = group
                .into_iter()
                .map(|b| {
                    s.spawn(move || {
                        let comm = Communicator::builder(b)
                            .with_transport(LoopbackTransport)
                            .with_config(Config { timeout, ..Config::default() })
                            .build()
                            .expect("building the communicator");
                        let me = comm.rank();
                        let mut sum = [0u64; 64];
                        comm.all_reduce(&[me as u64; 64], &mut sum, ReduceOp::Sum).expect("the first all-reduce");
                        if me < 2 {
                            for round in 0..3u8 {
                                let (mine, mut theirs) = ([round + me as u8; 40], [0u8; 40]);
                                let mut g = comm.group();
                                g.send(&mine, 1 - me).recv(&mut theirs, 1 - me);
                                g.run().expect("an exchange before the failure");
                                assert_eq!(theirs, [round + 1 - me as u8; 40]);
                            }
                            if me == 1 {
                                comm.send(&[0xeeu8; 36], 0).expect("the send nobody receives");
                            }
                        }
                        left.wait();
                        if me == 3 {
                            return;
                        }
                        if me == 0 {
                            let e = comm.all_reduce(&[7u64; 64], &mut sum, ReduceOp::Sum).expect_err("alone");
                            assert!(e.is_fatal(), "{e}");
                        }
                        stray.wait();
                        let lost = comm.agree_on_failed().expect("agreeing");
                        assert_eq!(lost, [3]);
                        let before = workspaces(&comm);
                        let shrunk = comm.shrink(&lost).expect("shrinking");
                        assert_eq!(workspaces(&shrunk), before[..3], "rank {me}: the shrink built new workspaces");
                        assert!(carries(&shrunk, &comm), "rank {me}: the shrink opened transports of its own");
                        if me == 1 {
                            match comm.all_reduce(&[1u64; 64], &mut sum, ReduceOp::Sum) {
                                Err(e) => assert!(e.to_string().contains("was shrunk"), "{e}"),
                                Ok(()) => panic!("the parent's call after the handover worked"),
                            }
                            // The retired parent shares the transports' abort flag: neither
                            // stops the shrunk communicator.
                            comm.abort();
                            comm.revoke();
                        }
                        for round in 0..20u64 {
                            let mine = [round * 10 + me as u64; 64];
                            shrunk.all_reduce(&mine, &mut sum, ReduceOp::Sum).expect("an all-reduce after the shrink");
                            assert_eq!(sum, [round * 30 + 3; 64], "rank {me}, round {round}");
                        }
                        if me < 2 {
                            let (mine, mut theirs) = ([0x40 + me as u8; 36], [0u8; 36]);
                            let mut g = shrunk.group();
                            g.send(&mine, 1 - me).recv(&mut theirs, 1 - me);
                            g.run().expect("an exchange after the shrink");
                            assert_eq!(
                                theirs,
                                [0x41 - me as u8; 36],
                                "rank {me}: the message left behind came through"
                            );
                        }
                        let again = shrunk.shrink(&[]).expect("a healthy shrink");
                        assert_ne!(workspaces(&again), workspaces(&shrunk), "a healthy shrink took the workspace over");
                        assert!(!carries(&again, &shrunk), "a healthy shrink took the transports over");
                        for c in [&shrunk, &again] {
                            c.all_reduce(&[1u64; 64], &mut sum, ReduceOp::Sum).expect("both usable");
                            assert_eq!(sum, [3; 64]);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("a rank thread panicked");
            }
        });
    }
}
