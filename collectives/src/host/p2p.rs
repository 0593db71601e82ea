//! Host point-to-point: send/recv between two ranks through per-pair mailboxes.
//!
//! Each rank owns, for every peer, two mailbox slots in its shared memory (double buffering).
//! A sender copies a chunk into a free slot and signals the pair's `ready` semaphore; the
//! receiver copies it out and signals `free`. Every chunk starts with a header carrying the
//! message length, so mismatched send/recv sizes are reported, not silently truncated.
//! A group of operations progresses all of them together, so no order of sends and receives
//! inside a group can deadlock.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::memory::RegisteredMemory;
use comm_core::semaphore::HostSemaphore;
use comm_core::{Error, Result};

use crate::group::{self, P2pOp};

/// Bytes of one mailbox slot (header included).
const SLOT_BYTES: usize = 256 << 10;
/// Bytes of the chunk header at the start of a slot.
const HEADER: usize = 64;
/// Payload bytes per chunk.
const CHUNK: usize = SLOT_BYTES - HEADER;

/// The pair state this rank keeps for one peer.
struct PeerLink {
    /// Signalled by this rank when a chunk for the peer is ready; polled for the peer's chunks.
    ready: Arc<HostSemaphore>,
    /// Signalled by this rank when it consumed a peer's chunk; polled for the peer's consumption.
    free: Arc<HostSemaphore>,
    /// The peer's mailbox region (its slots for this rank live there).
    remote: RegisteredMemory,
    sent: u64,
    freed: u64,
    arrived: u64,
    consumed: u64,
}

/// Point-to-point state of one communicator.
pub(crate) struct P2pState {
    rank: usize,
    mine: RegisteredMemory,
    peers: Vec<Option<PeerLink>>,
    abort: Arc<AtomicBool>,
}

/// Chunks a message of `len` bytes takes (at least one: an empty message still says its
/// length).
fn chunks(len: usize) -> u64 {
    len.div_ceil(CHUNK).max(1) as u64
}

fn mailbox_offset(receiver: usize, sub: u64) -> usize {
    (2 * receiver + sub as usize) * SLOT_BYTES
}

impl P2pState {
    /// Collective: registers this rank's mailboxes, exchanges them, and builds two semaphores
    /// with every peer (in ascending peer order on every rank).
    pub(crate) fn new(core: &CoreCommunicator) -> Result<Self> {
        let (rank, n) = (core.rank(), core.world_size());
        let mine = core.register_host(2 * n * SLOT_BYTES, "weave p2p mailboxes")?;
        let all = core.exchange(&mine)?;
        let mut peers = Vec::with_capacity(n);
        for (p, remote) in all.into_iter().enumerate() {
            if p == rank {
                peers.push(None);
                continue;
            }
            let ready = core.semaphore(p)?;
            let free = core.semaphore(p)?;
            peers.push(Some(PeerLink { ready, free, remote, sent: 0, freed: 0, arrived: 0, consumed: 0 }));
        }
        Ok(P2pState { rank, mine, peers, abort: core.abort_flag().clone() })
    }

    fn link(&mut self, peer: usize) -> Result<&mut PeerLink> {
        let n = self.peers.len();
        self.peers
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::invalid(format!("rank {peer} is not a peer in a {n}-rank communicator")))
    }

    /// Runs every operation to completion, progressing all of them together. The timeout
    /// applies to periods without progress.
    ///
    /// # Safety
    /// Every `Send` pointer valid for `len` reads and every `Recv` pointer for `len` writes
    /// until this returns; receive buffers disjoint from each other and from send buffers.
    pub(crate) unsafe fn run(&mut self, ops: &[P2pOp], timeout: Duration) -> Result<()> {
        let (me, n) = (self.rank, self.peers.len());
        let mut finished = vec![false; ops.len()];
        // SAFETY: forwarded from the caller.
        unsafe { group::start(ops, me, n, &mut finished)? };
        let mut done_chunks = vec![0u64; ops.len()];
        let abort = self.abort.clone();
        let links: Vec<Option<Arc<HostSemaphore>>> =
            self.peers.iter().map(|l| l.as_ref().map(|l| l.ready.clone())).collect();
        let advance = |i: usize| -> Result<(bool, bool)> {
            let total = chunks(ops[i].len());
            let moved = match ops[i] {
                // SAFETY: forwarded from the caller.
                P2pOp::Send { peer, data, len } => unsafe {
                    self.progress_send(peer, data, len, &mut done_chunks[i], total)?
                },
                // SAFETY: forwarded from the caller.
                P2pOp::Recv { peer, data, len } => unsafe {
                    self.progress_recv(peer, data, len, &mut done_chunks[i], total)?
                },
            };
            Ok((moved, done_chunks[i] == total))
        };
        let check_peer = |p: usize| match links.get(p).and_then(Option::as_ref) {
            Some(ready) => ready.connection().check_peer(),
            None => Ok(()),
        };
        group::drive(ops, n, &mut finished, timeout, &abort, advance, check_peer)
    }

    /// Pushes as many chunks of a send as the peer has free slots for.
    unsafe fn progress_send(
        &mut self,
        peer: usize,
        data: *const u8,
        len: usize,
        done: &mut u64,
        chunks: u64,
    ) -> Result<bool> {
        let mine = self.mine.clone();
        let link = self.link(peer)?;
        while link.free.poll() {
            link.freed += 1;
        }
        let mut moved = false;
        while *done < chunks && link.sent < link.freed + 2 {
            let off = mailbox_offset(peer, link.sent % 2);
            let start = *done as usize * CHUNK;
            let k = (len - start.min(len)).min(CHUNK);
            mine.check_range(off, HEADER + k)?;
            let slot = mine.as_ptr();
            // SAFETY: [off, off + HEADER + k) is inside our mailbox region (checked); the peer
            // reads this slot only after our signal and has released it (freed count), and the
            // caller guarantees data + start is valid for k reads.
            unsafe {
                let header = slot.add(off).cast::<u64>();
                header.write(len as u64);
                header.add(1).write(*done);
                std::ptr::copy_nonoverlapping(data.add(start), slot.add(off + HEADER), k);
            }
            link.ready.signal()?;
            link.sent += 1;
            *done += 1;
            moved = true;
        }
        Ok(moved)
    }

    /// Takes every chunk of a receive that has arrived.
    unsafe fn progress_recv(
        &mut self,
        peer: usize,
        data: *mut u8,
        len: usize,
        done: &mut u64,
        chunks: u64,
    ) -> Result<bool> {
        let me = self.rank;
        let link = self.link(peer)?;
        while link.ready.poll() {
            link.arrived += 1;
        }
        let mut moved = false;
        while *done < chunks && link.consumed < link.arrived {
            let off = mailbox_offset(me, link.consumed % 2);
            link.remote.check_range(off, SLOT_BYTES)?;
            let slot = link.remote.as_ptr();
            // SAFETY: the header words lie inside the peer's mapped mailbox (checked above), and
            // the peer wrote them before signalling `ready`, which we observed with acquire.
            let (total, index) = unsafe {
                let header = slot.add(off).cast::<u64>();
                (header.read(), header.add(1).read())
            };
            if total != len as u64 || index != *done {
                return Err(Error::protocol(format!(
                    "rank {peer} sent a message of {total} bytes (chunk {index}) while rank {me} receives {len} bytes \
                     (chunk {}); sizes of matching send and recv must be equal",
                    *done
                )));
            }
            let start = *done as usize * CHUNK;
            let k = (len - start.min(len)).min(CHUNK);
            // SAFETY: the payload lies inside the slot (k <= CHUNK); the caller guarantees
            // data + start is valid for k writes.
            unsafe { std::ptr::copy_nonoverlapping(slot.add(off + HEADER), data.add(start), k) };
            link.free.signal()?;
            link.consumed += 1;
            *done += 1;
            moved = true;
        }
        Ok(moved)
    }
}
