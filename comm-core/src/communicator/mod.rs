//! The communicator: one rank's view of a job. It owns the bootstrap and the transports, picks
//! a transport for each peer, registers and exchanges memory, and builds connections,
//! semaphores and channels.
//!
//! Setup calls are collective (every rank calls them in the same order) or pairwise (both ranks
//! of a pair call them in the same order). Divergence is detected where it can be — a
//! registration exchanged out of order gives [`Error::RegistrationMismatch`] on every rank —
//! and every wait is bounded.
//!
//! This file holds the builder, routing (which transports reach which peer, from the endpoint
//! tables of `endpoints.rs`), the topology and connections, and the channels; the memory half of [`Communicator`] — registration, exchange,
//! pairwise memory and the token pools behind [`semaphore`](Communicator::semaphore) — is a
//! second `impl` block in `registration.rs`, and the communicator of some of the ranks that goes
//! on with these transports ([`carry_over`](Communicator::carry_over)) a third, in
//! `carry_over.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::bootstrap::{AbortableBootstrap, Bootstrap};
use crate::config::Config;
use crate::connection::Connection;
use crate::diagnostics;
use crate::endpoints;
use crate::error::{Error, Result};
use crate::fifo::DEFAULT_FIFO_CAPACITY;
use crate::memory::RegisteredMemory;
use crate::memory_channel::MemoryChannel;
use crate::port_channel::PortChannel;
use crate::proxy::ProxyService;
use crate::semaphore::PeerTokens;
use crate::topology::{PeerReach, Topology};
use crate::transport::{PeerLiveness, Transport, TransportBackend, TransportContext, TransportFactory};

/// Version of the communicator's setup messages (endpoint table here; status and semaphore
/// handshake in `registration.rs`). 3: transports named, not flag bits.
pub(crate) const WIRE_VERSION: u16 = 3;

pub(crate) fn next_communicator_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Builds a [`Communicator`] from a bootstrap and the transports to use.
pub struct CommunicatorBuilder {
    bootstrap: Arc<dyn Bootstrap>,
    factories: Vec<Arc<dyn TransportFactory>>,
    config: Option<Config>,
    cancel: Option<Arc<AtomicBool>>,
}

impl CommunicatorBuilder {
    /// Adds a transport. Earlier transports are preferred when several reach a peer.
    pub fn with_transport(mut self, factory: impl TransportFactory + 'static) -> Self {
        self.factories.push(Arc::new(factory));
        self
    }

    /// Adds a shared transport factory.
    pub fn with_transport_arc(mut self, factory: Arc<dyn TransportFactory>) -> Self {
        self.factories.push(factory);
        self
    }

    /// Uses `config` instead of reading the `WEAVE_*` environment.
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Lets another thread call the build off: once `cancel` is set, [`build`](Self::build)'s
    /// exchange with the other ranks (where a rank that never comes is waited for) ends with
    /// [`Error::Aborted`] (a program giving up on a communicator still being made). The flag is
    /// the build's alone: the communicator has an abort flag of its own.
    ///
    /// With a flag, the exchange runs over the bootstrap's `send` and
    /// [`recv_or_abort`](Bootstrap::recv_or_abort) (the trait's tree all-gather) instead of its own
    /// `all_gather`, so every rank passes a flag or none; the bootstrap's `recv_or_abort` must
    /// look at the flag ([`TcpBootstrap`](crate::bootstrap::TcpBootstrap) and the loopback one do;
    /// the trait's default waits on).
    pub fn with_cancel_flag(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Collective: opens the transports, exchanges endpoints with every rank, and picks a
    /// transport for each peer. Ends with [`Error::Aborted`] where the flag of
    /// [`with_cancel_flag`](Self::with_cancel_flag) is set meanwhile.
    pub fn build(self) -> Result<Communicator> {
        let config = match self.config {
            Some(c) => c,
            None => Config::from_env()?,
        };
        let bootstrap = self.bootstrap;
        let (rank, world_size) = crate::bootstrap::checked_shape(&*bootstrap)?;
        let id = next_communicator_id();
        let started = std::time::Instant::now();
        let _span = tracing::info_span!(target: diagnostics::INIT, "communicator", rank, world_size, id).entered();
        let cancel = self.cancel;
        if cancel.as_ref().is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(Error::Aborted(format!(
                "building communicator {id} (rank {rank}): called off before it began"
            )));
        }
        let abort = Arc::new(AtomicBool::new(false));
        let ctx = TransportContext {
            rank,
            world_size,
            job_key: bootstrap.job_key(),
            communicator_id: id,
            config: config.clone(),
            abort: abort.clone(),
            liveness: PeerLiveness::of(bootstrap.clone()),
        };
        let allowed = |t: Transport| config.transports.as_ref().is_none_or(|set| set.contains(t));
        let mut backends: Vec<Arc<dyn TransportBackend>> = Vec::new();
        for f in &self.factories {
            let t = f.transport();
            if !allowed(t) {
                continue;
            }
            if backends.iter().any(|b| b.transport() == t) {
                return Err(Error::invalid(format!("transport {} was added twice", t.name())));
            }
            let opening = std::time::Instant::now();
            match f.open(&ctx) {
                Ok(b) => {
                    tracing::debug!(target: diagnostics::TRANSPORT, rank, transport = t.name(), took = ?opening.elapsed(), "transport {} opened", t.name());
                    backends.push(b);
                }
                Err(e) => {
                    // Expected on machines without the hardware (no GPU for cudaipc): info, not warn.
                    tracing::info!(target: diagnostics::TRANSPORT, rank, transport = t.name(), "transport {} is not available here: {e}", t.name());
                }
            }
        }
        if backends.is_empty() {
            return Err(Error::invalid(format!(
                "no transport is available (builder had {}, WEAVE_TRANSPORTS allows {}); add one with with_transport",
                self.factories.iter().map(|f| f.transport().name()).collect::<Vec<_>>().join(","),
                config.transports.as_ref().map_or_else(|| "all".to_string(), ToString::to_string)
            )));
        }

        let host = crate::host::host_identity(config.host_id.as_deref());
        let mut table = Vec::with_capacity(backends.len());
        for b in &backends {
            table.push((b.transport(), b.local_endpoint()?));
        }
        let mine = endpoints::encode(rank, &host, &table)?;
        let gathered = match &cancel {
            Some(cancel) => AbortableBootstrap::new(bootstrap.as_ref(), cancel).all_gather(&mine)?,
            None => bootstrap.all_gather(&mine)?,
        };
        if gathered.len() != world_size {
            return Err(Error::protocol(format!(
                "the bootstrap's all-gather returned {} entries for a {world_size}-rank job: its all_gather must \
                 return one entry per rank",
                gathered.len()
            )));
        }
        let mut endpoints = Vec::with_capacity(world_size);
        let mut hosts = Vec::with_capacity(world_size);
        for (r, bytes) in gathered.iter().enumerate() {
            let (host, table) = endpoints::decode(bytes, r)?;
            hosts.push(host);
            endpoints.push(table);
        }

        let mut routes = vec![Vec::new(); world_size];
        for (peer, route) in routes.iter_mut().enumerate().filter(|(p, _)| *p != rank) {
            *route = endpoints::reachable(&backends, &endpoints, rank, peer)?;
        }
        let reach = routes
            .iter()
            .map(|route| PeerReach {
                transports: route.iter().map(|&i| (backends[i].transport(), backends[i].direct_access())).collect(),
            })
            .collect();
        let topology = Topology::new(rank, &hosts, reach);
        crate::crowding::set_local_ranks(bootstrap.local_world_size());
        let comm = Communicator {
            bootstrap,
            config,
            id,
            abort,
            backends,
            endpoints,
            hosts,
            routes,
            topology,
            transport_ranks: (0..world_size).collect(),
            connections: Arc::new(Mutex::new(HashMap::new())),
            next_registration: AtomicU64::new(0),
            next_pair_registration: AtomicU64::new(0),
            next_private_registration: AtomicU64::new(0),
            tokens: Mutex::new(HashMap::new()),
        };
        if tracing::enabled!(target: diagnostics::INIT, tracing::Level::INFO) {
            let routes: Vec<String> = (0..world_size)
                .filter(|&p| p != rank)
                .map(|p| format!("{p}:{}", comm.transport_to(p).map(|t| t.name()).unwrap_or_default()))
                .collect();
            tracing::info!(
                target: diagnostics::INIT,
                rank,
                world_size,
                communicator = id,
                took = ?started.elapsed(),
                "communicator {id} ready; transports to peers {}",
                routes.join(" ")
            );
        }
        Ok(comm)
    }
}

/// A communicator's connections, by the peer's transport rank and the transport.
pub(crate) type Connections = Mutex<HashMap<(usize, Transport), Arc<dyn Connection>>>;

/// A backend that reaches a peer, with that peer's endpoint for it.
pub(crate) type Route<'a> = (&'a Arc<dyn TransportBackend>, &'a [u8]);

/// One rank's handle on a job: transports, registrations, connections, semaphores, channels.
///
/// (Fields marked `pub(crate)` are used by the registration half in `registration.rs`.)
pub struct Communicator {
    pub(crate) bootstrap: Arc<dyn Bootstrap>,
    pub(crate) config: Config,
    pub(crate) id: u64,
    pub(crate) abort: Arc<AtomicBool>,
    pub(crate) backends: Vec<Arc<dyn TransportBackend>>,
    /// Each rank's endpoint for every transport it offers, by rank.
    pub(crate) endpoints: Vec<Vec<(Transport, Vec<u8>)>>,
    /// Each rank's host identity, by rank.
    pub(crate) hosts: Vec<String>,
    /// For each peer, the backends that reach it, best first (empty for this rank).
    pub(crate) routes: Vec<Vec<usize>>,
    pub(crate) topology: Topology,
    /// Rank `r` of this communicator is rank `transport_ranks[r]` of its transports: `r`,
    /// except in a communicator that carried over another's transports (`carry_over.rs`).
    pub(crate) transport_ranks: Vec<usize>,
    /// Connections by the peer's transport rank, shared with the communicators that carry
    /// this one's transports over.
    pub(crate) connections: Arc<Connections>,
    pub(crate) next_registration: AtomicU64,
    pub(crate) next_pair_registration: AtomicU64,
    pub(crate) next_private_registration: AtomicU64,
    pub(crate) tokens: Mutex<HashMap<usize, PeerTokens>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("id", &self.id)
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("transports", &self.backends.iter().map(|b| b.transport().name()).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Drop for Communicator {
    /// Lets every connection finish what this rank posted before anything of the communicator
    /// is released (see [`Connection::finish_before_release`]); an aborted communicator skips
    /// that and goes at once.
    fn drop(&mut self) {
        if self.is_aborted() {
            return;
        }
        let connections: Vec<_> =
            self.connections.lock().unwrap_or_else(PoisonError::into_inner).values().cloned().collect();
        for connection in connections {
            connection.finish_before_release();
        }
    }
}

impl Communicator {
    /// Starts building a communicator over `bootstrap`.
    pub fn builder(bootstrap: impl Bootstrap + 'static) -> CommunicatorBuilder {
        Self::builder_arc(Arc::new(bootstrap))
    }

    /// Starts building a communicator over a shared bootstrap.
    pub fn builder_arc(bootstrap: Arc<dyn Bootstrap>) -> CommunicatorBuilder {
        CommunicatorBuilder { bootstrap, factories: Vec::new(), config: None, cancel: None }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.topology.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.topology.world_size()
    }

    /// The bootstrap, for small control messages.
    pub fn bootstrap(&self) -> &Arc<dyn Bootstrap> {
        &self.bootstrap
    }

    /// The bootstrap as this communicator's exchanges in the middle of a call use it: every
    /// receive, and so every all-gather and barrier, ends with [`Error::Aborted`] once the
    /// communicator is aborted or revoked. Exchanges that must work on a revoked communicator
    /// (shrink, agreement) use [`bootstrap`](Self::bootstrap).
    pub fn abortable_bootstrap(&self) -> AbortableBootstrap<'_> {
        AbortableBootstrap::new(self.bootstrap.as_ref(), &self.abort)
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A number unique to this communicator within the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The abort flag every wait of this communicator checks.
    pub fn abort_flag(&self) -> &Arc<AtomicBool> {
        &self.abort
    }

    /// Makes every current and future wait of this communicator fail with [`Error::Aborted`].
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Release);
    }

    /// True once [`abort`](Self::abort) was called.
    pub fn is_aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Nodes and how each peer is reached (see [`Topology`]).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The preferred transport to `peer` (`None` for this rank itself).
    pub fn transport_to(&self, peer: usize) -> Option<Transport> {
        self.routes.get(peer).and_then(|r| r.first()).map(|&i| self.backends[i].transport())
    }

    /// Every transport that reaches `peer`, best first.
    pub fn transports_to(&self, peer: usize) -> Vec<Transport> {
        self.routes.get(peer).map(|r| r.iter().map(|&i| self.backends[i].transport()).collect()).unwrap_or_default()
    }

    /// The backend of this communicator for transport `t`, if it has one.
    pub fn backend(&self, t: Transport) -> Option<&Arc<dyn TransportBackend>> {
        self.backends.iter().find(|b| b.transport() == t)
    }

    /// The GPU this rank's transports serve ([`TransportBackend::device`]), if one does: the
    /// device its GPU collectives run on.
    pub fn device(&self) -> Option<u32> {
        self.backends.iter().find_map(|b| b.device())
    }

    /// An error unless `peer` is another rank of this communicator.
    pub(crate) fn check_peer_rank(&self, peer: usize) -> Result<()> {
        if peer >= self.world_size() || peer == self.rank() {
            return Err(Error::invalid(format!(
                "rank {peer} is not a peer of rank {} in a {}-rank communicator",
                self.rank(),
                self.world_size()
            )));
        }
        Ok(())
    }

    /// The backends that reach `peer`, best first, with the peer's endpoint for each.
    pub(crate) fn routes_to(&self, peer: usize) -> Result<Vec<Route<'_>>> {
        self.check_peer_rank(peer)?;
        let mut out = Vec::new();
        for &idx in &self.routes[peer] {
            let backend = &self.backends[idx];
            let ep = self.endpoints[peer]
                .iter()
                .find(|(t, _)| *t == backend.transport())
                .map(|(_, e)| e.as_slice())
                .ok_or_else(|| {
                    Error::protocol(format!("rank {peer} has no endpoint for {}", backend.transport().name()))
                })?;
            out.push((backend, ep));
        }
        Ok(out)
    }

    /// The preferred backend to `peer`.
    fn route(&self, peer: usize) -> Result<Route<'_>> {
        self.routes_to(peer)?.into_iter().next().ok_or_else(|| Error::invalid(format!("no route to rank {peer}")))
    }

    /// The connection to `peer` over its preferred transport (built on first use, then shared).
    pub fn connection(&self, peer: usize) -> Result<Arc<dyn Connection>> {
        let t = self.route(peer)?.0.transport();
        self.connection_via(peer, t)
    }

    /// The connection to `peer` over transport `t` (which must reach the peer).
    pub fn connection_via(&self, peer: usize, t: Transport) -> Result<Arc<dyn Connection>> {
        let (backend, ep) = self.routes_to(peer)?.into_iter().find(|(b, _)| b.transport() == t).ok_or_else(|| {
            Error::Unsupported(format!("transport {} does not reach rank {peer} from rank {}", t.name(), self.rank()))
        })?;
        let transport_peer = self.transport_ranks[peer];
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        let c = match conns.get(&(transport_peer, t)) {
            Some(c) => c.clone(),
            None => {
                let connecting = std::time::Instant::now();
                let c = backend.connect(transport_peer, ep)?;
                let rank = self.rank();
                tracing::debug!(target: diagnostics::TRANSPORT, rank, peer, took = ?connecting.elapsed(), "connected to rank {peer} over {}", t.name());
                conns.insert((transport_peer, t), c.clone());
                c
            }
        };
        Ok(self.renumbered(c, peer))
    }

    /// Pairwise: a memory channel from this rank's `local` registration into `remote` (a peer's
    /// registration from [`exchange`](Self::exchange)), with a fresh semaphore. The peer builds
    /// its channel towards this rank at the same point.
    pub fn memory_channel(&self, local: &RegisteredMemory, remote: &RegisteredMemory) -> Result<MemoryChannel> {
        let peer = remote.owner();
        self.check_peer_rank(peer)?;
        let backend = self.backend(remote.transport()).ok_or_else(|| {
            Error::invalid(format!("memory {:?} was not imported by this communicator", remote.label()))
        })?;
        if !backend.direct_access() {
            return Err(Error::Unsupported(format!(
                "rank {peer} is reached through {}, which has no direct memory access; use a port channel",
                backend.transport().name()
            )));
        }
        MemoryChannel::new(self.semaphore(peer)?, local.clone(), remote.clone())
    }

    /// A proxy service bound to this communicator's timeout and abort flag (not started yet:
    /// add channels, then call [`ProxyService::start`]).
    pub fn proxy(&self) -> Result<ProxyService> {
        ProxyService::new(DEFAULT_FIFO_CAPACITY, self.config.timeout, self.abort.clone())
    }

    /// Pairwise: a port channel from this rank's `local` registration into `remote` (a peer's
    /// registration), driven by `proxy`, with a fresh semaphore. Works over any transport,
    /// including those without direct access.
    pub fn port_channel(
        &self,
        proxy: &ProxyService,
        local: &RegisteredMemory,
        remote: &RegisteredMemory,
    ) -> Result<PortChannel> {
        let semaphore = proxy.add_semaphore(self.semaphore(remote.owner())?)?;
        let dst = proxy.add_memory(remote.clone())?;
        let src = proxy.add_memory(local.clone())?;
        PortChannel::new(proxy, semaphore, dst, src)
    }
}

#[cfg(test)]
pub(crate) mod tests;
