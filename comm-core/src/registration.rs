//! Memory registration and exchange: the half of [`Communicator`] that allocates memory peers can
//! import and hands it around.
//!
//! * Collective registrations ([`register`](Communicator::register), then
//!   [`exchange`](Communicator::exchange)) are numbered in order; every exchange compares the
//!   number and a digest of label and kind across ranks, so divergence is
//!   [`Error::RegistrationMismatch`] on every rank, and every rank reports whether its imports
//!   worked (a status message, `WVST`) so a failure anywhere fails the exchange everywhere.
//! * Pairwise memory ([`exchange_pair`](Communicator::exchange_pair)) and private registrations
//!   ([`register_private`](Communicator::register_private)) take numbers of their own, apart from
//!   the collective ones.
//! * Host semaphores ([`semaphore`](Communicator::semaphore)) use tokens (one cache line each) in
//!   pools of host memory swapped pairwise; both sides agree on the token index through a
//!   handshake (`WVSM`) before they use it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::bootstrap::{Bootstrap, RESERVED_TAG_BASE};
use crate::communicator::{Communicator, WIRE_VERSION};
use crate::error::{Error, Result};
use crate::memory::{MemoryDescriptor, MemoryKind, MemoryRegion, RegisteredMemory};
use crate::semaphore::{HostSemaphore, POOL_BYTES, PeerTokens};
use crate::transport::{PeerExport, Transport, TransportBackend};
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

/// Magic of the status every rank reports after importing (exchange and pairwise memory).
const STATUS_MAGIC: [u8; 4] = *b"WVST";
/// Magic of the pairwise semaphore handshake.
const SEMAPHORE_MAGIC: [u8; 4] = *b"WVSM";

/// A backend and the memory it allocated for one peer (pairwise exchanges).
type PairAllocation<'a> = (&'a Arc<dyn TransportBackend>, Arc<dyn MemoryRegion>);

impl Communicator {
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
        Ok(MemoryDescriptor::new(self.rank(), seq, label, kind, len, exports))
    }

    /// Collective and ordered: allocates `len` bytes of `kind` memory that peers can import,
    /// as this communicator's next registration. Every rank registers in the same order (lengths
    /// may differ); `label` names the buffer in errors and must match across ranks.
    pub fn register(&self, len: usize, kind: MemoryKind, label: &str) -> Result<RegisteredMemory> {
        let seq = self.next_registration.fetch_add(1, Ordering::AcqRel);
        self.register_new_as(seq, len, kind, label, false)
    }

    /// The number of this rank's next private registration (numbered apart from the collective
    /// ones, which every rank counts alike).
    fn next_private_seq(&self) -> u64 {
        PRIVATE_SEQ_BASE | self.next_private_registration.fetch_add(1, Ordering::AcqRel)
    }

    /// Allocates `len` bytes of `kind` memory as registration `seq`. A `sealed` one gives up its
    /// name at once (no peer will map it), so a killed rank leaves nothing behind.
    fn register_new_as(
        &self,
        seq: u64,
        len: usize,
        kind: MemoryKind,
        label: &str,
        sealed: bool,
    ) -> Result<RegisteredMemory> {
        let (region, transport) = self.allocate_region(len, kind)?;
        let descriptor = self.describe(&region, seq, len, kind, label)?;
        if sealed {
            region.seal()?;
        }
        Ok(RegisteredMemory::new_local(descriptor, region, transport)?
            .in_communicator(self.id, self.transport_ranks[self.rank()]))
    }

    /// Collective and ordered, like [`register`](Self::register), but for `len` bytes of
    /// existing `kind` memory at `address` (the caller keeps it alive and frees it after the
    /// registration and every peer's import are gone): the first transport that can share such
    /// memory registers it. Its [`exchange`](Self::exchange) lets peers map it in place.
    pub fn register_existing(
        &self,
        address: u64,
        len: usize,
        kind: MemoryKind,
        label: &str,
    ) -> Result<RegisteredMemory> {
        let seq = self.next_registration.fetch_add(1, Ordering::AcqRel);
        self.register_existing_as(seq, address, len, kind, label)
    }

    /// Registers existing memory with the first transport that can share it, as registration
    /// number `seq`.
    fn register_existing_as(
        &self,
        seq: u64,
        address: u64,
        len: usize,
        kind: MemoryKind,
        label: &str,
    ) -> Result<RegisteredMemory> {
        let mut last = None;
        for i in self.allocation_order() {
            match self.backends[i].register_existing(address, len, kind) {
                Ok(region) => {
                    let descriptor = self.describe(&region, seq, len, kind, label)?;
                    return Ok(RegisteredMemory::new_local(descriptor, region, self.backends[i].transport())?
                        .in_communicator(self.id, self.transport_ranks[self.rank()]));
                }
                Err(Error::Unsupported(m)) => last = Some(m),
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unsupported(format!(
            "no transport of this communicator can share {kind:?} memory at {address:#x} ({len} bytes): {}",
            last.unwrap_or_default()
        )))
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
        let transport_peer = self.transport_ranks[peer];
        let export = PeerExport { peer: transport_peer, peer_endpoint: ep, payload, len: d.len, kind: d.kind };
        let region = backend.import(export)?;
        Ok(RegisteredMemory::new_imported(d, region, t)?.in_communicator(self.id, transport_peer))
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
        let all = self.abortable_bootstrap().all_gather(&mine.encode())?;
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
        let statuses = self.abortable_bootstrap().all_gather(&status)?;
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
        let pool = tokens.pools() as u64;
        let label = format!("semaphore tokens {}<->{} #{pool}", self.rank().min(peer), self.rank().max(peer));
        let (local, remote) = self.swap_memory(peer, POOL_BYTES, MemoryKind::Host, u64::MAX - pool, &label)?;
        tokens.add_pool(local, remote);
        Ok(())
    }

    /// Pairwise: allocates `len` bytes of host memory that `peer` can import, swaps it with the
    /// peer's (which must have the same label and length) and returns (this rank's, the peer's).
    /// Both ranks call it in the same order relative to their other pairwise setups with each
    /// other. Unlike [`register`](Self::register) it takes no collective registration step, so
    /// pairs of ranks may build such memory lazily, in any order across pairs.
    pub fn exchange_pair(&self, peer: usize, len: usize, label: &str) -> Result<(RegisteredMemory, RegisteredMemory)> {
        self.exchange_pair_of(peer, len, MemoryKind::Host, label)
    }

    /// Whether some transport that reaches `peer` allocates `kind` memory for a pairwise region
    /// ([`exchange_pair_of`](Self::exchange_pair_of)); both ranks of a pair get the same answer.
    pub fn pair_allocates(&self, peer: usize, kind: MemoryKind) -> Result<bool> {
        Ok(self.routes_to(peer)?.iter().any(|(backend, _)| backend.allocates(kind)))
    }

    /// Whether some transport reaching `peer` allocates memory of `kind` and maps what a peer
    /// exports into this process ([`TransportBackend::direct_access`]): whether this rank can
    /// load and store `peer`'s memory of that kind (CUDA IPC, for device memory).
    pub fn pair_maps(&self, peer: usize, kind: MemoryKind) -> Result<bool> {
        Ok(self.routes_to(peer)?.iter().any(|(backend, _)| backend.allocates(kind) && backend.direct_access()))
    }

    /// [`exchange_pair`](Self::exchange_pair) for memory of any `kind` (device memory for GPU
    /// links): allocated by the first transport that reaches `peer` and allocates that kind.
    pub fn exchange_pair_of(
        &self,
        peer: usize,
        len: usize,
        kind: MemoryKind,
        label: &str,
    ) -> Result<(RegisteredMemory, RegisteredMemory)> {
        self.check_peer_rank(peer)?;
        let seq = PAIR_SEQ_BASE | self.next_pair_registration.fetch_add(1, Ordering::AcqRel);
        self.swap_memory(peer, len, kind, seq, label)
    }

    /// The exchange behind [`exchange_pair_of`](Self::exchange_pair_of) and the token pools:
    /// both sides check label and length, report whether their import worked, and seal their
    /// own memory once the peer has mapped it.
    fn swap_memory(
        &self,
        peer: usize,
        len: usize,
        kind: MemoryKind,
        seq: u64,
        label: &str,
    ) -> Result<(RegisteredMemory, RegisteredMemory)> {
        let (backend, region) = self.allocate_for(peer, len, kind)?;
        let descriptor = self.describe(&region, seq, len, kind, label)?;
        let local = RegisteredMemory::new_local(descriptor, region, backend.transport())?
            .in_communicator(self.id, self.transport_ranks[self.rank()]);
        self.bootstrap.send(peer, TAG_PAIR_MEMORY, &local.descriptor().encode())?;
        let theirs = MemoryDescriptor::decode(&self.bootstrap.recv_or_abort(peer, TAG_PAIR_MEMORY, &self.abort)?)?;
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
        let ack = self.bootstrap.recv_or_abort(peer, TAG_PAIR_MEMORY_ACK, &self.abort)?;
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
        let seq = self.next_private_seq();
        self.register_new_as(seq, len, kind, label, true)
    }

    /// Local: registers `len` bytes of existing `kind` memory at `address` (the caller's, which
    /// must outlive the registration and every peer's mapping of it) with the first transport
    /// that can share such memory, as a private registration: no collective step is taken and
    /// nothing is exchanged; peers map it one at a time, when this rank asks
    /// ([`map_at_peer`](Self::map_at_peer)).
    pub fn register_existing_private(
        &self,
        address: u64,
        len: usize,
        kind: MemoryKind,
        label: &str,
    ) -> Result<RegisteredMemory> {
        let seq = self.next_private_seq();
        self.register_existing_as(seq, address, len, kind, label)
    }

    /// The backend that registered `local` (this rank's) and reaches `peer`, with the peer's
    /// endpoint for it.
    fn mapping_route(&self, local: &RegisteredMemory, peer: usize) -> Result<(&Arc<dyn TransportBackend>, &[u8])> {
        if !local.is_local() || local.communicator_id() != self.id {
            return Err(Error::invalid(format!(
                "{:?} is not memory this rank registered with this communicator",
                local.label()
            )));
        }
        self.routes_to(peer)?.into_iter().find(|(b, _)| b.transport() == local.transport()).ok_or_else(|| {
            Error::Unsupported(format!(
                "{:?} was registered through {}, which does not reach rank {peer}",
                local.label(),
                local.transport().name()
            ))
        })
    }

    /// The name of `local`'s mappings at peers: its registration number tagged with this rank
    /// (ranks that share a process ask the same peer, which keys mappings by process).
    fn mapping_key(&self, local: &RegisteredMemory) -> u64 {
        ((self.rank() as u64) << 40) | (local.descriptor().seq & ((1 << 40) - 1))
    }

    /// Pairwise, but only this rank acts: asks `peer` to map `local` (memory this rank
    /// registered, e.g. with [`register_existing_private`](Self::register_existing_private))
    /// into its process now, and returns its address as `peer` sees it (this rank's own
    /// address for `peer` = this rank). The peer's transport answers on its own thread, so the
    /// peer need not be in any call; the mapping stays until
    /// [`unmap_at_peer`](Self::unmap_at_peer) or the peer's communicator ends.
    pub fn map_at_peer(&self, local: &RegisteredMemory, peer: usize) -> Result<u64> {
        if peer == self.rank() {
            return Ok(local.as_ptr() as u64);
        }
        let (backend, ep) = self.mapping_route(local, peer)?;
        backend.map_at_peer(self.transport_ranks[peer], ep, self.mapping_key(local), local.region())
    }

    /// Asks `peer` to drop its mapping of `local` ([`map_at_peer`](Self::map_at_peer)); the
    /// caller makes sure no work of the peer still uses it.
    pub fn unmap_at_peer(&self, local: &RegisteredMemory, peer: usize) -> Result<()> {
        if peer == self.rank() {
            return Ok(());
        }
        let (backend, ep) = self.mapping_route(local, peer)?;
        backend.unmap_at_peer(self.transport_ranks[peer], ep, self.mapping_key(local))
    }

    /// Memory of `kind` that `peer` can map: from the first transport reaching it that
    /// allocates that kind (e.g. shared memory for host memory when the preferred transport is
    /// CUDA IPC).
    fn allocate_for(&self, peer: usize, len: usize, kind: MemoryKind) -> Result<PairAllocation<'_>> {
        let mut why = Vec::new();
        for (backend, _) in self.routes_to(peer)? {
            match backend.allocate(len, kind) {
                Ok(region) => return Ok((backend, region)),
                Err(Error::Unsupported(m)) => why.push(m),
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unsupported(format!(
            "no transport reaching rank {peer} can allocate {kind:?} memory for it: {}",
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
        let slot = tokens.next_slot();
        if tokens.needs_pool() {
            self.grow_token_pools(peer, tokens)?;
        }
        let hello = Encoder::new(SEMAPHORE_MAGIC, WIRE_VERSION).u64(slot as u64).finish();
        self.bootstrap.send(peer, TAG_SEMAPHORE, &hello)?;
        let reply = self.bootstrap.recv_or_abort(peer, TAG_SEMAPHORE, &self.abort)?;
        let mut d = Decoder::new(&reply, SEMAPHORE_MAGIC, WIRE_VERSION, "semaphore handshake")?;
        let their_slot = d.u64()?;
        d.finish()?;
        if their_slot != slot as u64 {
            return Err(Error::RegistrationMismatch(format!(
                "rank {} is building its semaphore #{slot} with rank {peer}, which is building #{their_slot}",
                self.rank()
            )));
        }
        let (inbound, remote) = tokens.next_tokens();
        // Signal through the transport that maps the peer's token pool.
        let connection = self.connection_via(peer, remote.memory.transport())?;
        let semaphore = HostSemaphore::new(connection, inbound, remote, self.config.timeout, self.abort.clone())?;
        tokens.advance();
        Ok(Arc::new(semaphore))
    }
}

pub(crate) fn encode_status(err: Option<&Error>) -> Vec<u8> {
    let mut e = Encoder::new(STATUS_MAGIC, WIRE_VERSION);
    match err {
        None => e.u8(0),
        Some(err) => e.u8(1).str(&err.to_string()),
    };
    e.finish()
}

pub(crate) fn decode_status(bytes: &[u8], from: usize) -> Result<Option<String>> {
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
    use std::time::Duration;

    use super::*;
    use crate::communicator::tests::{run, run_with};
    use crate::config::Config;
    use crate::loopback::{LoopbackBootstrap, LoopbackTransport};

    #[test]
    fn many_semaphores_span_several_pools() {
        run(2, |comm| {
            let peer = 1 - comm.rank();
            let sems: Vec<_> =
                (0..crate::semaphore::TOKENS_PER_POOL + 5).map(|_| comm.semaphore(peer).unwrap()).collect();
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
    fn an_abort_ends_an_exchange_a_peer_never_joins() {
        run_with(2, Duration::from_secs(30), |comm| {
            if comm.rank() == 0 {
                let m = comm.register_host(64, "alone").unwrap();
                let flag = Arc::clone(comm.abort_flag());
                let aborter = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    flag.store(true, Ordering::Release);
                });
                let started = std::time::Instant::now();
                let r = comm.exchange(&m);
                assert!(matches!(r, Err(Error::Aborted(_))), "{r:?}");
                assert!(started.elapsed() < Duration::from_secs(2), "the exchange waited {:?}", started.elapsed());
                aborter.join().unwrap();
                comm.bootstrap().send(1, 1, b"done").unwrap();
            } else {
                // Never joins the exchange; waits for rank 0 to be done with it.
                assert_eq!(comm.bootstrap().recv(0, 1).unwrap(), b"done");
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
}
