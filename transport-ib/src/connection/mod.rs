//! A connection over one RC queue pair: [`write`](Connection::write) is a train of RDMA writes,
//! [`update_and_sync`](Connection::update_and_sync) a flag that the peer's receive queue takes
//! and the peer applies ([`crate::flags`], [`crate::inbound`]) or, with `WEAVE_IB_FLAG=atomic`,
//! a fetch-and-add on the peer's word; [`flush`](Connection::flush) a wait for every completion;
//! [`progress`](Connection::progress) applies the flags the peer sent this rank.
//!
//! **Ordering.** A reliable connection executes a queue pair's requests at the responder in the
//! order they were posted, and a receive completes only once the bytes of every request before
//! it are placed: a flag is stored after the data written ahead of it. For atomics, the
//! InfiniBand specification (1.4, vol. 1, the responder's ordering rules) has the responder
//! execute send, RDMA write and atomic requests in the message order it receives them in, and a
//! request may pass an earlier one only the other way round (a write or send behind an
//! unfinished read or atomic, unless fenced): so a fetch-and-add posted behind the data changes
//! the word after the data is placed. What a CPU polling the word then sees: on an HCA, the
//! data's DMA writes and the atomic's read-modify-write reach memory in that order (PCIe lets
//! neither a write nor a read pass an earlier posted write; no registration here asks for
//! relaxed ordering); in SoftRoCE (`rdma_rxe`) one responder task takes a queue pair's packets
//! in sequence order and copies a write's payload into memory before it takes the next one,
//! the atomic included. Two plain writes, by contrast, have no promised order of placement,
//! which is why a flag is never one.
//!
//! **One operation per small message.** [`write_and_sync`](Connection::write_and_sync) — how a
//! channel link posts a message — sends the data's last write *with* the flag as its immediate
//! (once the word has a slot, see [`crate::flags`]): a message that fits one write is one verbs
//! operation, one packet, one doorbell. Longer data and flags that need a record go as one chain
//! of work requests with one call into the provider. Writes and records of up to the queue
//! pair's inline size travel inside the work request.
//!
//! **Completions.** A post asks for one when it brings the requests posted since the last one
//! to [`SIGNAL_EVERY`], and `flush` asks for one with a write of no bytes if the last post did
//! not; its `wr_id` says how many requests it retires (itself and the unsignaled ones posted
//! before it, which a reliable connection completes in order). Before a post finds the send queue full, and in `flush`,
//! the connection reaps completions, bounded by the communicator's timeout and abort flag; a
//! failed completion (the peer's queue pair is gone, a bad key) is [`Error::PeerLost`] naming
//! the peer, for this call and every later one. `flush` returns once the peer's device has
//! everything; the peer's flags are then stored by its next progress (or its watcher).

mod staged;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use comm_core::connection::{CheckedWrite, Connection};
use comm_core::deadline::Deadline;
use comm_core::memory::{MemoryRegion, RegisteredMemory};
use comm_core::spin::Backoff;
use comm_core::transport::{PeerLiveness, Transport};
use comm_core::{Error, Result};

use crate::chain::{Chain, post_in_chains, split_writes, writes_needed};
use crate::device_sources::{DeviceSource, DeviceSources, device_ordinal};
use crate::flags::{AtomicWords, FlagPath, Outbound, RECORD_BYTES, Record, Signal};
use crate::inbound::Inbound;
use crate::region::{IbRegion, PRIVATE, RecentRegions, RemoteKey, RemoteRegion, SourceRegistrations};
use crate::staging::CopyEngine;
use crate::verbs::{
    CompletionQueue, MAX_CHAIN, Operation, ProtectionDomain, QueuePair, WorkRequest, completion_failure,
    empty_completion,
};
use crate::watcher::Watcher;
use staged::Staging;

/// Requests a connection may have in flight (the send queue's depth).
pub(crate) const SEND_QUEUE_DEPTH: u32 = 128;
/// Requests posted between two that ask for a completion (fewer completions for the device to
/// write and this side to reap); far below the queue's depth, so a post that waits for room
/// always has a completion coming.
const SIGNAL_EVERY: u32 = 32;
/// Bytes of each slot of the record outbox.
const RECORD_SLOT_BYTES: usize = 32;
/// Offset in the record outbox where the read of a flag word lands (atomic flags).
const READ_BACK: usize = 0;
/// Offset in the record outbox where fetch-and-adds put the old value (atomic flags).
const DISCARD: usize = 8;

/// Where a write's source is read from.
enum Source {
    /// Memory the device reads under this local key: host memory, or device memory registered
    /// with the device.
    Key(u32),
    /// Device memory the device cannot read, copied through the staging ring by this engine of
    /// this device.
    Staged(Arc<dyn CopyEngine>, u32),
}

/// One queue pair, the completion queue of its sends and its receiving side, for one peer.
pub(crate) struct Wire {
    pub(crate) qp: Arc<QueuePair>,
    pub(crate) sends: Arc<CompletionQueue>,
    pub(crate) inbound: Arc<Inbound>,
}

struct State {
    wire: Wire,
    /// Requests posted and not yet known complete.
    outstanding: u32,
    /// Requests posted since the last one that asked for a completion.
    unsignaled: u32,
    /// A remote address and key of this connection's last request, where `flush` may aim a
    /// write of no bytes.
    marker: Option<(u64, u32)>,
    /// Records posted: picks each one's slot in the record outbox.
    records: u64,
    /// The slot and last value of each of the peer's words this connection stores into
    /// ([`FlagPath::Immediate`]).
    outbound: Outbound,
    /// The value of each of the peer's words this connection stores into ([`FlagPath::Atomic`]).
    atomic_words: AtomicWords,
    /// The first failure, which breaks the connection for good.
    failed: Option<String>,
    /// Requests posted so far (numbers staged writes, see [`StagedSink`]).
    posted: u64,
    /// Where device memory is staged, once a staged write needed it.
    staging: Option<Staging>,
    /// The regions of the last write, whose keys need not be found again.
    recent: RecentRegions,
}

/// The registrations a connection sends from: host memory other transports allocated, and
/// device memory.
pub(crate) struct Sources {
    pub(crate) host: Arc<SourceRegistrations>,
    pub(crate) device: Arc<DeviceSources>,
}

/// A connection to one peer over InfiniBand or RoCE.
pub struct IbConnection {
    peer: usize,
    state: Mutex<State>,
    inbound: Arc<Inbound>,
    pd: Arc<ProtectionDomain>,
    sources: Sources,
    /// How this connection stores flags (`WEAVE_IB_FLAG`).
    flag_path: FlagPath,
    /// Where records are staged for the device when the queue pair carries none inline (one
    /// slot per request in flight). With [`FlagPath::Atomic`], which sends no records, its
    /// first words take what a read of a flag word returns ([`READ_BACK`]) and the old values
    /// fetch-and-adds return, which nobody reads ([`DISCARD`]).
    record_outbox: IbRegion,
    max_msg_bytes: usize,
    bounds: Bounds,
    /// Kept running while the connection lives.
    _watcher: Arc<Watcher>,
}

/// What bounds a connection's waits: the communicator's timeout and abort flag, and what its
/// bootstrap knows of the peer's liveness (rxe and some fabrics let writes to a vanished queue
/// pair go unanswered instead of failing them, so that is often the first sign).
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    pub(crate) timeout: Duration,
    pub(crate) abort: Arc<AtomicBool>,
    pub(crate) liveness: PeerLiveness,
}

impl std::fmt::Debug for IbConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbConnection").field("peer", &self.peer).field("device", &self.pd.port().device()).finish()
    }
}

impl IbConnection {
    /// A connection over `wire`, already connected to `peer`'s queue pair.
    pub(crate) fn new(
        peer: usize,
        wire: Wire,
        pd: &Arc<ProtectionDomain>,
        sources: Sources,
        bounds: Bounds,
        watcher: &Arc<Watcher>,
    ) -> Result<Self> {
        let record_outbox = IbRegion::new(pd, RECORD_SLOT_BYTES * SEND_QUEUE_DEPTH as usize, PRIVATE)?;
        Ok(IbConnection {
            peer,
            inbound: wire.inbound.clone(),
            state: Mutex::new(State {
                wire,
                outstanding: 0,
                unsignaled: 0,
                marker: None,
                records: 0,
                outbound: Outbound::default(),
                atomic_words: AtomicWords::default(),
                failed: None,
                posted: 0,
                staging: None,
                recent: RecentRegions::default(),
            }),
            pd: pd.clone(),
            sources,
            flag_path: FlagPath::from_env()?,
            record_outbox,
            max_msg_bytes: pd.port().max_msg_bytes(),
            bounds,
            _watcher: watcher.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost(&self, operation: &str, why: &str) -> Error {
        Error::peer_lost(self.peer, operation, why.to_string())
    }

    /// Waits (bounded) for what this connection posted to complete, as the communicator goes;
    /// nothing to wait for once the peer has left (its memory went with it), so a rank that
    /// leaves second says nothing of the one that left first. A failure is the connection's.
    fn finish_unless_peer_left(&self) {
        if self.bounds.liveness.lost(self.peer).is_none() {
            let _ = self.flush();
        }
    }

    /// The peer's registration that `dst` names, checked to belong to this connection's peer.
    fn remote<'a>(&self, dst: &'a RegisteredMemory) -> Result<&'a RemoteRegion> {
        comm_core::connection::peer_region(dst, self.peer, crate::NAME)
    }

    /// What requests into `dst` need of the peer's registration ([`remote`](Self::remote)),
    /// remembered from the last write into the same region.
    fn remote_key(&self, state: &mut State, dst: &RegisteredMemory) -> Result<RemoteKey> {
        if dst.transport_owner() == self.peer
            && let Some(key) = state.recent.destination(dst.region())
        {
            return Ok(key);
        }
        let key = self.remote(dst)?.key();
        state.recent.remember_destination(dst.region(), key);
        Ok(key)
    }

    /// The address of the flag word at `dst[offset]`, an 8-byte aligned word inside it.
    fn flag_word(dst: &RegisteredMemory, remote: RemoteKey, offset: usize, operation: &str) -> Result<u64> {
        dst.check_range(offset, 8)?;
        let addr = remote.addr + offset as u64;
        if !addr.is_multiple_of(8) {
            return Err(Error::invalid(format!(
                "{operation} at offset {offset} of {:?}: the word is not 8-byte aligned",
                dst.label()
            )));
        }
        Ok(addr)
    }

    /// Reaps completions until `done(outstanding)` holds; bounded by the timeout and abort flag.
    fn reap(&self, state: &mut State, operation: &str, done: impl Fn(u32) -> bool) -> Result<()> {
        // The common case, on every post: room already (no completions to clear and poll).
        if state.failed.is_none() && done(state.outstanding) {
            return Ok(());
        }
        let mut deadline: Option<Deadline> = None;
        let mut backoff = Backoff::new();
        let mut completions = [empty_completion(); 16];
        loop {
            if let Some(why) = &state.failed {
                return Err(self.lost(operation, why));
            }
            if done(state.outstanding) {
                return Ok(());
            }
            let n = state.wire.sends.poll(&mut completions)?;
            for wc in &completions[..n] {
                // A successful completion retires the requests its wr_id counts (see the
                // module doc); a failed one breaks the connection, whatever it retires.
                match completion_failure(wc) {
                    None => state.outstanding = state.outstanding.saturating_sub(wc.wr_id() as u32),
                    Some(why) => {
                        state.outstanding = state.outstanding.saturating_sub(1);
                        state.failed.get_or_insert_with(|| {
                            format!("a work request failed on {}: {why}", self.pd.port().device())
                        });
                    }
                }
            }
            if n > 0 {
                backoff.reset();
                continue;
            }
            if self.bounds.abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted(format!("{operation} to rank {} was aborted", self.peer)));
            }
            if let Some(why) = self.bounds.liveness.lost(self.peer) {
                return Err(self.lost(operation, &format!("its bootstrap link ended ({why})")));
            }
            let timeout = self.bounds.timeout;
            if deadline.get_or_insert_with(|| Deadline::after(timeout)).expired() {
                return Err(Error::timeout(format!("{operation} (ib completions)"), Some(self.peer), timeout));
            }
            backoff.snooze();
        }
    }

    /// Posts `requests` (at most [`MAX_CHAIN`]) as one chain once the send queue has room for
    /// them all, the last one signaled if `signal` or if [`SIGNAL_EVERY`] requests went
    /// unsignaled; with `record`, the last request is the send of it, staged here first.
    /// Numbers the signaled request's `wr_id` with the requests it retires.
    /// A post the provider refuses breaks the connection (the peer may have part of it).
    ///
    /// # Safety
    /// As [`QueuePair::post_chain`] (the record's staging slot is this function's business).
    unsafe fn post(
        &self,
        state: &mut State,
        requests: &mut [WorkRequest],
        record: Option<&Record>,
        signal: bool,
        operation: &str,
    ) -> Result<()> {
        let k = requests.len() as u32;
        self.reap(state, operation, |outstanding| outstanding + k <= SEND_QUEUE_DEPTH)?;
        if let (Some(record), Some(last)) = (record, requests.last_mut()) {
            // A slot is used again only SEND_QUEUE_DEPTH records later, by which time at most
            // SEND_QUEUE_DEPTH requests are in flight: its earlier record's send is complete.
            let slot = (state.records % u64::from(SEND_QUEUE_DEPTH)) as usize * RECORD_SLOT_BYTES;
            state.records += 1;
            // SAFETY: slot + RECORD_BYTES lies inside the outbox, which no request in flight
            // reads (above).
            let at = unsafe { self.record_outbox.as_ptr().add(slot) };
            // SAFETY: as above; the outbox is private memory of this connection.
            unsafe { std::ptr::copy_nonoverlapping(record.encode().as_ptr(), at, RECORD_BYTES) };
            last.local = at;
            last.lkey = self.record_outbox.lkey();
        }
        let covered = state.unsignaled + k;
        let signal = signal || covered >= SIGNAL_EVERY;
        if let Some(last) = requests.last_mut() {
            last.signaled = signal;
            last.wr_id = u64::from(covered);
            state.marker = Some((last.remote, last.rkey));
        }
        // SAFETY: forwarded from the caller; the record (if any) is staged above.
        if let Err(e) = unsafe { state.wire.qp.post_chain(requests) } {
            state.failed.get_or_insert_with(|| e.to_string());
            return Err(self.lost(operation, &e.to_string()));
        }
        state.outstanding += k;
        state.posted += u64::from(k);
        state.unsignaled = if signal { 0 } else { covered };
        Ok(())
    }

    /// Where `write`'s source is read from: the local key of host memory or of registered
    /// device memory (remembered from the last write from the same region), or the staging
    /// ring for device memory the device cannot read.
    fn source(&self, state: &mut State, write: &CheckedWrite<'_>) -> Result<Source> {
        let region = write.src.region();
        if let Some(lkey) = state.recent.source(region) {
            return Ok(Source::Key(lkey));
        }
        let lkey = match device_ordinal(region.as_ref()) {
            None => self.sources.host.lkey(&self.pd, region)?,
            Some(ordinal) => match self.sources.device.source(&self.pd, region, ordinal)? {
                DeviceSource::Registered(lkey) => lkey,
                DeviceSource::Staged(engine, ordinal) => return Ok(Source::Staged(engine, ordinal)),
            },
        };
        state.recent.remember_source(region, lkey);
        Ok(Source::Key(lkey))
    }

    /// Posts the RDMA writes of `write` (its source read under `lkey`, its destination the
    /// peer's `remote`), a chain at a time: nothing allocated, one provider call per chain.
    fn write_locked(&self, state: &mut State, write: &CheckedWrite<'_>, lkey: u32, remote: RemoteKey) -> Result<()> {
        post_in_chains(split_writes(write, lkey, remote, self.max_msg_bytes), |chain| {
            // SAFETY: the source lies inside a registration that outlives the request (the
            // backend keeps source registrations with their regions; the caller keeps the bytes
            // unchanged until the peer acknowledges them, as every connection requires), and the
            // remote range lies inside the peer's registration (checked against its length).
            unsafe { self.post(state, chain, None, false, "ib write") }
        })
    }

    /// Posts `requests` (writes into the peer's region `remote`, at most `MAX_CHAIN - 1`) and
    /// the store of `value` into its word at `flag_offset` (at `addr`, see
    /// [`flag_word`](Self::flag_word)) behind them.
    ///
    /// # Safety
    /// As [`QueuePair::post_chain`] for the writes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sync(
        &self,
        state: &mut State,
        requests: &mut Chain,
        remote: RemoteKey,
        flag_offset: usize,
        addr: u64,
        value: u64,
        operation: &str,
    ) -> Result<()> {
        // Room first: once the flag table has counted this store, the post must happen (or
        // the connection break), else the two ends' views of the word would part.
        let k = requests.len() as u32 + 1;
        self.reap(state, operation, |outstanding| outstanding + k <= SEND_QUEUE_DEPTH)?;
        if self.flag_path == FlagPath::Atomic {
            // SAFETY: forwarded from the caller.
            return unsafe {
                self.sync_atomic(state, requests, (remote.id, flag_offset as u64), addr, remote.rkey, value, operation)
            };
        }
        let signal = state.outbound.signal(remote.id, flag_offset as u64, value);
        let flag_alone = WorkRequest {
            wr_id: 0,
            op: Operation::Write,
            local: std::ptr::null(),
            len: 0,
            lkey: 0,
            remote: addr,
            rkey: remote.rkey,
            signaled: false,
        };
        let (pushed, record) = match signal {
            Signal::Immediate(imm) => match requests.as_mut_slice().last_mut() {
                Some(last) => {
                    last.op = Operation::WriteWithImm(imm);
                    (true, None)
                }
                None => (requests.push(WorkRequest { op: Operation::WriteWithImm(imm), ..flag_alone }), None),
            },
            Signal::Record(record) => (
                requests.push(WorkRequest { op: Operation::Send, len: RECORD_BYTES as u32, ..flag_alone }),
                Some(record),
            ),
        };
        if !pushed {
            // The callers leave room for the flag; this would be a bug here, not the user's.
            return Err(Error::invalid(format!("{operation}: no room left in the chain for the flag")));
        }
        // SAFETY: forwarded from the caller for the writes; a flag alone reads no memory.
        unsafe { self.post(state, requests.as_mut_slice(), record.as_ref(), false, operation) }
    }
}

impl IbConnection {
    /// [`sync`](Self::sync) with [`FlagPath::Atomic`]: `requests` and a fetch-and-add behind
    /// them that takes the word `word` (region, offset) at `addr` to `value`. The first store
    /// into a word reads it first.
    ///
    /// # Safety
    /// As [`QueuePair::post_chain`] for the writes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sync_atomic(
        &self,
        state: &mut State,
        requests: &mut Chain,
        word: (u32, u64),
        addr: u64,
        rkey: u32,
        value: u64,
        operation: &str,
    ) -> Result<()> {
        // Once the table counts the store (below), the post happens or the connection breaks.
        let addend = match state.atomic_words.addend(word.0, word.1, value) {
            Some(addend) => addend,
            None => {
                let current = self.read_word(state, addr, rkey, operation)?;
                state.atomic_words.learn(word.0, word.1, value);
                value.wrapping_sub(current)
            }
        };
        let add = WorkRequest {
            wr_id: 0,
            op: Operation::FetchAdd(addend),
            // SAFETY: DISCARD + 8 lies inside the outbox.
            local: unsafe { self.record_outbox.as_ptr().add(DISCARD) },
            len: 8,
            lkey: self.record_outbox.lkey(),
            remote: addr,
            rkey,
            signaled: false,
        };
        if !requests.push(add) {
            // The callers leave room for the flag; this would be a bug here, not the user's.
            return Err(Error::invalid(format!("{operation}: no room left in the chain for the flag")));
        }
        // SAFETY: forwarded from the caller for the writes; the fetch-and-add's old value lands
        // in the outbox, which lives as long as the connection.
        unsafe { self.post(state, requests.as_mut_slice(), None, false, operation) }
    }

    /// The peer's word at `addr` as its memory holds it, by an RDMA read waited for (with every
    /// request before it).
    fn read_word(&self, state: &mut State, addr: u64, rkey: u32, operation: &str) -> Result<u64> {
        // SAFETY: READ_BACK + 8 lies inside the outbox.
        let at = unsafe { self.record_outbox.as_ptr().add(READ_BACK) };
        let mut read = [WorkRequest {
            wr_id: 0,
            op: Operation::Read,
            local: at,
            len: 8,
            lkey: self.record_outbox.lkey(),
            remote: addr,
            rkey,
            signaled: true,
        }];
        // SAFETY: the read lands in the outbox, private memory of this connection that no other
        // request in flight touches (reads are waited for here, one at a time).
        unsafe { self.post(state, &mut read, None, true, operation)? };
        self.reap(state, operation, |outstanding| outstanding == 0)?;
        // SAFETY: 8 bytes inside the outbox (64-byte aligned memory, READ_BACK is a multiple of
        // 8), which the device wrote before the read's completion was reaped above.
        Ok(unsafe { std::ptr::read_volatile(at.cast::<u64>()) })
    }
}

impl Connection for IbConnection {
    fn transport(&self) -> Transport {
        crate::transport()
    }

    fn peer(&self) -> usize {
        self.peer
    }

    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<()> {
        let mut state = self.lock();
        let source = self.source(&mut state, &write)?;
        let remote = self.remote_key(&mut state, write.dst)?;
        match source {
            Source::Key(lkey) => self.write_locked(&mut state, &write, lkey, remote),
            Source::Staged(engine, ordinal) => self.write_staged(&mut state, &write, remote, engine.as_ref(), ordinal),
        }
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        const OPERATION: &str = "ib update_and_sync";
        let mut state = self.lock();
        let remote = self.remote_key(&mut state, dst)?;
        let addr = Self::flag_word(dst, remote, dst_offset, OPERATION)?;
        // SAFETY: no writes: the flag alone.
        unsafe { self.sync(&mut state, &mut Chain::new(), remote, dst_offset, addr, value, OPERATION) }
    }

    fn write_and_sync(&self, write: CheckedWrite<'_>, flag_offset: usize, value: u64) -> Result<()> {
        const OPERATION: &str = "ib write_and_sync";
        let mut state = self.lock();
        let source = self.source(&mut state, &write)?;
        let remote = self.remote_key(&mut state, write.dst)?;
        let addr = Self::flag_word(write.dst, remote, flag_offset, OPERATION)?;
        let mut requests = Chain::new();
        match source {
            // The writes may take all but the chain's last place: that is the flag's.
            Source::Key(lkey) if writes_needed(write.len, self.max_msg_bytes) < MAX_CHAIN => {
                for request in split_writes(&write, lkey, remote, self.max_msg_bytes) {
                    requests.push(request);
                }
            }
            // Too long for one chain: the writes first, then the flag alone.
            Source::Key(lkey) => self.write_locked(&mut state, &write, lkey, remote)?,
            // The staged writes first, then the flag alone: ordered behind them on the queue.
            Source::Staged(engine, ordinal) => {
                self.write_staged(&mut state, &write, remote, engine.as_ref(), ordinal)?;
            }
        }
        // SAFETY: as in `write_locked` for the writes.
        unsafe { self.sync(&mut state, &mut requests, remote, flag_offset, addr, value, OPERATION) }
    }

    fn flush(&self) -> Result<()> {
        let mut state = self.lock();
        if let Some((remote, rkey)) = state.marker.filter(|_| state.unsignaled > 0 && state.failed.is_none()) {
            // The last requests asked for no completion: one more that does, and moves nothing.
            let mut marker = [WorkRequest {
                wr_id: 0,
                op: Operation::Write,
                local: std::ptr::null(),
                len: 0,
                lkey: 0,
                remote,
                rkey,
                signaled: true,
            }];
            // SAFETY: a write of no bytes reads and writes no memory.
            unsafe { self.post(&mut state, &mut marker, None, true, "ib flush")? };
        }
        self.reap(&mut state, "ib flush", |outstanding| outstanding == 0)
    }

    fn progress(&self) -> Result<()> {
        self.inbound.progress()
    }

    fn check_peer(&self) -> Result<()> {
        if let Some(why) = &self.lock().failed {
            return Err(self.lost("ib check", why));
        }
        if let Some(why) = self.inbound.failure() {
            return Err(self.lost("ib check", why));
        }
        match self.bounds.liveness.lost(self.peer) {
            Some(why) => {
                // The peer flushed its writes before it closed its bootstrap: what it sent is
                // here, and a waiter's last look must find it applied (see `drain_all`).
                self.inbound.drain_all()?;
                Err(self.lost("ib check", &format!("its bootstrap link ended ({why})")))
            }
            None => Ok(()),
        }
    }

    fn finish_before_release(&self) {
        self.finish_unless_peer_left();
    }
}

impl Drop for IbConnection {
    fn drop(&mut self) {
        // The device may still read sources and records: let it finish (bounded) before the
        // queue pair and the registrations go.
        self.finish_unless_peer_left();
    }
}
