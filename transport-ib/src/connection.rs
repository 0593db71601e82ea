//! A connection over one RC queue pair: [`write`](Connection::write) is a train of RDMA writes,
//! [`update_and_sync`](Connection::update_and_sync) an atomic fetch-and-add behind them,
//! [`flush`](Connection::flush) a wait for every completion.
//!
//! **Ordering.** A reliable connection executes a queue pair's requests at the responder in the
//! order they were posted, and an atomic executes only once the writes before it were placed:
//! a flag raised by `update_and_sync` is never seen before the data written ahead of it.
//!
//! **Stores as adds.** Verbs have no remote 8-byte store that is ordered like an atomic, so
//! `update_and_sync(word, v)` adds `v - last` where `last` is the value stored there before
//! through the same imported region (0 for a word not touched yet: the regions start zeroed).
//! The words a peer updates (semaphores, flags, link counters) are written only by that peer, so
//! the sum is `v`.
//!
//! **One post per message.** [`write_and_sync`](Connection::write_and_sync) — how a channel link
//! posts a message — sends the data's writes and the fetch-and-add behind them as one chain of
//! work requests with one call into the provider: one doorbell instead of two, and only the
//! last request asks for a completion.
//!
//! **Completions.** Every request that ends a post asks for one; its `wr_id` says how many
//! requests it retires (itself and the unsignaled ones posted before it, which a reliable
//! connection completes in order). Before a post finds the send queue full, and in `flush`,
//! the connection reaps completions, bounded by the communicator's timeout and abort flag; a
//! failed completion (the peer's queue pair is gone, a bad key) is [`Error::PeerLost`] naming
//! the peer, for this call and every later one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use comm_core::config::Deadline;
use comm_core::connection::{CheckedWrite, Connection};
use comm_core::memory::RegisteredMemory;
use comm_core::spin::Backoff;
use comm_core::transport::{PeerLiveness, Transport};
use comm_core::{Error, Result};

use crate::region::{IbRegion, RemoteRegion, SourceRegistrations};
use crate::verbs::{CompletionQueue, MAX_CHAIN, ProtectionDomain, QueuePair, WorkRequest, empty_completion};

/// Requests a connection may have in flight (the send queue's depth).
pub(crate) const SEND_QUEUE_DEPTH: u32 = 128;

/// One queue pair and its completion queue, connected to a peer.
pub(crate) struct Wire {
    /// Declared first: destroyed before the completion queue it posts to.
    pub(crate) qp: QueuePair,
    pub(crate) cq: CompletionQueue,
}

struct State {
    wire: Wire,
    /// Requests posted and not yet known complete.
    outstanding: u32,
    /// Fetch-and-adds posted: picks each one's slot in `old_values`.
    adds: u64,
    /// The first failed completion, which breaks the connection for good.
    failed: Option<String>,
}

/// A connection to one peer over InfiniBand or RoCE.
pub struct IbConnection {
    peer: usize,
    state: Mutex<State>,
    pd: Arc<ProtectionDomain>,
    sources: Arc<SourceRegistrations>,
    /// Where fetch-and-adds put the old value (8 bytes per request in flight; never read).
    old_values: IbRegion,
    max_msg_bytes: usize,
    bounds: Bounds,
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
        sources: &Arc<SourceRegistrations>,
        bounds: Bounds,
    ) -> Result<Self> {
        let old_values = IbRegion::new(pd, 8 * SEND_QUEUE_DEPTH as usize)?;
        Ok(IbConnection {
            peer,
            state: Mutex::new(State { wire, outstanding: 0, adds: 0, failed: None }),
            pd: pd.clone(),
            sources: sources.clone(),
            old_values,
            max_msg_bytes: pd.port().max_msg_bytes(),
            bounds,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost(&self, operation: &str, why: &str) -> Error {
        Error::peer_lost(self.peer, operation, why.to_string())
    }

    /// The peer's registration that `dst` names, checked to belong to this connection's peer.
    fn remote<'a>(&self, dst: &'a RegisteredMemory) -> Result<&'a RemoteRegion> {
        comm_core::connection::peer_region(dst, self.peer, crate::NAME)
    }

    /// Reaps completions until `done(outstanding)` holds; bounded by the timeout and abort flag.
    fn reap(&self, state: &mut State, operation: &str, done: impl Fn(u32) -> bool) -> Result<()> {
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
            let n = state.wire.cq.poll(&mut completions)?;
            for wc in &completions[..n] {
                // A successful completion retires the requests its wr_id counts (see the
                // module doc); a failed one breaks the connection, whatever it retires.
                let retired = if wc.error().is_none() { u32::try_from(wc.wr_id()).unwrap_or(u32::MAX) } else { 1 };
                state.outstanding = state.outstanding.saturating_sub(retired);
                if let Some((status, vendor)) = wc.error() {
                    // SAFETY: ibv_wc_status_str returns a static C string for any status.
                    let text = unsafe { std::ffi::CStr::from_ptr(ibverbs_sys::ibv_wc_status_str(status)) };
                    state.failed.get_or_insert_with(|| {
                        format!(
                            "a work request failed on {}: {} (vendor error {vendor})",
                            self.pd.port().device(),
                            text.to_string_lossy()
                        )
                    });
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

    /// Posts `requests` (at most [`MAX_CHAIN`], the last one signaled) as one chain once the
    /// send queue has room for them all; numbers each signaled request's `wr_id` with the
    /// requests it retires.
    ///
    /// # Safety
    /// As [`QueuePair::post_chain`].
    unsafe fn post(&self, state: &mut State, requests: &mut [WorkRequest], operation: &str) -> Result<()> {
        let k = requests.len() as u32;
        if !requests.last().is_some_and(|r| r.signaled) {
            return Err(Error::invalid(format!("{operation}: a chain of ib requests must end with a signaled one")));
        }
        self.reap(state, operation, |outstanding| outstanding + k <= SEND_QUEUE_DEPTH)?;
        let mut since_signaled = 0u64;
        for r in requests.iter_mut() {
            since_signaled += 1;
            r.wr_id = if r.signaled { std::mem::take(&mut since_signaled) } else { 0 };
        }
        // SAFETY: forwarded from the caller.
        unsafe { state.wire.qp.post_chain(requests)? };
        state.outstanding += k;
        Ok(())
    }

    /// The fetch-and-add that stores `value` into the word at `dst[dst_offset]` (see the module
    /// doc), and the value to record once it is posted.
    fn add_request(
        &self,
        state: &mut State,
        dst: &RegisteredMemory,
        dst_offset: usize,
        value: u64,
    ) -> Result<WorkRequest> {
        dst.check_range(dst_offset, 8)?;
        let remote = self.remote(dst)?;
        let addr = remote.addr + dst_offset as u64;
        if !addr.is_multiple_of(8) {
            return Err(Error::invalid(format!(
                "ib update_and_sync at offset {dst_offset} of {:?}: the word is not 8-byte aligned",
                dst.label()
            )));
        }
        let slot = (state.adds % u64::from(SEND_QUEUE_DEPTH)) as usize * 8;
        state.adds = state.adds.wrapping_add(1);
        Ok(WorkRequest {
            wr_id: 0,
            // SAFETY: slot + 8 lies inside `old_values` (8 bytes per request in flight).
            local: unsafe { self.old_values_ptr().add(slot) },
            len: 8,
            lkey: self.old_values.lkey(),
            remote: addr,
            rkey: remote.rkey,
            add: Some(value.wrapping_sub(remote.stored(dst_offset))),
            signaled: true,
        })
    }

    /// The RDMA writes of `write`, split at the port's message limit, each signaled or not.
    fn write_requests(&self, write: &CheckedWrite<'_>, signaled: bool) -> Result<Vec<WorkRequest>> {
        let remote = self.remote(write.dst)?;
        let lkey = self.sources.lkey(&self.pd, write.src.region())?;
        let mut requests = Vec::with_capacity(write.len.div_ceil(self.max_msg_bytes.max(1)));
        let mut done = 0;
        while done < write.len {
            let k = (write.len - done).min(self.max_msg_bytes);
            requests.push(WorkRequest {
                wr_id: 0,
                // SAFETY: the source range lies inside `write.src` (checked), mapped here.
                local: unsafe { write.src.as_ptr().add(write.src_offset + done) },
                len: k as u32,
                lkey,
                remote: remote.addr + (write.dst_offset + done) as u64,
                rkey: remote.rkey,
                add: None,
                signaled,
            });
            done += k;
        }
        Ok(requests)
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
        let requests = self.write_requests(&write, true)?;
        let mut state = self.lock();
        for mut request in requests {
            // SAFETY: the source lies inside a registration that outlives the request (the
            // backend keeps source registrations with their regions; the caller keeps the bytes
            // unchanged until the peer acknowledges them, as every connection requires), and the
            // remote range lies inside the peer's registration (checked against its length).
            unsafe { self.post(&mut state, std::slice::from_mut(&mut request), "ib write")? };
        }
        Ok(())
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        let mut state = self.lock();
        let mut request = self.add_request(&mut state, dst, dst_offset, value)?;
        // SAFETY: the old-value slot is registered and lives as long as the connection; the
        // remote word lies inside the peer's registration (checked) and is 8-byte aligned.
        unsafe { self.post(&mut state, std::slice::from_mut(&mut request), "ib update_and_sync")? };
        self.remote(dst)?.record(dst_offset, value);
        Ok(())
    }

    fn write_and_sync(&self, write: CheckedWrite<'_>, flag_offset: usize, value: u64) -> Result<()> {
        let mut requests = self.write_requests(&write, false)?;
        if requests.len() >= MAX_CHAIN {
            // Too long for one chain: the writes one by one, then the flag.
            self.write_checked(write)?;
            return self.update_and_sync(write.dst, flag_offset, value);
        }
        let mut state = self.lock();
        requests.push(self.add_request(&mut state, write.dst, flag_offset, value)?);
        // SAFETY: as in write_checked for the writes and update_and_sync for the add: every
        // local range is registered and outlives its request, every remote range was checked.
        unsafe { self.post(&mut state, &mut requests, "ib write_and_sync")? };
        self.remote(write.dst)?.record(flag_offset, value);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut state = self.lock();
        self.reap(&mut state, "ib flush", |outstanding| outstanding == 0)
    }

    fn check_peer(&self) -> Result<()> {
        if let Some(why) = &self.lock().failed {
            return Err(self.lost("ib check", why));
        }
        match self.bounds.liveness.lost(self.peer) {
            Some(why) => Err(self.lost("ib check", &format!("its bootstrap link ended ({why})"))),
            None => Ok(()),
        }
    }
}

impl IbConnection {
    fn old_values_ptr(&self) -> *mut u8 {
        use comm_core::memory::MemoryRegion;
        self.old_values.as_ptr()
    }
}

impl Drop for IbConnection {
    fn drop(&mut self) {
        // The device may still read sources and write old values: let it finish (bounded)
        // before the queue pair and the registrations go.
        let _ = self.flush();
    }
}
