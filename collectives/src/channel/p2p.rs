//! Point-to-point over links: a group of sends and receives progresses all of them together,
//! chunk by chunk, so no order of operations inside a group can deadlock. Operations with one
//! peer in one direction go in the order they were added (the link is a FIFO). A message's
//! header carries its total length and chunk index: mismatched send and receive sizes are
//! reported, never truncated; and its group's digest, checked before the data is taken
//! (`crate::matching`).

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::{Error, Result};

use super::ChannelEngine;
use super::header::Header;
use crate::call::P2pOp;
use crate::matching::{GroupStamps, Met, PairStamp};
use crate::p2p_progress;

/// Signature of a point-to-point message. A link header carries 32 bits of signature, and every
/// collective's signature (`host::signature`) numbers its collective from 1 in the low byte, so
/// a low byte of 0 is no collective's.
pub(super) const P2P_SIGNATURE: u64 = 0x5032_5000;
const _: () = assert!(P2P_SIGNATURE <= u32::MAX as u64 && P2P_SIGNATURE & 0xff == 0);
/// A point-to-point message's count word: its length in the low 40 bits, the sender group's
/// [`PairStamp::digest`] above; the call word carries the sender's group number.
const COUNT_BITS: u32 = 40;
pub(super) const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Runs every operation of a group to completion through the links. The timeout applies to
/// periods without progress.
///
/// # Safety
/// Every `Send` pointer valid for `len` reads and every `Recv` pointer for `len` writes until
/// this returns; receive buffers disjoint from each other and from send buffers.
pub(crate) unsafe fn run_group(
    e: &mut ChannelEngine,
    core: &CoreCommunicator,
    ops: &[P2pOp],
    stamps: &GroupStamps,
) -> Result<()> {
    e.check_usable()?;
    // SAFETY: forwarded from the caller.
    let r = unsafe { progress(e, core, ops, stamps) };
    r.map_err(|err| e.poison(err))
}

unsafe fn progress(e: &mut ChannelEngine, core: &CoreCommunicator, ops: &[P2pOp], stamps: &GroupStamps) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let mut finished = vec![false; ops.len()];
    // SAFETY: forwarded from the caller.
    unsafe { p2p_progress::start(ops, me, n, &mut finished)? };
    let mut peers: Vec<usize> = ops.iter().map(P2pOp::peer).filter(|&p| p != me).collect();
    peers.sort_unstable();
    peers.dedup();
    e.links.connect(core, e.rank, &peers)?;
    let mut done = vec![0usize; ops.len()];
    let cell = std::cell::RefCell::new(e);
    let advance = |i: usize| -> Result<(bool, bool)> {
        let mut e = cell.borrow_mut();
        let stamp = match ops[i] {
            P2pOp::Send { peer, .. } => stamps.sending_to(peer)?,
            P2pOp::Recv { peer, .. } => stamps.receiving_from(peer)?,
        };
        // SAFETY: forwarded from the caller.
        unsafe { advance(&mut e, ops[i], me, &mut done[i], &stamp) }
    };
    let check_peer = |p: usize| cell.borrow_mut().link(p)?.check_peer();
    p2p_progress::drive(ops, n, &mut finished, core.config().timeout, core.abort_flag(), advance, check_peer)
}

/// Moves what it can of one operation without blocking: (moved something, finished).
///
/// # Safety
/// As [`run_group`] for `op`.
unsafe fn advance(
    e: &mut ChannelEngine,
    op: P2pOp,
    me: usize,
    done: &mut usize,
    stamp: &PairStamp,
) -> Result<(bool, bool)> {
    let link = e.link(op.peer())?;
    let payload = link.payload();
    let chunks = op.len().div_ceil(payload).max(1);
    let mut moved = false;
    match op {
        P2pOp::Send { data, len, .. } => {
            if len as u64 > COUNT_MASK {
                return Err(Error::invalid(format!(
                    "a message of {len} bytes is too large to send (at most 2^40 - 1)"
                )));
            }
            while *done < chunks && link.has_credit() {
                let a = *done * payload;
                let k = (len - a).min(payload);
                let out = link.outbox("send")?;
                // SAFETY: data + a is valid for k reads (caller); the outbox slot holds a full
                // payload.
                unsafe { std::ptr::copy_nonoverlapping(data.add(a), out, k) };
                let header = Header {
                    call: stamp.group,
                    signature: P2P_SIGNATURE,
                    count: len as u64 | u64::from(stamp.digest()) << COUNT_BITS,
                    root: *done as u64,
                    len: k as u64,
                    ..Header::default()
                };
                link.post(header)?;
                *done += 1;
                moved = true;
            }
        }
        P2pOp::Recv { peer, data, len } => {
            while *done < chunks && link.has_message() {
                let (header, inbox) = link.receive("recv")?;
                let a = *done * payload;
                let k = (len - a).min(payload);
                if header.signature != P2P_SIGNATURE {
                    return Err(Error::protocol(format!(
                        "rank {peer} sent a collective's message while rank {me} receives from it; every send needs \
                         a matching recv before later collectives"
                    )));
                }
                let (sent, digest) = (header.count & COUNT_MASK, (header.count >> COUNT_BITS) as u32);
                // The groups first: a message of another group says so, not a size mismatch.
                if header.root == 0 {
                    PairStamp::check_digest(digest, header.call, stamp, Met { peer, me, sent, len })?;
                }
                if sent != len as u64 || header.root != *done as u64 || header.len != k as u64 {
                    return Err(Error::protocol(format!(
                        "rank {peer} sent a message of {sent} bytes (chunk {}) while rank {me} receives {len} bytes \
                         (chunk {}); sizes of matching send and recv must be equal",
                        header.root, *done
                    )));
                }
                // SAFETY: the inbox holds k bytes (checked length); data + a is valid for k
                // writes (caller).
                unsafe { std::ptr::copy_nonoverlapping(inbox, data.add(a), k) };
                link.release()?;
                *done += 1;
                moved = true;
            }
        }
    }
    Ok((moved, *done == chunks))
}
