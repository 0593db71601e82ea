//! The receiving side of a connection: a ring of posted receives that the peer's flags complete
//! (records and immediates, see [`crate::flags`]), and applying them.
//!
//! A receive completes only once the bytes of every request the peer posted before it are
//! placed here, so a flag is stored after its data. Two kinds of thread apply what arrived, one
//! at a time (a `try_lock`: whoever finds the lock taken leaves the work to its holder):
//! - a rank **waiting** on memory this peer writes, through
//!   [`Connection::progress`](comm_core::connection::Connection::progress) on every spin: the
//!   flag is stored by the very thread that waits for it;
//! - the backend's **watcher** thread ([`crate::watcher`]), for the connections nobody waits on
//!   at the moment (a rank busy elsewhere, a wait that does not make progress).
//!
//! Applied receives are posted again in batches, off the path of the flag that freed them: once
//! [`REPOST_BATCH`] are gathered, by the next poll that finds nothing (the thread would wait
//! then anyway), or at once when [`REPOST_LIMIT`] are gathered. The ring holds at least
//! [`RECEIVES`] minus those and a poll's worth of flags not yet applied; past that the peer's
//! device retries until there is room again.
//!
//! A failed receive (the queue pair broke) or a flag the peer got wrong breaks the connection for
//! good: [`Error::PeerLost`] naming the peer, from then on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};

use comm_core::memory::MemoryRegion;
use comm_core::{Error, Result};
use ibverbs_sys as ffi;

use crate::flags::{InboundSlots, RECORD_BYTES, Record};
use crate::region::{IbRegion, LocalRegions, PRIVATE};
use crate::verbs::{
    CompletionQueue, MAX_CHAIN, ProtectionDomain, QueuePair, ReceiveRequest, completion_failure, empty_completion,
};

/// Receives a connection keeps posted.
pub(crate) const RECEIVES: u32 = 128;
/// Bytes of each receive's buffer (a record, rounded up).
const BUFFER_BYTES: usize = 32;
/// Applied receives gathered before a poll that finds nothing posts them again (one call into
/// the provider for them all).
const REPOST_BATCH: usize = 16;
/// Applied receives posted again at once, found something or not: at most this many of the
/// ring are out of use at a time.
const REPOST_LIMIT: usize = 48;
/// Completions taken per poll.
const POLL_BATCH: usize = 16;

/// The receiving side of the connection to one peer.
pub(crate) struct Inbound {
    peer: usize,
    device: String,
    cq: Arc<CompletionQueue>,
    regions: Arc<LocalRegions>,
    /// Calls of [`progress`](Self::progress): a count that moves tells the watcher that a waiter
    /// drains this connection.
    attended: AtomicU64,
    /// Why the connection broke, once it did.
    failed: OnceLock<String>,
    state: Mutex<State>,
}

struct State {
    /// Declared first: the queue pair (and the receives posted to it) go before the buffers.
    qp: Arc<QueuePair>,
    buffers: IbRegion,
    slots: InboundSlots,
    /// Buffers applied in this drain, to post again.
    repost: Vec<u64>,
    /// Where polled completions land (kept: a poll that finds nothing, which is most of a
    /// waiter's, clears no memory).
    completions: [ffi::ibv_wc; POLL_BATCH],
}

impl Inbound {
    /// The receiving side of `qp` (whose receives complete on `cq`), with every receive posted.
    pub(crate) fn new(
        peer: usize,
        pd: &Arc<ProtectionDomain>,
        qp: &Arc<QueuePair>,
        cq: &Arc<CompletionQueue>,
        regions: &Arc<LocalRegions>,
    ) -> Result<Self> {
        let buffers = IbRegion::new(pd, BUFFER_BYTES * RECEIVES as usize, PRIVATE)?;
        let all: Vec<ReceiveRequest> = (0..u64::from(RECEIVES)).map(|i| receive(&buffers, i)).collect();
        // SAFETY: every buffer lies inside `buffers`, which the state drops after the queue pair.
        unsafe { qp.post_receives(&all)? };
        Ok(Inbound {
            peer,
            device: pd.port().device().to_string(),
            cq: cq.clone(),
            regions: regions.clone(),
            attended: AtomicU64::new(0),
            failed: OnceLock::new(),
            state: Mutex::new(State {
                qp: qp.clone(),
                buffers,
                slots: InboundSlots::default(),
                repost: Vec::with_capacity(REPOST_LIMIT + POLL_BATCH),
                completions: [empty_completion(); POLL_BATCH],
            }),
        })
    }

    /// A waiter's call: applies what arrived unless another thread is at it.
    pub(crate) fn progress(&self) -> Result<()> {
        // A plain store, no locked add: a count lost to two waiters at once still moved.
        self.attended.store(self.attended.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        self.drain()
    }

    /// How often a waiter called [`progress`](Self::progress) so far.
    pub(crate) fn attended(&self) -> u64 {
        self.attended.load(Ordering::Relaxed)
    }

    /// The queue the receives complete on (the watcher arms it).
    pub(crate) fn queue(&self) -> &CompletionQueue {
        &self.cq
    }

    /// Why the connection broke, if it did.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// Applies every flag that arrived, unless another thread holds the lock (it does the work).
    pub(crate) fn drain(&self) -> Result<()> {
        if let Some(why) = self.failure() {
            return Err(self.lost(why));
        }
        match self.state.try_lock() {
            Ok(mut state) => self.apply(&mut state),
            Err(TryLockError::Poisoned(p)) => self.apply(&mut p.into_inner()),
            Err(TryLockError::WouldBlock) => Ok(()),
        }
    }

    /// Applies every flag that arrived, waiting for a thread already at it to finish first: when
    /// this returns, every receive completed so far is applied. A verdict that the peer is gone
    /// comes after this, since the watcher may hold a flag polled but not yet stored — the last
    /// one the peer sent before it went, the very one a waiter needs. The lock is held only
    /// while a drain runs, which never waits.
    pub(crate) fn drain_all(&self) -> Result<()> {
        if let Some(why) = self.failure() {
            return Err(self.lost(why));
        }
        self.apply(&mut self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Drains under the lock; a failure breaks the connection for good.
    fn apply(&self, state: &mut State) -> Result<()> {
        self.drain_locked(state).map_err(|why| self.lost(self.failed.get_or_init(|| why)))
    }

    fn lost(&self, why: &str) -> Error {
        Error::peer_lost(self.peer, "ib receive", why.to_string())
    }

    fn drain_locked(&self, state: &mut State) -> std::result::Result<(), String> {
        loop {
            let n = self.cq.poll(&mut state.completions).map_err(|e| e.to_string())?;
            for i in 0..n {
                let wc = &state.completions[i];
                if let Some(why) = completion_failure(wc) {
                    return Err(format!("a receive failed on {}: {why}", self.device));
                }
                let index = wc.wr_id();
                if index >= u64::from(RECEIVES) {
                    return Err(format!("a receive completed with the unknown id {index}"));
                }
                match wc.opcode() {
                    ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => {
                        let imm = wc.imm_data().ok_or("a write with immediate completed without one")?;
                        state.slots.apply_immediate(u32::from_be(imm))?;
                    }
                    ffi::ibv_wc_opcode::IBV_WC_RECV if wc.len() == RECORD_BYTES => {
                        let mut bytes = [0u8; RECORD_BYTES];
                        // SAFETY: buffer `index` lies inside `buffers` (checked index) and the
                        // device finished writing it before the completion was polled.
                        unsafe {
                            let at = state.buffers.as_ptr().add(index as usize * BUFFER_BYTES);
                            std::ptr::copy_nonoverlapping(at, bytes.as_mut_ptr(), RECORD_BYTES);
                        }
                        let record = Record::decode(&bytes).map_err(|e| e.to_string())?;
                        state.slots.apply_record(&self.regions, record)?;
                    }
                    ffi::ibv_wc_opcode::IBV_WC_RECV => {
                        return Err(format!("a flag record of {} bytes arrived ({RECORD_BYTES} expected)", wc.len()));
                    }
                    op => return Err(format!("a receive completed with the unexpected opcode {op}")),
                }
                state.repost.push(index);
            }
            let gathered = state.repost.len();
            if gathered >= REPOST_LIMIT || (n == 0 && gathered >= REPOST_BATCH) {
                // On the stack, a provider call's worth at a time: a repost allocates nothing.
                for chunk in state.repost.chunks(MAX_CHAIN) {
                    let mut again = [receive(&state.buffers, 0); MAX_CHAIN];
                    for (request, &index) in again.iter_mut().zip(chunk) {
                        *request = receive(&state.buffers, index);
                    }
                    // SAFETY: as in `new`.
                    unsafe { state.qp.post_receives(&again[..chunk.len()]) }.map_err(|e| e.to_string())?;
                }
                state.repost.clear();
            }
            if n < POLL_BATCH {
                return Ok(());
            }
        }
    }
}

/// The receive into buffer `index` of `buffers`.
fn receive(buffers: &IbRegion, index: u64) -> ReceiveRequest {
    ReceiveRequest {
        wr_id: index,
        // SAFETY: index < RECEIVES, so the buffer lies inside `buffers`.
        local: unsafe { buffers.as_ptr().add(index as usize * BUFFER_BYTES) },
        len: BUFFER_BYTES as u32,
        lkey: buffers.lkey(),
    }
}
