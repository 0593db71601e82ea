//! Point-to-point over links: a group of sends and receives progresses all of them together,
//! chunk by chunk, so no order of operations inside a group can deadlock. Operations with one
//! peer in one direction go in the order they were added (the link is a FIFO). A message's
//! header carries its total length and chunk index: mismatched send and receive sizes are
//! reported, never truncated.

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::config::Deadline;
use comm_core::{Error, Result};

use super::ChannelEngine;
use super::link::Header;
use crate::host::P2pOp;

/// Signature of a point-to-point message (no collective uses it).
const P2P_SIGNATURE: u64 = 0x5032_5000_0000_0000;

/// Runs every operation of a group to completion through the links. The timeout applies to
/// periods without progress.
///
/// # Safety
/// Every `Send` pointer valid for `len` reads and every `Recv` pointer for `len` writes until
/// this returns; receive buffers disjoint from each other and from send buffers.
pub(crate) unsafe fn run_group(e: &mut ChannelEngine, core: &CoreCommunicator, ops: &[P2pOp]) -> Result<()> {
    e.check_usable()?;
    // SAFETY: forwarded from the caller.
    let r = unsafe { progress(e, core, ops) };
    r.map_err(|err| e.poison(err))
}

unsafe fn progress(e: &mut ChannelEngine, core: &CoreCommunicator, ops: &[P2pOp]) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let mut peers = Vec::with_capacity(ops.len());
    let mut self_sends = Vec::new();
    let mut self_recvs = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let (peer, is_send) = match *op {
            P2pOp::Send { peer, .. } => (peer, true),
            P2pOp::Recv { peer, .. } => (peer, false),
        };
        if peer >= n {
            return Err(Error::invalid(format!("rank {peer} is not a peer in a {n}-rank communicator")));
        }
        if peer == me {
            if is_send { self_sends.push(i) } else { self_recvs.push(i) }
        } else {
            peers.push(peer);
        }
    }
    if self_sends.len() != self_recvs.len() {
        return Err(Error::invalid(format!(
            "a group sends {} message(s) to this rank itself but receives {}; they must pair up",
            self_sends.len(),
            self_recvs.len()
        )));
    }
    let mut done = vec![0usize; ops.len()];
    let mut finished = vec![false; ops.len()];
    for (&s, &r) in self_sends.iter().zip(&self_recvs) {
        let (P2pOp::Send { data: src, len: a, .. }, P2pOp::Recv { data: dst, len: b, .. }) = (ops[s], ops[r]) else {
            continue;
        };
        if a != b {
            return Err(Error::invalid(format!("send to self of {a} bytes paired with a receive of {b} bytes")));
        }
        // SAFETY: the caller guarantees both ranges; `ptr::copy` tolerates overlap.
        unsafe { std::ptr::copy(src, dst, a) };
        finished[s] = true;
        finished[r] = true;
    }
    peers.sort_unstable();
    peers.dedup();
    e.connect(core, &peers)?;
    let timeout = core.config().timeout;
    let abort = core.abort_flag().clone();
    let mut deadline = Deadline::after(timeout);
    let mut backoff = comm_core::spin::Backoff::new();
    let mut idle: u32 = 0;
    loop {
        let mut progressed = false;
        let mut send_busy = vec![false; n];
        let mut recv_busy = vec![false; n];
        let mut blocked_on = None;
        for (i, op) in ops.iter().enumerate() {
            if finished[i] {
                continue;
            }
            let (peer, busy) = match *op {
                P2pOp::Send { peer, .. } => (peer, &mut send_busy[peer]),
                P2pOp::Recv { peer, .. } => (peer, &mut recv_busy[peer]),
            };
            if std::mem::replace(busy, true) {
                continue; // an earlier operation with this peer, same direction, goes first
            }
            blocked_on.get_or_insert(peer);
            let link = e.link(peer)?;
            let payload = link.payload();
            match *op {
                P2pOp::Send { data, len, .. } => {
                    let chunks = len.div_ceil(payload).max(1);
                    while done[i] < chunks && link.has_credit() {
                        let a = done[i] * payload;
                        let k = (len - a).min(payload);
                        let out = link.outbox("send")?;
                        // SAFETY: data + a is valid for k reads (caller); the outbox slot holds
                        // a full payload.
                        unsafe { std::ptr::copy_nonoverlapping(data.add(a), out, k) };
                        let header = Header {
                            signature: P2P_SIGNATURE,
                            count: len as u64,
                            root: done[i] as u64,
                            len: k as u64,
                            ..Header::default()
                        };
                        link.post(header)?;
                        done[i] += 1;
                        progressed = true;
                    }
                    finished[i] = done[i] == chunks;
                }
                P2pOp::Recv { data, len, .. } => {
                    let chunks = len.div_ceil(payload).max(1);
                    while done[i] < chunks && link.has_message() {
                        let (header, inbox) = link.receive("recv")?;
                        let a = done[i] * payload;
                        let k = (len - a).min(payload);
                        if header.signature != P2P_SIGNATURE {
                            return Err(Error::protocol(format!(
                                "rank {peer} sent a collective's message while rank {me} receives from it; every \
                                 send needs a matching recv before later collectives"
                            )));
                        }
                        if header.count != len as u64 || header.root != done[i] as u64 || header.len != k as u64 {
                            return Err(Error::protocol(format!(
                                "rank {peer} sent a message of {} bytes (chunk {}) while rank {me} receives {len} bytes \
                                 (chunk {}); sizes of matching send and recv must be equal",
                                header.count, header.root, done[i]
                            )));
                        }
                        // SAFETY: the inbox holds k bytes (checked length); data + a is valid for
                        // k writes (caller).
                        unsafe { std::ptr::copy_nonoverlapping(inbox, data.add(a), k) };
                        link.release()?;
                        done[i] += 1;
                        progressed = true;
                    }
                    finished[i] = done[i] == chunks;
                }
            }
        }
        if finished.iter().all(|&f| f) {
            return Ok(());
        }
        if progressed {
            deadline = Deadline::after(timeout);
            idle = 0;
            backoff.reset();
            continue;
        }
        idle = idle.wrapping_add(1);
        backoff.snooze();
        if idle.is_multiple_of(128) {
            if abort.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::Aborted("send/recv was aborted".into()));
            }
            if let Some(peer) = blocked_on {
                e.link(peer)?.check_peer()?;
                if deadline.expired() {
                    return Err(Error::timeout("send/recv progress", Some(peer), deadline.elapsed()));
                }
            }
        }
    }
}
