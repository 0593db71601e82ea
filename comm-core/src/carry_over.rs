//! A communicator of some of another's ranks that goes on with the other's transports and
//! connections — what a shrink builds when the communicator it shrinks failed on every
//! survivor: no transport is opened, no endpoint exchanged, no connection made again.
//!
//! The transports keep the ranks they were opened with (their *transport ranks*): rank `r` of
//! the new communicator is transport rank `transport_ranks[r]`. The communicator maps a rank to
//! its transport rank at every call into a transport — connecting, importing a peer's memory —
//! and hands out each carried connection inside a [`RenumberedConnection`], which names the
//! peer by its new rank (errors included). Imported memory remembers its owner's transport
//! rank ([`RegisteredMemory::transport_owner`]), which is what a connection checks a
//! destination against.
//!
//! A connection may still carry what the old communicator sent before it failed: a frame in
//! flight, a credit held back. [`Communicator::flush_carried`] flushes every carried connection
//! to the new communicator's peers; callers flush on every member, and let no member release
//! the old communicator's memory before all have flushed, so that nothing of the old one lands
//! after its memory is gone.
//!
//! [`RegisteredMemory::transport_owner`]: crate::memory::RegisteredMemory::transport_owner

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::bootstrap::Bootstrap;
use crate::communicator::Communicator;
use crate::connection::{CheckedWrite, Connection};
use crate::diagnostics;
use crate::error::{Error, Result};
use crate::memory::RegisteredMemory;
use crate::topology::{PeerReach, Topology};
use crate::transport::Transport;

impl Communicator {
    /// The communicator of this one's ranks `members` (rank `r` of it is `members[r]` here),
    /// over `bootstrap` (whose rank and size it takes), that goes on with this communicator's
    /// transports, endpoints and connections instead of opening its own. Not collective: each
    /// member makes its own, and nothing crosses the network.
    ///
    /// The two share the abort flag the transports watch, so aborting either stops both: stop
    /// using this communicator first (collectives retire it, [`Resilience::retire`]), lower
    /// the flag if a revocation raised it, then [`flush_carried`](Self::flush_carried) on every
    /// member before any member releases this communicator's memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `members` does not list `bootstrap`'s ranks as ranks of
    /// this communicator (one per bootstrap rank, in range, none twice), or this rank is not
    /// `members[bootstrap.rank()]`.
    ///
    /// [`Resilience::retire`]: crate::resilience::Resilience::retire
    pub fn carry_over(&self, bootstrap: Arc<dyn Bootstrap>, members: &[usize]) -> Result<Communicator> {
        let (rank, world_size) = crate::bootstrap::checked_shape(&*bootstrap)?;
        let n = self.world_size();
        let mut seen = vec![false; n];
        if members.len() != world_size || members.iter().any(|&m| m >= n || std::mem::replace(&mut seen[m], true)) {
            return Err(Error::invalid(format!(
                "carry_over: members {members:?} are not {world_size} distinct ranks of this {n}-rank communicator"
            )));
        }
        if members[rank] != self.rank() {
            return Err(Error::invalid(format!(
                "carry_over: rank {rank} of the new communicator is member {}, but this is rank {}",
                members[rank],
                self.rank()
            )));
        }
        let hosts: Vec<String> = members.iter().map(|&m| self.hosts[m].clone()).collect();
        let routes: Vec<Vec<usize>> = members.iter().map(|&m| self.routes[m].clone()).collect();
        let reach = routes
            .iter()
            .map(|route| PeerReach {
                transports: route
                    .iter()
                    .map(|&i| (self.backends[i].transport(), self.backends[i].direct_access()))
                    .collect(),
            })
            .collect();
        let comm = Communicator {
            config: self.config.clone(),
            id: crate::communicator::next_communicator_id(),
            abort: self.abort.clone(),
            backends: self.backends.clone(),
            endpoints: members.iter().map(|&m| self.endpoints[m].clone()).collect(),
            topology: Topology::new(rank, &hosts, reach),
            hosts,
            routes,
            transport_ranks: members.iter().map(|&m| self.transport_ranks[m]).collect(),
            connections: self.connections.clone(),
            next_registration: AtomicU64::new(0),
            next_pair_registration: AtomicU64::new(0),
            next_private_registration: AtomicU64::new(0),
            tokens: Mutex::new(std::collections::HashMap::new()),
            bootstrap,
        };
        tracing::debug!(
            target: diagnostics::INIT,
            rank,
            world_size,
            communicator = comm.id,
            from = self.id,
            "communicator {} carries over the transports of communicator {} (members {members:?})",
            comm.id,
            self.id
        );
        Ok(comm)
    }

    /// Flushes every connection this communicator holds to its peers — those a
    /// [`carry_over`](Self::carry_over) took from the old communicator included — so that
    /// nothing sent before is still on its way. The first failure, naming the peer, is the
    /// error.
    pub fn flush_carried(&self) -> Result<()> {
        let peer_of: std::collections::HashMap<usize, usize> =
            self.transport_ranks.iter().enumerate().filter(|&(p, _)| p != self.rank()).map(|(p, &t)| (t, p)).collect();
        let held: Vec<(usize, Arc<dyn Connection>)> = {
            let conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
            conns.iter().filter_map(|((t, _), c)| Some((*peer_of.get(t)?, c.clone()))).collect()
        };
        for (peer, c) in held {
            self.renumbered(c, peer).flush()?;
        }
        Ok(())
    }

    /// Whether this communicator and `other` go on with the same transports (one carried the
    /// other's over, or both another's).
    pub fn shares_transports_with(&self, other: &Communicator) -> bool {
        self.backends.iter().any(|b| other.backends.iter().any(|o| Arc::ptr_eq(b, o)))
    }

    /// The rank that this communicator's transports know rank `r` by (`r` itself unless this
    /// communicator was made by [`carry_over`](Self::carry_over)).
    pub fn transport_rank(&self, r: usize) -> Option<usize> {
        self.transport_ranks.get(r).copied()
    }

    /// `connection` (to transport rank `transport_ranks[peer]`) as this communicator's
    /// connection to `peer`: itself where the two numbers agree.
    pub(crate) fn renumbered(&self, connection: Arc<dyn Connection>, peer: usize) -> Arc<dyn Connection> {
        if connection.peer() == peer {
            return connection;
        }
        Arc::new(RenumberedConnection { inner: connection, peer })
    }
}

/// A connection carried over into a communicator that numbers its peer differently from the
/// transport that built it: every call goes to the transport's connection, and the peer is
/// named by its rank in this communicator — by [`peer`](Connection::peer) and in the errors.
pub struct RenumberedConnection {
    inner: Arc<dyn Connection>,
    /// The peer's rank in this communicator.
    peer: usize,
}

impl RenumberedConnection {
    /// `e` with the peer named by its rank in this communicator.
    fn renumber(&self, e: Error) -> Error {
        let transport_peer = self.inner.peer();
        match e {
            Error::Timeout { operation, peer: Some(p), waited, verdict } if p == transport_peer => {
                Error::Timeout { operation, peer: Some(self.peer), waited, verdict }
            }
            Error::PeerLost { peer, operation, reason, verdict } if peer == transport_peer => {
                Error::PeerLost { peer: self.peer, operation, reason, verdict }
            }
            e => e,
        }
    }
}

impl Connection for RenumberedConnection {
    fn transport(&self) -> Transport {
        self.inner.transport()
    }

    fn peer(&self) -> usize {
        self.peer
    }

    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<()> {
        self.inner.write_checked(write).map_err(|e| self.renumber(e))
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        self.inner.update_and_sync(dst, dst_offset, value).map_err(|e| self.renumber(e))
    }

    fn update_lazily(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        self.inner.update_lazily(dst, dst_offset, value).map_err(|e| self.renumber(e))
    }

    fn write_and_sync(&self, write: CheckedWrite<'_>, flag_offset: usize, value: u64) -> Result<()> {
        self.inner.write_and_sync(write, flag_offset, value).map_err(|e| self.renumber(e))
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush().map_err(|e| self.renumber(e))
    }

    fn progress(&self) -> Result<()> {
        self.inner.progress().map_err(|e| self.renumber(e))
    }

    fn check_peer(&self) -> Result<()> {
        self.inner.check_peer().map_err(|e| self.renumber(e))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::loopback::{LoopbackBootstrap, LoopbackTransport};

    /// Four thread ranks connect every pair; ranks 0, 2 and 3 carry the communicator over
    /// without rank 1. The new one must use the old connections (the same objects where the
    /// numbers agree, renumbered where they do not), move data between the new ranks, name
    /// peers by their new ranks in errors, and refuse members that do not fit.
    #[test]
    fn a_carried_over_communicator_renumbers_its_peers_and_keeps_the_connections() {
        const MEMBERS: [usize; 3] = [0, 2, 3];
        let timeout = Duration::from_millis(400);
        let config = Config { timeout, ..Config::default() };
        let mut subs: Vec<Option<LoopbackBootstrap>> = (0..4).map(|_| None).collect();
        for (b, &m) in LoopbackBootstrap::group(3, Duration::from_secs(5)).into_iter().zip(&MEMBERS) {
            subs[m] = Some(b);
        }
        let group = LoopbackBootstrap::group(4, Duration::from_secs(5));
        std::thread::scope(|s| {
            for (b, sub) in group.into_iter().zip(subs) {
                let config = config.clone();
                s.spawn(move || {
                    let comm = Communicator::builder(b).with_transport(LoopbackTransport).with_config(config).build();
                    let comm = comm.expect("building");
                    let me = comm.rank();
                    let old: Vec<Option<Arc<dyn Connection>>> =
                        (0..4).map(|p| (p != me).then(|| comm.connection(p).expect("connecting"))).collect();
                    comm.bootstrap().barrier().expect("the old communicator's barrier");
                    let Some(sub) = sub else { return };
                    let sub: Arc<dyn Bootstrap> = Arc::new(sub);
                    let wrong = [&[0usize, 2][..], &[0, 2, 2], &[0, 2, 4], &[3, 0, 2]];
                    for members in wrong {
                        let e = comm.carry_over(sub.clone(), members).expect_err("members that do not fit");
                        assert!(matches!(e, Error::InvalidArgument(_)), "{members:?}: {e}");
                    }
                    let new = comm.carry_over(sub, &MEMBERS).expect("carrying over");
                    let r = new.rank();
                    assert_eq!((MEMBERS[r], new.world_size()), (me, 3));
                    assert!(Arc::ptr_eq(&new.abort, &comm.abort), "the abort flag is not shared");
                    for q in (0..3).filter(|&q| q != r) {
                        assert_eq!(new.transport_rank(q), Some(MEMBERS[q]));
                        let c = new.connection(q).expect("a carried connection");
                        assert_eq!(c.peer(), q, "rank {r}: the connection to new rank {q} is named {}", c.peer());
                        let old = old[MEMBERS[q]].as_ref().expect("connected before");
                        assert_eq!(
                            Arc::ptr_eq(&c, old),
                            q == MEMBERS[q],
                            "rank {r} to {q}: the same object or a wrapper"
                        );
                    }
                    assert_eq!(comm.connections.lock().unwrap().len(), 3, "rank {me}: a connection was made again");
                    new.flush_carried().expect("flushing");

                    let buf = new.register_host(64 * 3, "carried").expect("registering");
                    let all = new.exchange(&buf).expect("exchanging");
                    assert_eq!(all.iter().map(RegisteredMemory::owner).collect::<Vec<_>>(), [0, 1, 2]);
                    let ts: Vec<usize> = all.iter().map(RegisteredMemory::transport_owner).collect();
                    assert_eq!(ts, MEMBERS, "rank {r}: owners as the transport knows them");
                    let channels: Vec<_> = (0..3)
                        .filter(|&q| q != r)
                        .map(|q| new.memory_channel(&buf, &all[q]).expect("a memory channel"))
                        .collect();
                    buf.write_bytes(64 * r, &[r as u8 + 1; 64]).unwrap();
                    for ch in &channels {
                        ch.put_with_signal(64 * r, 64 * r, 64).expect("a put");
                    }
                    for ch in &channels {
                        ch.wait().expect("a signal");
                    }
                    for q in (0..3).filter(|&q| q != r) {
                        let mut got = [0u8; 64];
                        buf.read_bytes(64 * q, &mut got).unwrap();
                        assert_eq!(got, [q as u8 + 1; 64], "rank {r}: slot of new rank {q}");
                    }
                    new.bootstrap().barrier().expect("the new communicator's barrier");
                    // New rank 0 waits for a signal new rank 2 (transport rank 3) never sends.
                    if r == 0 {
                        let e = new.semaphore(2).expect("a semaphore").wait().expect_err("nobody signals");
                        assert!(matches!(e, Error::Timeout { peer: Some(2), .. }), "{e}");
                    } else if r == 2 {
                        new.semaphore(0).expect("a semaphore");
                    }
                });
            }
        });
    }
}
