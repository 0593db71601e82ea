//! The communicator: one rank's view of a job. It owns the bootstrap and the transports, picks
//! a transport for each peer, registers and exchanges memory, and builds connections,
//! semaphores and channels.
//!
//! Setup calls are collective (every rank calls them in the same order) or pairwise (both ranks
//! of a pair call them in the same order). Divergence is detected where it can be — a
//! registration exchanged out of order gives [`Error::RegistrationMismatch`] on every rank —
//! and every wait is bounded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::bootstrap::{Bootstrap, RESERVED_TAG_BASE};
use crate::config::{Config, LogLevel};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::fifo::DEFAULT_FIFO_CAPACITY;
use crate::memory::{MemoryDescriptor, MemoryKind, MemoryRegion, RegisteredMemory};
use crate::memory_channel::MemoryChannel;
use crate::port_channel::PortChannel;
use crate::proxy::ProxyService;
use crate::semaphore::{HostSemaphore, Token};
use crate::topology::{PeerReach, Topology};
use crate::transport::{Transport, TransportBackend, TransportContext, TransportFactory};
use crate::wire::{Decoder, Encoder};

/// Tag of a pairwise memory exchange (token pools, [`Communicator::exchange_pair`]).
const TAG_PAIR_MEMORY: u64 = RESERVED_TAG_BASE | 0x100;
/// Tag of a pairwise memory exchange's acknowledgement.
const TAG_PAIR_MEMORY_ACK: u64 = RESERVED_TAG_BASE | 0x101;
/// Registration numbers of pairwise exchanges (apart from the collective ones).
const PAIR_SEQ_BASE: u64 = 1 << 62;
/// Registration numbers of private registrations.
const PRIVATE_SEQ_BASE: u64 = 1 << 61;
/// Tag of the pairwise semaphore handshake.
const TAG_SEMAPHORE: u64 = RESERVED_TAG_BASE | 0x102;

/// Bytes between two semaphore tokens (one cache line each, so waiters do not share lines).
const TOKEN_STRIDE: usize = 64;
/// Tokens in one pool (one page).
const TOKENS_PER_POOL: usize = 64;

const ENDPOINTS_MAGIC: [u8; 4] = *b"WVEP";
const STATUS_MAGIC: [u8; 4] = *b"WVST";
const SEMAPHORE_MAGIC: [u8; 4] = *b"WVSM";
const WIRE_VERSION: u16 = 2;

fn next_communicator_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Builds a [`Communicator`] from a bootstrap and the transports to use.
pub struct CommunicatorBuilder {
    bootstrap: Arc<dyn Bootstrap>,
    factories: Vec<Arc<dyn TransportFactory>>,
    config: Option<Config>,
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

    /// Collective: opens the transports, exchanges endpoints with every rank, and picks a
    /// transport for each peer.
    pub fn build(self) -> Result<Communicator> {
        let config = match self.config {
            Some(c) => c,
            None => Config::from_env()?,
        };
        let bootstrap = self.bootstrap;
        let (rank, world_size) = (bootstrap.rank(), bootstrap.world_size());
        let id = next_communicator_id();
        let abort = Arc::new(AtomicBool::new(false));
        let ctx = TransportContext {
            rank,
            world_size,
            job_key: bootstrap.job_key(),
            communicator_id: id,
            config: config.clone(),
            abort: abort.clone(),
        };
        let allowed = config.transports.unwrap_or(Transport::all());
        let mut backends: Vec<Arc<dyn TransportBackend>> = Vec::new();
        for f in &self.factories {
            let t = f.transport();
            if !allowed.contains(t) {
                continue;
            }
            if backends.iter().any(|b| b.transport() == t) {
                return Err(Error::invalid(format!("transport {} was added twice", t.name())));
            }
            match f.open(&ctx) {
                Ok(b) => backends.push(b),
                Err(e) => {
                    // Expected on machines without the hardware (no GPU for cudaipc): info, not warn.
                    if config.logs(LogLevel::Info) {
                        eprintln!("weave[{rank}]: transport {} is not available here: {e}", t.name());
                    }
                }
            }
        }
        if backends.is_empty() {
            return Err(Error::invalid(format!(
                "no transport is available (builder had {}, WEAVE_TRANSPORTS allows {}); add one with with_transport",
                self.factories.iter().map(|f| f.transport().name()).collect::<Vec<_>>().join(","),
                allowed.name()
            )));
        }

        let host = crate::host::host_identity(config.host_id.as_deref());
        let mut e = Encoder::new(ENDPOINTS_MAGIC, WIRE_VERSION);
        e.u32(rank as u32).str(&host).u8(backends.len() as u8);
        for b in &backends {
            e.u32(b.transport().bits()).bytes(&b.local_endpoint()?);
        }
        let gathered = bootstrap.all_gather(&e.finish())?;
        let mut endpoints = Vec::with_capacity(world_size);
        let mut hosts = Vec::with_capacity(world_size);
        for (r, bytes) in gathered.iter().enumerate() {
            let (host, table) = decode_endpoints(bytes, r)?;
            hosts.push(host);
            endpoints.push(table);
        }

        let mut routes = vec![Vec::new(); world_size];
        for (peer, route) in routes.iter_mut().enumerate().filter(|(p, _)| *p != rank) {
            *route = reachable(&backends, &endpoints, rank, peer)?;
        }
        let reach = routes
            .iter()
            .map(|route| PeerReach {
                transports: route.iter().map(|&i| (backends[i].transport(), backends[i].direct_access())).collect(),
            })
            .collect();
        let topology = Topology::new(rank, &hosts, reach);
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        crate::spin::set_oversubscribed(bootstrap.local_world_size() > cores);
        let comm = Communicator {
            bootstrap,
            config,
            id,
            abort,
            backends,
            endpoints,
            routes,
            topology,
            connections: Mutex::new(HashMap::new()),
            next_registration: AtomicU64::new(0),
            next_pair_registration: AtomicU64::new(0),
            next_private_registration: AtomicU64::new(0),
            tokens: Mutex::new(HashMap::new()),
        };
        if comm.config.logs(LogLevel::Info) {
            let routes: Vec<String> = (0..world_size)
                .filter(|&p| p != rank)
                .map(|p| format!("{p}:{}", comm.transport_to(p).map(|t| t.name()).unwrap_or_default()))
                .collect();
            eprintln!("weave[{rank}]: communicator {id} ready; transports to peers {}", routes.join(" "));
        }
        Ok(comm)
    }
}

/// A rank's host identity and its (transport, endpoint) list.
type EndpointTable = (String, Vec<(Transport, Vec<u8>)>);

fn decode_endpoints(bytes: &[u8], from: usize) -> Result<EndpointTable> {
    let mut d = Decoder::new(bytes, ENDPOINTS_MAGIC, WIRE_VERSION, "endpoint table")?;
    let r = d.u32()? as usize;
    if r != from {
        return Err(Error::protocol(format!("endpoint table from rank {from} claims to be rank {r}")));
    }
    let host = d.str()?;
    if host.len() > crate::host::MAX_HOST_ID_LEN {
        return Err(Error::protocol(format!("endpoint table from rank {from}: host identity of {} bytes", host.len())));
    }
    let host = host.to_string();
    let n = d.u8()?;
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let bits = d.u32()?;
        let t = Transport::from_bits(bits)
            .filter(|t| t.bits().count_ones() == 1)
            .ok_or_else(|| Error::protocol(format!("endpoint table from rank {from}: bad transport {bits:#x}")))?;
        out.push((t, d.bytes()?.to_vec()));
    }
    d.finish()?;
    Ok((host, out))
}

/// The transports that reach between `me` and `peer`, best first: those both ranks offer and
/// whose `can_reach` holds, in the lower rank's preference order. Both ranks compute the same
/// list.
fn reachable(
    backends: &[Arc<dyn TransportBackend>],
    endpoints: &[Vec<(Transport, Vec<u8>)>],
    me: usize,
    peer: usize,
) -> Result<Vec<usize>> {
    let lower = me.min(peer);
    let mut out = Vec::new();
    for (t, _) in &endpoints[lower] {
        let Some(idx) = backends.iter().position(|b| b.transport() == *t) else { continue };
        let mine = endpoints[me].iter().find(|(x, _)| x == t);
        let theirs = endpoints[peer].iter().find(|(x, _)| x == t);
        if let (Some((_, a)), Some((_, b))) = (mine, theirs)
            && backends[idx].can_reach(a, b)?
        {
            out.push(idx);
        }
    }
    if out.is_empty() {
        return Err(Error::Unsupported(format!(
            "no transport reaches rank {peer} from rank {me}: this rank offers {}, rank {peer} offers {}",
            endpoints[me].iter().map(|(t, _)| t.name()).collect::<Vec<_>>().join(","),
            endpoints[peer].iter().map(|(t, _)| t.name()).collect::<Vec<_>>().join(",")
        )));
    }
    Ok(out)
}

/// Host memory a peer can map, with the backend that allocated it.
type HostAllocation<'a> = (&'a Arc<dyn TransportBackend>, Arc<dyn MemoryRegion>);

/// A backend that reaches a peer, with that peer's endpoint for it.
type Route<'a> = (&'a Arc<dyn TransportBackend>, &'a [u8]);

#[derive(Default)]
struct PeerTokens {
    local: Vec<RegisteredMemory>,
    remote: Vec<RegisteredMemory>,
    next: usize,
}

/// One rank's handle on a job: transports, registrations, connections, semaphores, channels.
pub struct Communicator {
    bootstrap: Arc<dyn Bootstrap>,
    config: Config,
    id: u64,
    abort: Arc<AtomicBool>,
    backends: Vec<Arc<dyn TransportBackend>>,
    endpoints: Vec<Vec<(Transport, Vec<u8>)>>,
    /// For each peer, the backends that reach it, best first (empty for this rank).
    routes: Vec<Vec<usize>>,
    topology: Topology,
    connections: Mutex<HashMap<(usize, Transport), Arc<dyn Connection>>>,
    next_registration: AtomicU64,
    next_pair_registration: AtomicU64,
    next_private_registration: AtomicU64,
    tokens: Mutex<HashMap<usize, PeerTokens>>,
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

impl Communicator {
    /// Starts building a communicator over `bootstrap`.
    pub fn builder(bootstrap: impl Bootstrap + 'static) -> CommunicatorBuilder {
        Self::builder_arc(Arc::new(bootstrap))
    }

    /// Starts building a communicator over a shared bootstrap.
    pub fn builder_arc(bootstrap: Arc<dyn Bootstrap>) -> CommunicatorBuilder {
        CommunicatorBuilder { bootstrap, factories: Vec::new(), config: None }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.bootstrap.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.bootstrap.world_size()
    }

    /// The bootstrap, for small control messages.
    pub fn bootstrap(&self) -> &Arc<dyn Bootstrap> {
        &self.bootstrap
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

    fn check_peer_rank(&self, peer: usize) -> Result<()> {
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
    fn routes_to(&self, peer: usize) -> Result<Vec<Route<'_>>> {
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
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = conns.get(&(peer, t)) {
            return Ok(c.clone());
        }
        let c = backend.connect(peer, ep)?;
        conns.insert((peer, t), c.clone());
        Ok(c)
    }

    /// Backends in the order to try for allocating memory that peers will import: those that
    /// reach peers first (most used first), then the rest.
    fn allocation_order(&self) -> Vec<usize> {
        let mut uses = vec![0usize; self.backends.len()];
        for route in &self.routes {
            if let Some(&i) = route.first() {
                uses[i] += 1;
            }
        }
        let mut order: Vec<usize> = (0..self.backends.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(uses[i]));
        order
    }

    fn allocate_region(&self, len: usize, kind: MemoryKind) -> Result<(Arc<dyn MemoryRegion>, Transport)> {
        let mut last = None;
        for i in self.allocation_order() {
            match self.backends[i].allocate(len, kind) {
                Ok(r) => return Ok((r, self.backends[i].transport())),
                Err(Error::Unsupported(m)) => last = Some(m),
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unsupported(format!(
            "no transport of this communicator can allocate {kind:?} memory: {}",
            last.unwrap_or_default()
        )))
    }

    fn describe(
        &self,
        region: &Arc<dyn MemoryRegion>,
        seq: u64,
        len: usize,
        kind: MemoryKind,
        label: &str,
    ) -> Result<MemoryDescriptor> {
        let mut exports = Vec::new();
        for b in &self.backends {
            if let Some(payload) = b.export(region)? {
                exports.push((b.transport(), payload));
            }
        }
        Ok(MemoryDescriptor {
            owner: self.rank(),
            seq,
            digest: MemoryDescriptor::digest_for(seq, label, kind),
            kind,
            len,
            label: label.to_string(),
            exports,
        })
    }

    /// Collective and ordered: allocates `len` bytes of `kind` memory that peers can import,
    /// as this communicator's next registration. Every rank registers in the same order (lengths
    /// may differ); `label` names the buffer in errors and must match across ranks.
    pub fn register(&self, len: usize, kind: MemoryKind, label: &str) -> Result<RegisteredMemory> {
        let seq = self.next_registration.fetch_add(1, Ordering::AcqRel);
        let (region, transport) = self.allocate_region(len, kind)?;
        let descriptor = self.describe(&region, seq, len, kind, label)?;
        Ok(RegisteredMemory::new_local(descriptor, region, transport)?.in_communicator(self.id))
    }

    /// [`register`](Self::register) for host memory.
    pub fn register_host(&self, len: usize, label: &str) -> Result<RegisteredMemory> {
        self.register(len, MemoryKind::Host, label)
    }

    /// Maps a peer's registration through the best transport that reaches the peer and that the
    /// owner exported it through.
    fn import(&self, d: MemoryDescriptor) -> Result<RegisteredMemory> {
        let peer = d.owner;
        let routes = self.routes_to(peer)?;
        let Some((backend, ep, payload)) =
            routes.iter().find_map(|(b, ep)| d.export_for(b.transport()).map(|p| (*b, *ep, p)))
        else {
            return Err(Error::Unsupported(format!(
                "memory {:?} of rank {peer} was exported through {}, none of which reaches it from rank {} ({})",
                d.label,
                d.exports.iter().map(|(t, _)| t.name()).collect::<Vec<_>>().join(","),
                self.rank(),
                routes.iter().map(|(b, _)| b.transport().name()).collect::<Vec<_>>().join(",")
            )));
        };
        let t = backend.transport();
        let region = backend.import(peer, ep, payload, d.len, d.kind)?;
        Ok(RegisteredMemory::new_imported(d, region, t)?.in_communicator(self.id))
    }

    /// Collective: every rank contributes its registration `local` (the same registration step
    /// on every rank); returns every rank's memory indexed by rank (this rank's own at its
    /// index). Fails with [`Error::RegistrationMismatch`] on every rank when ranks are at
    /// different registration steps or labels. After it returns, nothing of the exchange is
    /// left for a killed rank to leak.
    pub fn exchange(&self, local: &RegisteredMemory) -> Result<Vec<RegisteredMemory>> {
        if !local.is_local() || local.owner() != self.rank() || local.communicator_id() != self.id {
            return Err(Error::invalid(format!(
                "exchange needs memory registered by this communicator on this rank; {:?} is not",
                local.label()
            )));
        }
        let mine = local.descriptor();
        let all = self.bootstrap.all_gather(&mine.encode())?;
        let mut descriptors = Vec::with_capacity(all.len());
        for (r, bytes) in all.iter().enumerate() {
            let d = MemoryDescriptor::decode(bytes)?;
            if d.owner != r {
                return Err(Error::protocol(format!("rank {r} sent a descriptor owned by rank {}", d.owner)));
            }
            descriptors.push(d);
        }
        if let Some(other) = descriptors.iter().find(|d| d.seq != mine.seq || d.digest != mine.digest) {
            return Err(Error::RegistrationMismatch(format!(
                "rank {} exchanged {:?} as registration #{} while rank {} exchanged {:?} as registration #{}; \
                 register and exchange in the same order with the same labels on every rank",
                self.rank(),
                mine.label,
                mine.seq,
                other.owner,
                other.label,
                other.seq
            )));
        }
        let mut out = Vec::with_capacity(descriptors.len());
        let mut failure = None;
        for d in descriptors {
            if d.owner == self.rank() {
                out.push(local.clone());
                continue;
            }
            match self.import(d) {
                Ok(m) => out.push(m),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        // Everyone reports whether its imports worked, so that a failure anywhere fails the
        // exchange everywhere promptly instead of leaving ranks waiting.
        let status = encode_status(failure.as_ref());
        let statuses = self.bootstrap.all_gather(&status)?;
        if let Some(e) = failure {
            return Err(e);
        }
        for (r, s) in statuses.iter().enumerate() {
            if let Some(msg) = decode_status(s, r)? {
                return Err(Error::transport(
                    "exchange",
                    format!("rank {r} could not import {:?}: {msg}", local.label()),
                ));
            }
        }
        local.region().seal()?;
        Ok(out)
    }

    /// Pairwise: allocates one token pool, swaps it with `peer` and seals it once the peer has it.
    fn grow_token_pools(&self, peer: usize, tokens: &mut PeerTokens) -> Result<()> {
        let pool = tokens.local.len() as u64;
        let label = format!("semaphore tokens {}<->{} #{pool}", self.rank().min(peer), self.rank().max(peer));
        let (local, remote) = self.swap_host_memory(peer, TOKEN_STRIDE * TOKENS_PER_POOL, u64::MAX - pool, &label)?;
        tokens.local.push(local);
        tokens.remote.push(remote);
        Ok(())
    }

    /// Pairwise: allocates `len` bytes of host memory that `peer` can import, swaps it with the
    /// peer's (which must have the same label and length) and returns (this rank's, the peer's).
    /// Both ranks call it in the same order relative to their other pairwise setups with each
    /// other. Unlike [`register`](Self::register) it takes no collective registration step, so
    /// pairs of ranks may build such memory lazily, in any order across pairs.
    pub fn exchange_pair(&self, peer: usize, len: usize, label: &str) -> Result<(RegisteredMemory, RegisteredMemory)> {
        self.check_peer_rank(peer)?;
        let seq = PAIR_SEQ_BASE | self.next_pair_registration.fetch_add(1, Ordering::AcqRel);
        self.swap_host_memory(peer, len, seq, label)
    }

    /// The exchange behind [`exchange_pair`](Self::exchange_pair) and the token pools: both
    /// sides check label and length, report whether their import worked, and seal their own
    /// memory once the peer has mapped it.
    fn swap_host_memory(
        &self,
        peer: usize,
        len: usize,
        seq: u64,
        label: &str,
    ) -> Result<(RegisteredMemory, RegisteredMemory)> {
        let (backend, region) = self.allocate_host_for(peer, len)?;
        let descriptor = self.describe(&region, seq, len, MemoryKind::Host, label)?;
        let local = RegisteredMemory::new_local(descriptor, region, backend.transport())?.in_communicator(self.id);
        self.bootstrap.send(peer, TAG_PAIR_MEMORY, &local.descriptor().encode())?;
        let theirs = MemoryDescriptor::decode(&self.bootstrap.recv(peer, TAG_PAIR_MEMORY)?)?;
        if theirs.owner != peer || theirs.label != label || theirs.len != len {
            return Err(Error::RegistrationMismatch(format!(
                "rank {peer} sent {:?} (owner {}, {} bytes) while rank {} built {label:?} ({len} bytes)",
                theirs.label,
                theirs.owner,
                theirs.len,
                self.rank()
            )));
        }
        let imported = self.import(theirs);
        self.bootstrap.send(peer, TAG_PAIR_MEMORY_ACK, &encode_status(imported.as_ref().err()))?;
        let ack = self.bootstrap.recv(peer, TAG_PAIR_MEMORY_ACK)?;
        let remote = imported?;
        if let Some(msg) = decode_status(&ack, peer)? {
            return Err(Error::transport(
                backend.transport().name(),
                format!("rank {peer} could not map {label:?}: {msg}"),
            ));
        }
        local.region().seal()?;
        Ok((local, remote))
    }

    /// Local: `len` bytes of `kind` memory registered with this communicator's transports (so a
    /// connection can read it as the source of a write) but never exchanged: no collective
    /// registration step is taken, and no peer maps it.
    pub fn register_private(&self, len: usize, kind: MemoryKind, label: &str) -> Result<RegisteredMemory> {
        let seq = PRIVATE_SEQ_BASE | self.next_private_registration.fetch_add(1, Ordering::AcqRel);
        let (region, transport) = self.allocate_region(len, kind)?;
        let descriptor = self.describe(&region, seq, len, kind, label)?;
        Ok(RegisteredMemory::new_local(descriptor, region, transport)?.in_communicator(self.id))
    }

    /// Host memory that `peer` can map: from the first transport reaching it that allocates
    /// host memory (e.g. shared memory when the preferred transport is CUDA IPC).
    fn allocate_host_for(&self, peer: usize, len: usize) -> Result<HostAllocation<'_>> {
        let mut why = Vec::new();
        for (backend, _) in self.routes_to(peer)? {
            match backend.allocate(len, MemoryKind::Host) {
                Ok(region) => return Ok((backend, region)),
                Err(Error::Unsupported(m)) => why.push(m),
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unsupported(format!(
            "no transport reaching rank {peer} can allocate host memory for semaphores: {}",
            why.join("; ")
        )))
    }

    /// Pairwise: a host semaphore with `peer`. Both ranks call it, in the same order relative to
    /// their other semaphores with each other; the k-th semaphore on one side pairs with the
    /// k-th on the other.
    pub fn semaphore(&self, peer: usize) -> Result<Arc<HostSemaphore>> {
        self.check_peer_rank(peer)?;
        let mut all = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let tokens = all.entry(peer).or_default();
        let slot = tokens.next;
        if slot / TOKENS_PER_POOL >= tokens.local.len() {
            self.grow_token_pools(peer, tokens)?;
        }
        let hello = Encoder::new(SEMAPHORE_MAGIC, WIRE_VERSION).u64(slot as u64).finish();
        self.bootstrap.send(peer, TAG_SEMAPHORE, &hello)?;
        let reply = self.bootstrap.recv(peer, TAG_SEMAPHORE)?;
        let mut d = Decoder::new(&reply, SEMAPHORE_MAGIC, WIRE_VERSION, "semaphore handshake")?;
        let their_slot = d.u64()?;
        d.finish()?;
        if their_slot != slot as u64 {
            return Err(Error::RegistrationMismatch(format!(
                "rank {} is building its semaphore #{slot} with rank {peer}, which is building #{their_slot}",
                self.rank()
            )));
        }
        let (pool, offset) = (slot / TOKENS_PER_POOL, (slot % TOKENS_PER_POOL) * TOKEN_STRIDE);
        // Signal through the transport that maps the peer's token pool.
        let connection = self.connection_via(peer, tokens.remote[pool].transport())?;
        let inbound = Token { memory: tokens.local[pool].clone(), offset };
        let remote = Token { memory: tokens.remote[pool].clone(), offset };
        let semaphore = HostSemaphore::new(connection, inbound, remote, self.config.timeout, self.abort.clone())?;
        tokens.next += 1;
        Ok(Arc::new(semaphore))
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
        proxy.port_channel(semaphore, dst, src)
    }
}

fn encode_status(err: Option<&Error>) -> Vec<u8> {
    let mut e = Encoder::new(STATUS_MAGIC, WIRE_VERSION);
    match err {
        None => e.u8(0),
        Some(err) => e.u8(1).str(&err.to_string()),
    };
    e.finish()
}

fn decode_status(bytes: &[u8], from: usize) -> Result<Option<String>> {
    let mut d = Decoder::new(bytes, STATUS_MAGIC, WIRE_VERSION, "status")?;
    let out = match d.u8()? {
        0 => None,
        1 => Some(d.str()?.to_string()),
        x => return Err(Error::protocol(format!("status from rank {from}: unknown code {x}"))),
    };
    d.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback::{LoopbackBootstrap, LoopbackTransport};
    use std::time::Duration;

    fn run<F>(n: usize, f: F)
    where
        F: Fn(Communicator) + Sync,
    {
        run_with(n, Duration::from_secs(5), f)
    }

    fn run_with<F>(n: usize, timeout: Duration, f: F)
    where
        F: Fn(Communicator) + Sync,
    {
        let group = LoopbackBootstrap::group(n, timeout);
        let config = Config { timeout, ..Config::default() };
        std::thread::scope(|s| {
            for b in group {
                let (f, config) = (&f, config.clone());
                s.spawn(move || {
                    let comm =
                        Communicator::builder(b).with_transport(LoopbackTransport).with_config(config).build().unwrap();
                    f(comm)
                });
            }
        });
    }

    #[test]
    fn exchange_and_memory_channels_between_all_pairs() {
        for n in [1, 2, 3, 4] {
            run(n, |comm| {
                let me = comm.rank();
                let n = comm.world_size();
                let buf = comm.register_host(64 * n, "buf").unwrap();
                let all = comm.exchange(&buf).unwrap();
                assert_eq!(all.len(), n);
                let channels: Vec<_> =
                    (0..n).filter(|&p| p != me).map(|p| comm.memory_channel(&buf, &all[p]).unwrap()).collect();
                buf.write_bytes(64 * me, &[me as u8 + 1; 64]).unwrap();
                for ch in &channels {
                    ch.put_with_signal(64 * me, 64 * me, 64).unwrap();
                }
                for ch in &channels {
                    ch.wait().unwrap();
                }
                for p in (0..n).filter(|&p| p != me) {
                    let mut got = [0u8; 64];
                    buf.read_bytes(64 * p, &mut got).unwrap();
                    assert_eq!(got, [p as u8 + 1; 64], "rank {me} slot of {p}");
                }
            });
        }
    }

    #[test]
    fn many_semaphores_span_several_pools() {
        run(2, |comm| {
            let peer = 1 - comm.rank();
            let sems: Vec<_> = (0..TOKENS_PER_POOL + 5).map(|_| comm.semaphore(peer).unwrap()).collect();
            for (i, s) in sems.iter().enumerate() {
                if (i + comm.rank()) % 2 == 0 {
                    s.signal().unwrap();
                    s.wait().unwrap();
                } else {
                    s.wait().unwrap();
                    s.signal().unwrap();
                }
            }
        });
    }

    #[test]
    fn registration_order_mismatch_is_reported_on_every_rank() {
        run(2, |comm| {
            let (a, b) = if comm.rank() == 0 { ("a", "b") } else { ("b", "a") };
            let m = comm.register_host(128, a).unwrap();
            let _n = comm.register_host(128, b).unwrap();
            let r = comm.exchange(&m);
            assert!(matches!(r, Err(Error::RegistrationMismatch(_))), "rank {}: {r:?}", comm.rank());
        });
    }

    #[test]
    fn one_sided_semaphore_setup_times_out_and_bad_peers_are_errors() {
        run_with(2, Duration::from_millis(200), |comm| {
            assert!(matches!(comm.semaphore(comm.rank()), Err(Error::InvalidArgument(_))));
            assert!(matches!(comm.semaphore(7), Err(Error::InvalidArgument(_))));
            if comm.rank() == 1 {
                // Rank 0 never builds its side: rank 1 must get an error, bounded, not a hang.
                let started = std::time::Instant::now();
                let r = comm.semaphore(0);
                assert!(matches!(r, Err(Error::Timeout { peer: Some(0), .. })), "{r:?}");
                assert!(started.elapsed() < Duration::from_secs(3));
                comm.bootstrap().send(0, 1, b"done").unwrap();
            } else {
                let got = (0..20).find_map(|_| comm.bootstrap().recv(1, 1).ok());
                assert_eq!(got.as_deref(), Some(&b"done"[..]));
            }
        });
    }

    #[test]
    fn wait_without_signal_times_out_and_abort_stops_it() {
        let group = LoopbackBootstrap::group(2, Duration::from_secs(10));
        let config = Config { timeout: Duration::from_millis(100), ..Config::default() };
        std::thread::scope(|s| {
            for b in group {
                let config = config.clone();
                s.spawn(move || {
                    let comm =
                        Communicator::builder(b).with_transport(LoopbackTransport).with_config(config).build().unwrap();
                    let sem = comm.semaphore(1 - comm.rank()).unwrap();
                    let r = sem.wait();
                    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
                    comm.abort();
                    assert!(matches!(sem.wait(), Err(Error::Aborted(_))));
                });
            }
        });
    }

    #[test]
    fn port_channels_move_data_through_the_proxy() {
        run(3, |comm| {
            let (me, n) = (comm.rank(), comm.world_size());
            let buf = comm.register_host(4096 * n, "port").unwrap();
            let all = comm.exchange(&buf).unwrap();
            let proxy = comm.proxy().unwrap();
            let channels: Vec<_> =
                (0..n).filter(|&p| p != me).map(|p| comm.port_channel(&proxy, &buf, &all[p]).unwrap()).collect();
            proxy.start(|| Ok(())).unwrap();
            buf.write_bytes(4096 * me, &[me as u8 + 7; 4096]).unwrap();
            for ch in &channels {
                ch.put_with_signal(4096 * me, 4096 * me, 4096).unwrap();
            }
            for ch in &channels {
                ch.flush().unwrap();
                ch.wait().unwrap();
            }
            for p in (0..n).filter(|&p| p != me) {
                let mut got = vec![0u8; 4096];
                buf.read_bytes(4096 * p, &mut got).unwrap();
                assert!(got.iter().all(|&b| b == p as u8 + 7), "rank {me} from {p}");
            }
            assert!(matches!(channels[0].put(4096 * n - 1, 0, 2), Err(Error::InvalidArgument(_))));
        });
    }

    #[test]
    fn writes_past_the_registered_range_are_invalid() {
        run(2, |comm| {
            let buf = comm.register_host(100, "small").unwrap();
            let all = comm.exchange(&buf).unwrap();
            let ch = comm.memory_channel(&buf, &all[1 - comm.rank()]).unwrap();
            assert!(matches!(ch.put(90, 0, 11), Err(Error::InvalidArgument(_))));
            assert!(matches!(ch.put(0, 95, 6), Err(Error::InvalidArgument(_))));
            assert!(matches!(ch.get(usize::MAX, 0, 2), Err(Error::InvalidArgument(_))));
            ch.put(90, 0, 10).unwrap();
        });
    }
}
