//! The host workspace: each rank's shared-memory area that host algorithms run through.
//!
//! Layout of one rank's workspace (every peer maps it), `h` = step parity:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 64·h | 64 | header line of half `h`: `phase` (how many times this rank has arrived, written at each arrival during a step of half `h`), then the [`Publication`] of the step |
//! | 128 + 64·b | 8 | rank 0's only: [`Doorbell`] `b`, which waiters of every arrival with `phase % 2 == b` sleep on |
//! | 256 | 32 | the owner line: [`OWNER_MAGIC`] with the rank, the owner's process id, the address of the workspace in the owner's address space (written before the exchange), then the owner's verdict on cross-memory attach |
//! | 4096 + h·S | S | scratch half `h` |
//! | 4096 + 2·S | T | the tail: point-to-point mailboxes and tokens (see [`super::p2p`]) |
//!
//! A *step* is: write this rank's data into scratch half `step % 2`, publish what it is,
//! arrive, wait until every peer has arrived, check the peers' publications agree, then read
//! the peers' scratch directly.
//! Double buffering makes one arrive per step enough: a rank writes half `h` again only two
//! steps later, after every peer has arrived at the step in between — which each peer does only
//! after it finished reading half `h`.
//!
//! One cache line per peer carries the arrival and the publication: a waiter that sees a peer's
//! `phase` (acquire) has the publication in the same line, so checking it costs no further
//! cache miss. The `phase` of a half's header only grows, and ranks arrive equally often in the
//! same steps: until a peer's own arrival, its header holds a smaller number than the one a
//! waiter waits for.
//!
//! A waiter that sleeps (see [`comm_core::spin::Backoff`]) sleeps on one of the two doorbells
//! in rank 0's control block, not on a peer's `phase`: it waits for all of them. Every rank
//! whose wait ends rings that doorbell (a fence and a load when nobody sleeps), so the rank
//! arriving last wakes every sleeper once, instead of each arrival waking them all. The
//! doorbells alternate with the arrival's parity: a rank ringing late for one arrival does not
//! wake the ranks already asleep in the next; and no rank sleeps in the arrival after that
//! before every rank has arrived at the one in between, which each does after it rang.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::connection::Connection;
use comm_core::doorbell::Doorbell;
use comm_core::memory::RegisteredMemory;
use comm_core::spin::{WaitContext, wait_until_rung};
use comm_core::{Error, Result};

/// Bytes of the control block at the start of each workspace (a page: the scratch halves
/// start page-aligned).
const CONTROL_BYTES: usize = 4096;
/// Bytes of a cache line: each half's header line holds `phase` and the publication.
const LINE: usize = 64;
/// Offset of rank 0's first doorbell; the second is a line further.
const DOORBELLS: usize = 2 * LINE;
/// Offset of the owner line (see the module doc).
const OWNER_LINE: usize = DOORBELLS + 2 * LINE;
/// Words of the owner line that say who owns the workspace (the verdict follows them).
pub(crate) const OWNER_WORDS: usize = 3;
/// First word of every owner line, with the owner's rank in the low bits.
pub(crate) const OWNER_MAGIC: u64 = 0x5745_4156_4500_0000;
const _: () = assert!(8 * (1 + Publication::WORDS) <= LINE && OWNER_LINE + LINE <= CONTROL_BYTES);
/// Default size of one scratch half in worlds of up to `SCRATCH_BUDGET / DEFAULT_SCRATCH_BYTES`
/// ranks.
const DEFAULT_SCRATCH_BYTES: usize = 4 << 20;
/// Smallest default scratch half.
const MIN_DEFAULT_SCRATCH_BYTES: usize = 256 << 10;
/// Bytes of one scratch half times the number of ranks, where halves are smaller than the
/// default: every rank reserves its workspace in shared memory at creation (and frees it at the
/// end), and the direct algorithms that read every peer's scratch are the wrong plan in large
/// worlds anyway.
const SCRATCH_BUDGET: usize = 32 << 20;

/// The size of one scratch half when the configuration names none: [`DEFAULT_SCRATCH_BYTES`]
/// up to 8 ranks, then shrinking with the world to a quarter of a MiB from 128 ranks on.
pub(crate) fn default_scratch_bytes(ranks: usize) -> usize {
    let fair = SCRATCH_BUDGET / ranks.max(1) / 4096 * 4096;
    fair.clamp(MIN_DEFAULT_SCRATCH_BYTES, DEFAULT_SCRATCH_BYTES)
}

/// What a rank says about the step it is in; peers check that everyone agrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Publication {
    /// The step number (every rank counts steps the same way).
    pub(crate) step: u64,
    /// Collective code, dtype code and op code packed by the caller.
    pub(crate) signature: u64,
    /// Element count as the collective defines it.
    pub(crate) count: u64,
    /// Root rank, or 0.
    pub(crate) root: u64,
    /// Where this rank's input of the step is: 0 = its scratch, k = its shared buffer k - 1.
    pub(crate) source: u64,
    /// Byte offset of the step's input inside that shared buffer.
    pub(crate) source_offset: u64,
    /// A payload of at most [`INLINE_BYTES`] carried in the header line itself, so that a peer
    /// gets it with the arrival instead of one cache miss later.
    pub(crate) inline: [u64; 2],
}

/// Bytes of payload a publication carries in the header line.
pub(crate) const INLINE_BYTES: usize = 16;

/// Bits of the signature word that hold the root (the signature itself uses the low 32 bits
/// and bit 63).
const ROOT_SHIFT: u32 = 32;
const ROOT_MASK: u64 = (1 << 31) - 1;

impl Publication {
    /// Words after `phase` in the header line: the root shares the signature's word.
    const WORDS: usize = 7;

    fn to_words(self) -> [u64; Self::WORDS] {
        // Roots are ranks, below 2^31.
        let sig = self.signature & !(ROOT_MASK << ROOT_SHIFT) | (self.root & ROOT_MASK) << ROOT_SHIFT;
        [self.step, sig, self.count, self.source, self.source_offset, self.inline[0], self.inline[1]]
    }

    fn from_words(w: [u64; Self::WORDS]) -> Self {
        Publication {
            step: w[0],
            signature: w[1] & !(ROOT_MASK << ROOT_SHIFT),
            root: (w[1] >> ROOT_SHIFT) & ROOT_MASK,
            count: w[2],
            source: w[3],
            source_offset: w[4],
            inline: [w[5], w[6]],
        }
    }
}

/// How far a rank got in its workspace: the times it arrived and the steps it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Progress {
    /// Arrivals so far (the last `phase` written to a header).
    pub(crate) phase: u64,
    /// Steps finished.
    pub(crate) step: u64,
}

impl Progress {
    /// The furthest of `self` and `other` in each count.
    pub(crate) fn furthest(self, other: Progress) -> Progress {
        Progress { phase: self.phase.max(other.phase), step: self.step.max(other.step) }
    }
}

/// One rank's view of every rank's workspace, plus its own progress.
pub(crate) struct Workspace {
    rank: usize,
    all: Vec<RegisteredMemory>,
    /// Address of every rank's mapped workspace (`all[r].as_ptr()`), checked at construction
    /// to hold `CONTROL_BYTES + 2 * scratch_bytes` bytes.
    bases: Vec<usize>,
    connections: Vec<Option<Arc<dyn Connection>>>,
    scratch_bytes: usize,
    /// Times this rank has arrived.
    phase: u64,
    /// Steps completed; selects the scratch half.
    step: u64,
    timeout: Duration,
    abort: Arc<AtomicBool>,
}

comm_core::debug_fields!(Workspace { rank, ranks: |w| w.all.len(), scratch_bytes, phase, step });

impl Workspace {
    /// Collective: registers and exchanges this rank's workspace with `scratch_bytes` per half
    /// and a tail of `tail_bytes` (at [`tail_offset`](Self::tail_offset)) for other users.
    pub(crate) fn new(core: &CoreCommunicator, scratch_bytes: usize, tail_bytes: usize) -> Result<Self> {
        let too_large = || {
            Error::invalid(format!(
                "a host workspace of {scratch_bytes} B per scratch half and a {tail_bytes} B tail does not fit in \
                 memory: set WEAVE_HOST_SCRATCH (Config::host_scratch_bytes) to a few MiB"
            ))
        };
        let scratch_bytes = scratch_bytes.max(4096).checked_next_multiple_of(4096).ok_or_else(too_large)?;
        let len = scratch_bytes
            .checked_mul(2)
            .and_then(|s| s.checked_add(CONTROL_BYTES))
            .and_then(|s| s.checked_add(tail_bytes))
            .filter(|&l| isize::try_from(l).is_ok())
            .ok_or_else(too_large)?;
        let mine = core.register_host(len, "weave host workspace")?;
        mine.check_range(0, len)?;
        let owner = [OWNER_MAGIC | core.rank() as u64, u64::from(std::process::id()), mine.as_ptr() as u64];
        for (i, w) in owner.into_iter().enumerate() {
            // SAFETY: the owner line lies inside the control block of this fresh registration
            // of `len` bytes (checked above), 8-byte aligned; no peer maps it before the
            // exchange below.
            unsafe { mine.as_ptr().add(OWNER_LINE + 8 * i).cast::<u64>().write(w) };
        }
        let all = core.exchange(&mine)?;
        let (rank, n) = (core.rank(), core.world_size());
        let mut connections = Vec::with_capacity(n);
        for p in 0..n {
            connections.push(if p == rank { None } else { Some(core.connection(p)?) });
        }
        for m in &all {
            if !m.is_host_mapped() {
                return Err(Error::Unsupported(format!(
                    "rank {} workspace is not mapped here; host collectives need a shared-memory transport",
                    m.owner()
                )));
            }
            m.check_range(0, len)?;
            if !(m.as_ptr() as usize).is_multiple_of(LINE) {
                return Err(Error::protocol(format!("rank {} workspace is not cache-line aligned", m.owner())));
            }
        }
        let bases = all.iter().map(|m| m.as_ptr() as usize).collect();
        Ok(Workspace {
            rank,
            all,
            bases,
            connections,
            scratch_bytes,
            phase: 0,
            step: 0,
            timeout: core.config().timeout,
            abort: core.abort_flag().clone(),
        })
    }

    /// The workspace of a communicator shrunk from the one `parent` serves, whose rank `r` was
    /// `members[r]` there: the members' workspaces as the parent mapped them, with connections
    /// of `core` (the shrunk communicator's), going on from arrival `progress.phase` and step
    /// `progress.step`.
    ///
    /// Call it only once no member writes the parent's workspace any more (every member has
    /// left the parent's calls), with the largest phase and step any member reached: every
    /// header then holds at most `phase`, so the next arrival's wait cannot be met by a value
    /// the parent left, and every member counts steps alike.
    pub(crate) fn shrunk(
        parent: &Workspace,
        core: &CoreCommunicator,
        members: &[usize],
        progress: Progress,
    ) -> Result<Self> {
        let (rank, n) = (core.rank(), core.world_size());
        if members.len() != n || members.iter().any(|&m| m >= parent.all.len()) {
            return Err(Error::invalid(format!(
                "a {n}-rank shrink of a {}-rank host workspace names members {members:?}",
                parent.all.len()
            )));
        }
        let mut connections = Vec::with_capacity(n);
        for p in 0..n {
            connections.push(if p == rank { None } else { Some(core.connection(p)?) });
        }
        Ok(Workspace {
            rank,
            all: members.iter().map(|&m| parent.all[m].clone()).collect(),
            bases: members.iter().map(|&m| parent.bases[m]).collect(),
            connections,
            scratch_bytes: parent.scratch_bytes,
            phase: progress.phase,
            step: progress.step,
            timeout: core.config().timeout,
            abort: core.abort_flag().clone(),
        })
    }

    /// How far this rank got: its arrivals and steps.
    pub(crate) fn progress(&self) -> Progress {
        Progress { phase: self.phase, step: self.step }
    }

    /// Number of ranks.
    pub(crate) fn world_size(&self) -> usize {
        self.all.len()
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Every rank's workspace, indexed by rank.
    pub(crate) fn memories(&self) -> &[RegisteredMemory] {
        &self.all
    }

    /// Byte offset of the tail in every rank's workspace (page-aligned).
    pub(crate) fn tail_offset(&self) -> usize {
        CONTROL_BYTES + 2 * self.scratch_bytes
    }

    /// The owner line of `rank`'s workspace as mapped here: [`OWNER_MAGIC`] with the rank,
    /// the owner's process id, and the address of the workspace in the owner's address space.
    pub(crate) fn owner(&self, rank: usize) -> [u64; OWNER_WORDS] {
        // Relaxed: written before the exchange, which every rank finished before this.
        std::array::from_fn(|i| self.word(rank, OWNER_LINE + 8 * i).load(Ordering::Relaxed))
    }

    /// Where `rank`'s owner line lies in the owner's address space, as its owner line says.
    pub(crate) fn owner_line_address(&self, rank: usize) -> u64 {
        self.owner(rank)[2].wrapping_add(OWNER_LINE as u64)
    }

    /// Writes this rank's verdict (read by peers after the next arrival).
    pub(crate) fn set_verdict(&self, verdict: u64) {
        // Relaxed: the arrive that follows is a release store that orders it.
        self.word(self.rank, OWNER_LINE + 8 * OWNER_WORDS).store(verdict, Ordering::Relaxed);
    }

    /// `rank`'s verdict (valid after the arrival that follows its [`set_verdict`](Self::set_verdict)).
    pub(crate) fn verdict(&self, rank: usize) -> u64 {
        // Relaxed: ordered by the acquire load of the peer's phase in the wait.
        self.word(rank, OWNER_LINE + 8 * OWNER_WORDS).load(Ordering::Relaxed)
    }

    /// Bytes of one scratch half.
    pub(crate) fn scratch_bytes(&self) -> usize {
        self.scratch_bytes
    }

    /// The step running now (every rank counts steps the same way).
    pub(crate) fn step(&self) -> u64 {
        self.step
    }

    /// The scratch half the current step uses.
    fn half(&self) -> usize {
        (self.step % 2) as usize
    }

    /// The word at byte `offset` of `rank`'s control block.
    fn word(&self, rank: usize, offset: usize) -> &AtomicU64 {
        debug_assert!(offset < CONTROL_BYTES && offset.is_multiple_of(8));
        // SAFETY: `bases[rank]` is the start of rank's mapped workspace, which `all` keeps
        // mapped and which holds at least CONTROL_BYTES bytes (checked in `new`); every caller's
        // offset is a constant-derived, 8-byte aligned word inside the control block and the
        // base is cache-line aligned. Peers access these words only atomically.
        unsafe { &*((self.bases[rank] + offset) as *const AtomicU64) }
    }

    /// Offset of the current half's header line.
    fn header(&self) -> usize {
        self.half() * LINE
    }

    /// Address of byte `offset` of `rank`'s scratch for the current step, valid for `len` bytes.
    pub(crate) fn scratch(&self, rank: usize, offset: usize, len: usize) -> Result<*mut u8> {
        if offset.checked_add(len).is_none_or(|end| end > self.scratch_bytes) {
            return Err(Error::invalid(format!(
                "scratch range [{offset}, +{len}) exceeds the {} bytes of a scratch half",
                self.scratch_bytes
            )));
        }
        let base = CONTROL_BYTES + self.half() * self.scratch_bytes + offset;
        // SAFETY: base + len <= CONTROL_BYTES + 2 * scratch_bytes, which lies inside rank's
        // mapped workspace (checked in `new`).
        Ok(unsafe { (self.bases[rank] as *mut u8).add(base) })
    }

    /// Publishes this rank's description of the current step (read by peers after they wait).
    pub(crate) fn publish(&self, mut p: Publication) {
        p.step = self.step;
        let base = self.header() + 8;
        for (i, w) in p.to_words().into_iter().enumerate() {
            // Relaxed: the arrive that follows is a release store that orders these.
            self.word(self.rank, base + 8 * i).store(w, Ordering::Relaxed);
        }
    }

    /// `rank`'s publication for the current step (valid after [`arrive_and_wait`](Self::arrive_and_wait)).
    pub(crate) fn publication(&self, rank: usize) -> Publication {
        let base = self.header() + 8;
        let mut w = [0u64; Publication::WORDS];
        for (i, x) in w.iter_mut().enumerate() {
            // Relaxed: ordered by the acquire load of the peer's phase in the wait.
            *x = self.word(rank, base + 8 * i).load(Ordering::Relaxed);
        }
        Publication::from_words(w)
    }

    /// The doorbell that waiters of arrival number `phase` sleep on (in rank 0's control block).
    fn doorbell(&self, phase: u64) -> &Doorbell {
        let offset = DOORBELLS + (phase % 2) as usize * LINE;
        // SAFETY: rank 0's workspace is mapped while `all` lives and holds CONTROL_BYTES bytes
        // of control block, cache-line aligned (checked in `new`); the doorbells lie inside it
        // (asserted above), start zeroed like the whole segment, and every rank accesses them
        // only as doorbells.
        unsafe { Doorbell::from_ptr((self.bases[0] + offset) as *mut u8) }
    }

    /// Arrives (release: everything this rank wrote so far becomes visible), then waits until
    /// every peer has arrived as often (acquire), bounded by the timeout, the abort flag and the
    /// peers' health; then rings the arrival's doorbell for the
    /// ranks that fell asleep waiting (see the module doc).
    /// Every peer's header line is loaded on each pass (no short cut), so their misses overlap.
    pub(crate) fn arrive_and_wait(&mut self, what: &str) -> Result<()> {
        self.phase += 1;
        let header = self.header();
        self.word(self.rank, header).store(self.phase, Ordering::Release);
        let target = self.phase;
        let (n, me) = (self.world_size(), self.rank);
        let ready = |p: usize| self.word(p, header).load(Ordering::Acquire) >= target;
        let all_ready = || (0..n).filter(|&p| p != me).fold(true, |ok, p| ok & ready(p));
        let missing = || (0..n).find(|&p| p != me && !ready(p));
        // Two peers per check, not all of them (a check after every sleep of every rank of a
        // large world would add up): the first one not yet arrived, and one more in turn, so a
        // dead rank is found within `n` checks even while a live one, held up elsewhere by it,
        // is the one missing here.
        let turn = std::cell::Cell::new(me);
        let check = || {
            turn.set((turn.get() + 1) % n);
            for p in missing().into_iter().chain([turn.get()]) {
                if let Some(c) = &self.connections[p] {
                    c.check_peer()?;
                }
            }
            Ok(())
        };
        let ctx =
            WaitContext { operation: what, peer: None, timeout: self.timeout, abort: &self.abort, check_peer: &check };
        let bell = self.doorbell(target);
        match wait_until_rung(&ctx, Some(bell), &|| Ok(()), all_ready) {
            Ok(()) => {
                bell.ring();
                Ok(())
            }
            // Name the first peer that has not arrived.
            Err(Error::Timeout { operation, peer: None, waited, verdict }) => {
                Err(Error::Timeout { operation, peer: missing(), waited, verdict })
            }
            Err(e) => Err(e),
        }
    }

    /// Ends the current step: the next one uses the other scratch half.
    pub(crate) fn finish_step(&mut self) {
        self.step += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scratch_shrinks_with_the_world_within_its_bounds() {
        for n in [1, 2, 8] {
            assert_eq!(default_scratch_bytes(n), DEFAULT_SCRATCH_BYTES, "{n} ranks");
        }
        assert_eq!(default_scratch_bytes(32), 1 << 20);
        for n in [128, 1024, 1 << 16] {
            assert_eq!(default_scratch_bytes(n), MIN_DEFAULT_SCRATCH_BYTES, "{n} ranks");
        }
        let mut last = usize::MAX;
        for n in 1..300 {
            let s = default_scratch_bytes(n);
            assert!(s <= last && s.is_multiple_of(4096), "{n} ranks: {s}");
            last = s;
        }
    }
}
