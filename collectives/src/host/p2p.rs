//! Host point-to-point: send/recv between two ranks through per-pair mailboxes.
//!
//! Each rank owns, for every peer, two mailbox slots in its shared memory (double buffering).
//! A sender copies a chunk into a free slot and signals the pair's `ready` semaphore; the
//! receiver copies it out and signals `free`. Every chunk starts with a header carrying the
//! message length, so mismatched send/recv sizes are reported, not silently truncated, and
//! the sender group's [`PairStamp`], which the receiver checks before taking a message
//! (`crate::matching`).
//! A group of operations progresses all of them together, so no order of sends and receives
//! inside a group can deadlock.
//!
//! The mailboxes and the semaphores' tokens are the tail of each rank's host workspace (see
//! [`super::workspace`]): rank `r` keeps its mailboxes, then, for every peer `p`, the word `p`
//! signals when a chunk for `r` is ready and the word `p` signals when it has consumed one of
//! `r`'s chunks. The workspace's exchange at creation hands every rank every peer's mailboxes
//! and tokens, so a pair needs no handshake of its own: each rank builds
//! its side of a pair's semaphores locally, the first time it sends to or receives from that
//! peer, and a send still returns once its chunks are buffered.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::connection::Connection;
use comm_core::memory::RegisteredMemory;
use comm_core::semaphore::{HostSemaphore, SemaphoreCounts, Token};
use comm_core::{Error, Result};

use crate::call::P2pOp;
use crate::matching::{GroupStamps, Met, PairStamp, STAMP_WORDS};
use crate::p2p_progress;

/// Bytes of one mailbox slot (header included) in worlds of up to
/// `MAILBOX_BYTES / (2 · MAX_SLOT_BYTES)` ranks.
const MAX_SLOT_BYTES: usize = 256 << 10;
/// Smallest mailbox slot (header included): a page.
const MIN_SLOT_BYTES: usize = 4 << 10;
/// Bytes of one rank's mailboxes (two slots per peer) where slots are smaller than the
/// largest: every rank reserves its mailboxes in shared memory at creation, so a fixed slot
/// would make the job reserve `2 · n² · slot` bytes (8 GiB at 128 ranks; 512 MiB with this
/// budget).
const MAILBOX_BYTES: usize = 4 << 20;
/// Bytes of the chunk header at the start of a slot: length, chunk index, the group's
/// [`PairStamp`].
const HEADER: usize = 64;
const _: () = assert!(8 * (2 + STAMP_WORDS) <= HEADER);
/// Bytes between two semaphore tokens (one cache line each, so pollers do not share lines).
const TOKEN_STRIDE: usize = 64;

/// The pair state this rank keeps for one peer.
struct PeerLink {
    /// Signalled by this rank when a chunk for the peer is ready; polled for the peer's chunks.
    ready: HostSemaphore,
    /// Signalled by this rank when it consumed a peer's chunk; polled for the peer's consumption.
    free: HostSemaphore,
    sent: u64,
    freed: u64,
    arrived: u64,
    consumed: u64,
}

/// Point-to-point state of one communicator.
pub(crate) struct P2pState {
    rank: usize,
    /// Slot size and offsets of every rank's registration.
    layout: Layout,
    /// Every rank's workspace, whose tail holds its mailboxes and tokens (see [`Layout`]), indexed
    /// by rank (this rank's own at its index).
    mailboxes: Vec<RegisteredMemory>,
    /// The connection to every peer through the transport that maps its mailboxes (`None` for
    /// this rank).
    connections: Vec<Option<Arc<dyn Connection>>>,
    /// The pair state, built on first use of each peer.
    peers: Vec<Option<PeerLink>>,
    /// Every rank's index in the [`Layout`] (which mailbox and tokens are its): the rank itself,
    /// except in a shrunk communicator, which keeps the layout of the communicator it was
    /// shrunk from and so its ranks' old indices.
    slots: Vec<usize>,
    /// Per peer, the counts its pair's tokens held when this state took the mailboxes over
    /// (zero in a fresh workspace): where the pair semaphores' counts start.
    resumed: Vec<PairCounts>,
    timeout: Duration,
    abort: Arc<AtomicBool>,
}

/// Chunks one rank has sent to a peer and received from it through their mailboxes, as the
/// pair's `ready` tokens count them.
#[derive(Debug, Clone, Copy, Default)]
struct PairCounts {
    sent: u64,
    received: u64,
}

/// Where things lie in one rank's point-to-point area (from `base` in its registration) of an
/// `n`-rank communicator: two mailbox slots per peer, then two tokens per peer. Every rank
/// computes the same layout from `n` and the workspace's size.
#[derive(Debug, Clone, Copy)]
struct Layout {
    ranks: usize,
    slot: usize,
    base: usize,
}

impl Layout {
    /// Slots of [`MAX_SLOT_BYTES`] up to the [`MAILBOX_BYTES`] budget, smaller (a whole number
    /// of pages, at least one) in larger worlds.
    fn new(ranks: usize, base: usize) -> Self {
        let fair = (MAILBOX_BYTES / (2 * ranks.max(1))) / MIN_SLOT_BYTES * MIN_SLOT_BYTES;
        Layout { ranks, slot: fair.clamp(MIN_SLOT_BYTES, MAX_SLOT_BYTES), base }
    }

    /// Payload bytes per chunk.
    fn chunk(&self) -> usize {
        self.slot - HEADER
    }

    /// Chunks a message of `len` bytes takes (at least one: an empty message still says its
    /// length).
    fn chunks(&self, len: usize) -> u64 {
        len.div_ceil(self.chunk()).max(1) as u64
    }

    /// Offset of slot `sub` (0 or 1) of the mailbox for `receiver`.
    fn mailbox_offset(&self, receiver: usize, sub: u64) -> usize {
        self.base + (2 * receiver + sub as usize) * self.slot
    }

    /// Offset of the word `peer` signals when a chunk for this registration's owner is ready.
    fn ready_token(&self, peer: usize) -> usize {
        self.base + 2 * self.ranks * self.slot + 2 * peer * TOKEN_STRIDE
    }

    /// Offset of the word `peer` signals when it has consumed one of the owner's chunks.
    fn free_token(&self, peer: usize) -> usize {
        self.ready_token(peer) + TOKEN_STRIDE
    }

    /// Bytes of one rank's area: its mailboxes, then two tokens per rank.
    fn area_bytes(&self) -> usize {
        2 * self.ranks * self.slot + 2 * self.ranks * TOKEN_STRIDE
    }
}

impl P2pState {
    /// Bytes of the area each rank of an `n`-rank communicator keeps for point-to-point (the
    /// tail of its workspace).
    pub(crate) fn area_bytes(n: usize) -> usize {
        Layout::new(n, 0).area_bytes()
    }

    /// The point-to-point state over `memories`, every rank's exchanged workspace (indexed by
    /// rank), whose [`area_bytes`](Self::area_bytes) from `base` on hold each rank's mailboxes
    /// and tokens; the pair semaphores are built later, locally, on first use of each peer.
    pub(crate) fn new(core: &CoreCommunicator, memories: &[RegisteredMemory], base: usize) -> Result<Self> {
        let n = core.world_size();
        let layout = Layout::new(n, base);
        if memories.len() != n {
            return Err(Error::invalid(format!(
                "point-to-point state of {n} ranks over {} workspaces",
                memories.len()
            )));
        }
        for m in memories {
            m.check_range(base, layout.area_bytes())?;
        }
        Self::from_parts(core, layout, memories.to_vec(), (0..n).collect(), vec![PairCounts::default(); n])
    }

    /// The state over every rank's `mailboxes` (indexed by rank) at the `slots` of `layout`,
    /// each pair's counts starting at `resumed`, with connections of `core` to every peer.
    fn from_parts(
        core: &CoreCommunicator,
        layout: Layout,
        mailboxes: Vec<RegisteredMemory>,
        slots: Vec<usize>,
        resumed: Vec<PairCounts>,
    ) -> Result<Self> {
        let rank = core.rank();
        let mut connections = Vec::with_capacity(mailboxes.len());
        for (p, m) in mailboxes.iter().enumerate() {
            connections.push(if p == rank { None } else { Some(core.connection_via(p, m.transport())?) });
        }
        Ok(P2pState {
            rank,
            layout,
            peers: (0..mailboxes.len()).map(|_| None).collect(),
            mailboxes,
            connections,
            slots,
            resumed,
            timeout: core.config().timeout,
            abort: core.abort_flag().clone(),
        })
    }

    /// The point-to-point state of a communicator shrunk from the one `parent` serves, whose
    /// rank `r` was `members[r]` there: the members' mailboxes and tokens, in the parent's
    /// layout, with connections of `core` (the shrunk communicator's).
    ///
    /// Call it only once no member writes the parent's mailboxes or tokens any more (every
    /// member has left the parent's calls): each pair's counts go on from what its tokens hold
    /// now, which both ranks of the pair read alike. A chunk sent in the parent and never
    /// taken is dropped, not delivered into the shrunk communicator.
    pub(crate) fn shrunk(parent: &P2pState, core: &CoreCommunicator, members: &[usize]) -> Result<Self> {
        let (rank, n) = (core.rank(), core.world_size());
        if members.len() != n || members.iter().any(|&m| m >= parent.mailboxes.len()) {
            return Err(Error::invalid(format!(
                "a {n}-rank shrink of a {}-rank communicator's point-to-point state names members {members:?}",
                parent.mailboxes.len()
            )));
        }
        let layout = parent.layout;
        let mailboxes: Vec<RegisteredMemory> = members.iter().map(|&m| parent.mailboxes[m].clone()).collect();
        let slots: Vec<usize> = members.iter().map(|&m| parent.slots[m]).collect();
        let mut resumed = vec![PairCounts::default(); n];
        for p in (0..n).filter(|&p| p != rank) {
            // This rank alone writes its `ready` token in the peer's area; the peer alone the
            // one in this rank's area.
            resumed[p] = PairCounts {
                sent: mailboxes[p].load_u64(layout.ready_token(slots[rank]))?,
                received: mailboxes[rank].load_u64(layout.ready_token(slots[p]))?,
            };
        }
        Self::from_parts(core, layout, mailboxes, slots, resumed)
    }

    /// This rank's pair semaphores with `peer`, built from the exchanged tokens.
    fn build_link(&self, peer: usize) -> Result<PeerLink> {
        let (me, layout) = (self.rank, self.layout);
        let connection = self.connections[peer]
            .clone()
            .ok_or_else(|| Error::invalid(format!("rank {me} has no point-to-point link to itself")))?;
        let (mine, theirs) = (&self.mailboxes[me], &self.mailboxes[peer]);
        let (my_slot, their_slot) = (self.slots[me], self.slots[peer]);
        let token = |memory: &RegisteredMemory, offset| Token { memory: memory.clone(), offset };
        let semaphore = |inbound, remote, counts| {
            HostSemaphore::resume(connection.clone(), inbound, remote, counts, self.timeout, self.abort.clone())
        };
        // The chunks sent before are all taken as consumed: `ready` counts chunks sent each
        // way, `free` the chunks consumed of the other side's.
        let PairCounts { sent, received } = self.resumed[peer];
        Ok(PeerLink {
            ready: semaphore(
                token(mine, layout.ready_token(their_slot)),
                token(theirs, layout.ready_token(my_slot)),
                SemaphoreCounts { received, signalled: sent },
            )?,
            free: semaphore(
                token(mine, layout.free_token(their_slot)),
                token(theirs, layout.free_token(my_slot)),
                SemaphoreCounts { received: sent, signalled: received },
            )?,
            sent,
            freed: sent,
            arrived: received,
            consumed: received,
        })
    }

    /// `peer`'s index in the layout.
    fn slot_of(&self, peer: usize) -> Result<usize> {
        let n = self.slots.len();
        self.slots
            .get(peer)
            .copied()
            .ok_or_else(|| Error::invalid(format!("rank {peer} is not a peer in a {n}-rank communicator")))
    }

    /// The pair state with `peer`, built on first use.
    fn link(&mut self, peer: usize) -> Result<&mut PeerLink> {
        let n = self.peers.len();
        if peer >= n || peer == self.rank {
            return Err(Error::invalid(format!("rank {peer} is not a peer in a {n}-rank communicator")));
        }
        let link = match self.peers[peer].take() {
            Some(link) => link,
            None => self.build_link(peer)?,
        };
        Ok(self.peers[peer].insert(link))
    }

    /// Runs every operation to completion, progressing all of them together. The timeout
    /// applies to periods without progress.
    ///
    /// # Safety
    /// Every `Send` pointer valid for `len` reads and every `Recv` pointer for `len` writes
    /// until this returns; receive buffers disjoint from each other and from send buffers.
    pub(crate) unsafe fn run(&mut self, ops: &[P2pOp], stamps: &GroupStamps, timeout: Duration) -> Result<()> {
        let (me, n) = (self.rank, self.peers.len());
        let mut finished = vec![false; ops.len()];
        // SAFETY: forwarded from the caller.
        unsafe { p2p_progress::start(ops, me, n, &mut finished)? };
        let mut done_chunks = vec![0u64; ops.len()];
        let abort = self.abort.clone();
        let connections = self.connections.clone();
        let layout = self.layout;
        let advance = |i: usize| -> Result<(bool, bool)> {
            let total = layout.chunks(ops[i].len());
            let moved = match ops[i] {
                // SAFETY: forwarded from the caller.
                P2pOp::Send { peer, data, len } => unsafe {
                    self.progress_send(peer, data, len, &mut done_chunks[i], total, &stamps.sending_to(peer)?)?
                },
                // SAFETY: forwarded from the caller.
                P2pOp::Recv { peer, data, len } => unsafe {
                    self.progress_recv(peer, data, len, &mut done_chunks[i], total, &stamps.receiving_from(peer)?)?
                },
            };
            Ok((moved, done_chunks[i] == total))
        };
        let check_peer = |p: usize| match connections.get(p).and_then(Option::as_ref) {
            Some(connection) => connection.check_peer(),
            None => Ok(()),
        };
        p2p_progress::drive(ops, n, &mut finished, timeout, &abort, advance, check_peer)
    }

    /// Pushes as many chunks of a send as the peer has free slots for.
    unsafe fn progress_send(
        &mut self,
        peer: usize,
        data: *const u8,
        len: usize,
        done: &mut u64,
        chunks: u64,
        stamp: &PairStamp,
    ) -> Result<bool> {
        let mine = self.mailboxes[self.rank].clone();
        let (layout, chunk) = (self.layout, self.layout.chunk());
        let receiver_slot = self.slot_of(peer)?;
        let link = self.link(peer)?;
        // At most the two slots in flight come back: a peer's token is never counted further.
        while link.freed < link.sent && link.free.poll() {
            link.freed += 1;
        }
        let mut moved = false;
        while *done < chunks && link.sent < link.freed + 2 {
            let off = layout.mailbox_offset(receiver_slot, link.sent % 2);
            let start = *done as usize * chunk;
            let k = (len - start.min(len)).min(chunk);
            mine.check_range(off, HEADER + k)?;
            let slot = mine.as_ptr();
            // SAFETY: [off, off + HEADER + k) is inside our mailbox region (checked); the peer
            // reads this slot only after our signal and has released it (freed count), and the
            // caller guarantees data + start is valid for k reads.
            unsafe {
                let header = slot.add(off).cast::<u64>();
                header.write(len as u64);
                header.add(1).write(*done);
                for (k, word) in stamp.to_words().into_iter().enumerate() {
                    header.add(2 + k).write(word);
                }
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
        stamp: &PairStamp,
    ) -> Result<bool> {
        let me = self.rank;
        let remote = self.mailboxes[peer].clone();
        let (layout, chunk) = (self.layout, self.layout.chunk());
        let my_slot = self.slots[me];
        let link = self.link(peer)?;
        // At most two slots fill before this rank frees one: a peer's token is never counted
        // further.
        while link.arrived < link.consumed + 2 && link.ready.poll() {
            link.arrived += 1;
        }
        let mut moved = false;
        while *done < chunks && link.consumed < link.arrived {
            let off = layout.mailbox_offset(my_slot, link.consumed % 2);
            remote.check_range(off, layout.slot)?;
            let slot = remote.as_ptr();
            // SAFETY: the header words lie inside the peer's mapped mailbox (checked above), and
            // the peer wrote them before signalling `ready`, which we observed with acquire.
            let (total, index, theirs) = unsafe {
                let header = slot.add(off).cast::<u64>();
                let words: [u64; STAMP_WORDS] = std::array::from_fn(|k| header.add(2 + k).read());
                (header.read(), header.add(1).read(), PairStamp::from_words(words))
            };
            // The groups first: a message of another group says so, not a size mismatch.
            if index == 0 {
                PairStamp::check(&theirs, stamp, Met { peer, me, sent: total, len })?;
            }
            if total != len as u64 || index != *done {
                return Err(Error::protocol(format!(
                    "rank {peer} sent a message of {total} bytes (chunk {index}) while rank {me} receives {len} bytes \
                     (chunk {}); sizes of matching send and recv must be equal",
                    *done
                )));
            }
            let start = *done as usize * chunk;
            let k = (len - start.min(len)).min(chunk);
            // SAFETY: the payload lies inside the slot (k <= chunk); the caller guarantees
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailboxes_keep_full_slots_in_small_worlds_and_a_bounded_budget_in_large_ones() {
        for n in [1, 2, 8] {
            assert_eq!(Layout::new(n, 0).slot, MAX_SLOT_BYTES, "{n} ranks");
        }
        for n in [9, 16, 32, 100, 128, 1000, 1 << 16] {
            let l = Layout::new(n, 0);
            assert!(l.slot.is_multiple_of(MIN_SLOT_BYTES) && (MIN_SLOT_BYTES..MAX_SLOT_BYTES).contains(&l.slot), "{n}");
            assert!(2 * n * l.slot <= MAILBOX_BYTES.max(2 * n * MIN_SLOT_BYTES), "{n} ranks: slots of {}", l.slot);
        }
        assert_eq!(Layout::new(128, 0).slot, 16 << 10);
        // Slots, then tokens, without overlap, from the base on; a message always takes at
        // least one chunk.
        let l = Layout::new(5, 4096);
        assert_eq!(l.mailbox_offset(0, 0), 4096);
        assert_eq!(l.mailbox_offset(4, 1) + l.slot, l.ready_token(0));
        assert_eq!(l.free_token(4) + TOKEN_STRIDE, 4096 + l.area_bytes());
        assert_eq!(l.chunks(0), 1);
        assert_eq!(l.chunks(l.chunk()), 1);
        assert_eq!(l.chunks(l.chunk() + 1), 2);
    }
}
