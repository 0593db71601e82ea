//! Host algorithms: every collective on CPU memory through the shared-memory workspace.
//!
//! All algorithms share one protocol (see [`workspace`]): stage into scratch, publish, arrive,
//! wait, check agreement, read peers. Arguments that are wrong on one rank still take part in
//! one step, publishing an "invalid" mark, so every rank fails promptly with a clear error
//! instead of waiting for a peer that already returned.

mod all_reduce;
mod blocks;
mod p2p;
mod ring;
pub(crate) mod workspace;

pub(crate) use p2p::P2pState;

use std::time::Duration;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::memory::RegisteredMemory;
use comm_core::{Error, Result};

use crate::call::{describe, signature};
use crate::copy::copy;
use crate::dtype::Element;
use crate::op::ReduceOp;
use crate::reduce::reduce_raw;
use crate::table::{Algorithm, Collective};
pub(crate) use workspace::Progress;
use workspace::{Publication, Workspace};

pub(crate) use all_reduce::{all_reduce, reduce};
pub(crate) use blocks::{AllToAllv, all_gather, all_to_all, all_to_allv, broadcast, reduce_scatter};

/// Set in a publication's signature by a rank whose arguments were invalid.
const INVALID_MARK: u64 = 1 << 63;

/// Which publication fields every rank must share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Agree {
    /// The element count must be equal on every rank.
    pub count: bool,
    /// The root must be equal on every rank.
    pub root: bool,
}

/// Where a new communicator's host engine comes from.
pub(crate) enum HostSource<'a> {
    /// Built anew (registered, exchanged, probed) where every peer's memory is mapped here.
    Fresh,
    /// Taken over from the communicator it is shrunk from ([`HostEngine::shrunk`]): rank `r`
    /// was `members[r]` there, and the members go on from `progress`.
    Handover { parent: &'a HostEngine, members: &'a [usize], progress: Progress },
}

/// The per-communicator host state: workspace, point-to-point state, and whether an earlier
/// failure left the ranks out of step.
pub(crate) struct HostEngine {
    pub(crate) ws: Workspace,
    pub(crate) p2p: P2pState,
    /// Process ids of every rank, when every rank can read every other rank's memory with
    /// `process_vm_readv` (cross-memory attach); `None` where ptrace rules forbid it.
    pub(crate) cma: Option<Vec<i32>>,
    /// Shared buffers of this communicator, by id: every rank's mapping of each.
    shared: Vec<Vec<RegisteredMemory>>,
    health: crate::health::Health,
    timeout: Duration,
}

impl HostEngine {
    /// Collective: builds the workspace, whose tail holds the point-to-point mailboxes.
    pub(crate) fn new(
        core: &CoreCommunicator,
        scratch_bytes: usize,
        revocation: std::sync::Arc<comm_core::resilience::Resilience>,
    ) -> Result<Self> {
        // Ranks pinned one per CPU see one CPU in their affinity mask, yet do not outnumber the
        // host's cores: judged on the CPUs online, their waits spin before they yield.
        comm_core::crowding::set_local_ranks(core.bootstrap().local_world_size());
        let mut ws = Workspace::new(core, scratch_bytes, P2pState::area_bytes(core.world_size()))?;
        let p2p = P2pState::new(core, ws.memories(), ws.tail_offset())?;
        let cma = probe_cma(&mut ws)?;
        Ok(Self::assemble(core, ws, p2p, cma, revocation))
    }

    /// The engine over a workspace and point-to-point state already built, with no shared
    /// buffers yet.
    fn assemble(
        core: &CoreCommunicator,
        ws: Workspace,
        p2p: P2pState,
        cma: Option<Vec<i32>>,
        revocation: std::sync::Arc<comm_core::resilience::Resilience>,
    ) -> Self {
        HostEngine {
            ws,
            p2p,
            cma,
            shared: Vec::new(),
            health: crate::health::Health::new(revocation),
            timeout: core.config().timeout,
        }
    }

    /// Collective: the engine of a new communicator over `core`, as `source` says — `None` on
    /// every rank where some peer's memory is not mapped here (every rank sees the same
    /// topology, so all agree).
    pub(crate) fn from_source(
        source: HostSource<'_>,
        core: &CoreCommunicator,
        scratch_bytes: Option<usize>,
        revocation: std::sync::Arc<comm_core::resilience::Resilience>,
    ) -> Result<Option<Self>> {
        match source {
            HostSource::Fresh if core.topology().all_direct() => {
                let scratch = scratch_bytes.unwrap_or_else(|| workspace::default_scratch_bytes(core.world_size()));
                Self::new(core, scratch, revocation).map(Some)
            }
            HostSource::Fresh => Ok(None),
            HostSource::Handover { parent, members, progress } => {
                Self::shrunk(parent, core, members, progress, revocation).map(Some)
            }
        }
    }

    /// The host engine of a communicator shrunk from the one `parent` serves (rank `r` of it was
    /// `members[r]` there), over `core`: the survivors' workspaces, mailboxes and cross-memory
    /// attach as the parent holds them — nothing registered, exchanged or probed again. The
    /// parent must be retired first ([`Resilience::retire`](comm_core::resilience::Resilience::retire):
    /// the shrink does, so its calls fail, naming the shrink); its shared buffers stay the
    /// parent's.
    ///
    /// Call it on every member once every member has left the parent's calls, with the
    /// furthest [`Progress`] any member reached (see [`Workspace::shrunk`]).
    pub(crate) fn shrunk(
        parent: &HostEngine,
        core: &CoreCommunicator,
        members: &[usize],
        progress: Progress,
        revocation: std::sync::Arc<comm_core::resilience::Resilience>,
    ) -> Result<Self> {
        let ws = Workspace::shrunk(&parent.ws, core, members, progress)?;
        let p2p = P2pState::shrunk(&parent.p2p, core, members)?;
        let cma = parent.cma.as_ref().map(|pids| members.iter().map(|&m| pids[m]).collect());
        Ok(Self::assemble(core, ws, p2p, cma, revocation))
    }

    /// How far this rank got in its workspace (what a shrink goes on from).
    pub(crate) fn progress(&self) -> Progress {
        self.ws.progress()
    }

    /// Whether an earlier failure broke this engine.
    pub(crate) fn is_broken(&self) -> bool {
        self.health.is_broken()
    }

    /// Collective: allocates a shared buffer of `bytes` on every rank and maps every rank's.
    /// It lives as long as the communicator (peers may read it in any later collective).
    pub(crate) fn alloc_shared(&mut self, core: &CoreCommunicator, bytes: usize) -> Result<RegisteredMemory> {
        let id = self.shared.len();
        let mine = core.register_host(bytes, &format!("weave shared buffer #{id}"))?;
        let all = core.exchange(&mine)?;
        self.shared.push(all);
        Ok(mine)
    }

    /// The shared buffer (id, byte offset) that holds `[ptr, ptr + bytes)` on this rank, if any.
    pub(crate) fn locate(&self, ptr: *const u8, bytes: usize) -> Option<(usize, usize)> {
        let me = self.ws.rank();
        let addr = ptr as usize;
        self.shared.iter().enumerate().find_map(|(id, all)| {
            let base = all[me].as_ptr() as usize;
            let end = base + all[me].len();
            (addr >= base && addr.checked_add(bytes).is_some_and(|e| e <= end)).then(|| (id, addr - base))
        })
    }

    /// Address of `bytes` bytes at `offset` of `rank`'s shared buffer `source - 1` (as
    /// published), checked against that buffer's length.
    pub(crate) fn shared_source(&self, rank: usize, source: u64, offset: u64, bytes: usize) -> Result<*const u8> {
        let mem = usize::try_from(source)
            .ok()
            .and_then(|s| s.checked_sub(1))
            .and_then(|id| self.shared.get(id))
            .map(|all| &all[rank])
            .ok_or_else(|| {
                Error::protocol(format!("rank {rank} published shared buffer {source}, which does not exist"))
            })?;
        let offset = usize::try_from(offset).map_err(|_| Error::protocol("shared buffer offset overflows"))?;
        mem.check_range(offset, bytes)?;
        // SAFETY: the range was checked against the mapped registration.
        Ok(unsafe { mem.as_ptr().add(offset) })
    }

    /// Errors if an earlier failure broke the communicator.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.health.check()
    }

    /// Records a failure that leaves the ranks out of step.
    pub(crate) fn poison(&mut self, e: Error) -> Error {
        self.health.poison(e)
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One synchronized step: publish `mine`, arrive and wait, check every peer agrees.
    /// On disagreement the step is finished (ranks stay in step) and the error returned.
    pub(crate) fn step(&mut self, what: &str, mine: Publication, agree: Agree) -> Result<()> {
        self.ws.publish(mine);
        if let Err(e) = self.ws.arrive_and_wait(what) {
            return Err(self.poison(e));
        }
        let me = self.ws.rank();
        let mut problem = None;
        for p in (0..self.ws.world_size()).filter(|&p| p != me) {
            let theirs = self.ws.publication(p);
            if theirs.step != self.ws.step() {
                let e = Error::protocol(format!(
                    "rank {p} is at collective step {} while rank {me} is at step {}; \
                     every rank must call the same collectives in the same order",
                    theirs.step,
                    self.ws.step()
                ));
                self.ws.finish_step();
                return Err(self.poison(e));
            }
            const CALL: u64 = 0xff_ffff; // collective, dtype and op; the algorithm is above
            // Their call and mine in words, for the messages that name both (only on a mismatch:
            // describing allocates).
            let calls = || (describe(theirs.signature), describe(mine.signature));
            if theirs.signature & INVALID_MARK != 0 && mine.signature & INVALID_MARK == 0 {
                problem = Some(Error::invalid(format!(
                    "rank {p} passed invalid arguments to {what} (its own error says which); this call did nothing"
                )));
            } else if theirs.signature & CALL != mine.signature & CALL {
                let (their_call, my_call) = calls();
                problem =
                    Some(Error::invalid(format!("rank {p} called {their_call} while rank {me} called {my_call}")));
            } else if agree.count && theirs.count != mine.count {
                problem = Some(Error::invalid(format!(
                    "{what}: rank {p} passed {} elements, rank {me} passed {}; counts must match",
                    theirs.count, mine.count
                )));
            } else if theirs.signature & !INVALID_MARK != mine.signature & !INVALID_MARK {
                let (their_call, my_call) = calls();
                problem = Some(Error::invalid(format!(
                    "rank {p} runs {their_call} while rank {me} runs {my_call}; set the same WEAVE_ALGO on every rank"
                )));
            } else if agree.root && theirs.root != mine.root {
                problem = Some(Error::invalid(format!(
                    "{what}: rank {p} named root {}, rank {me} named root {}",
                    theirs.root, mine.root
                )));
            }
            if problem.is_some() {
                break;
            }
        }
        if let Some(e) = problem {
            self.ws.finish_step();
            return Err(e);
        }
        Ok(())
    }

    /// A synchronization inside a step (no publication).
    pub(crate) fn phase(&mut self, what: &str) -> Result<()> {
        self.ws.arrive_and_wait(what).map_err(|e| self.poison(e))
    }

    /// Takes part in one step with an "invalid" mark so every peer fails too, then returns
    /// `err` (the local reason).
    pub(crate) fn fail_step(&mut self, what: &str, signature: u64, err: Error) -> Error {
        let mine = Publication { signature: signature | INVALID_MARK, ..Publication::default() };
        match self.step(what, mine, Agree { count: false, root: false }) {
            Ok(()) => self.ws.finish_step(),
            Err(e) if e.is_fatal() => return e,
            Err(_) => {}
        }
        err
    }
}

/// Collective: whether every rank can read every other rank's memory with `process_vm_readv`
/// (same host, ptrace permitted). Every rank reads, for each process that holds peers, the
/// owner line (see [`workspace`]) of one of them through cross-memory attach at the address
/// the line names and compares it with the line as mapped; the verdicts, written to the owner
/// lines, are agreed through one arrival of the workspace. Returns every rank's pid when it
/// works.
fn probe_cma(ws: &mut Workspace) -> Result<Option<Vec<i32>>> {
    let (n, me) = (ws.world_size(), ws.rank());
    let mut pids = Vec::with_capacity(n);
    let mut ok = true;
    // Permission is a matter of the process, not the rank: ranks that are threads of one
    // process (thread-rank tests, 1,024 of them) are probed once, not once per rank.
    let mut probed = std::collections::HashSet::new();
    for r in 0..n {
        let line = ws.owner(r);
        if line[0] != workspace::OWNER_MAGIC | r as u64 {
            return Err(Error::protocol(format!("rank {r}'s host workspace has no owner line")));
        }
        let pid = i32::try_from(line[1])
            .map_err(|_| Error::protocol(format!("rank {r}'s host workspace names process id {}", line[1])))?;
        pids.push(pid);
        if r != me && probed.insert(pid) {
            let mut seen = [0u8; 8 * workspace::OWNER_WORDS];
            let read = cma_read(pid, ws.owner_line_address(r), &mut seen);
            ok &= read.is_ok() && seen.chunks_exact(8).zip(line).all(|(b, w)| b == w.to_ne_bytes());
        }
    }
    ws.set_verdict(u64::from(ok));
    ws.arrive_and_wait("cross-memory attach probe")?;
    Ok((0..n).all(|r| ws.verdict(r) == 1).then_some(pids))
}

/// Reads `out.len()` bytes at `remote` in process `pid` (cross-memory attach), in as many
/// system calls as it takes.
pub(crate) fn cma_read(pid: i32, remote: u64, out: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < out.len() {
        let want = out.len() - done;
        let mut local = [std::io::IoSliceMut::new(&mut out[done..])];
        let remote_iov = [nix::sys::uio::RemoteIoVec { base: remote as usize + done, len: want }];
        let n = nix::sys::uio::process_vm_readv(nix::unistd::Pid::from_raw(pid), &mut local, &remote_iov)
            .map_err(|e| Error::errno(format!("process_vm_readv of {want} bytes from pid {pid}"), e))?;
        if n == 0 {
            return Err(Error::protocol(format!("process_vm_readv from pid {pid} made no progress")));
        }
        done += n;
    }
    Ok(())
}

/// The protocol of a collective that passes its elements through scratch in `chunks` (see
/// [`chunks`] and the module doc): for each chunk (offset `o`, length `k`), `stage(e, o, k)` puts
/// this rank's part into its scratch, one step named `what` publishes `mine` and checks that
/// every rank agrees as `agree` says, and `take(e, o, k)` takes what it needs from the ranks'
/// scratch; then the step ends.
#[inline]
pub(crate) fn in_chunks(
    e: &mut HostEngine,
    chunks: impl Iterator<Item = (usize, usize)>,
    what: &str,
    mine: Publication,
    agree: Agree,
    mut stage: impl FnMut(&mut HostEngine, usize, usize) -> Result<()>,
    mut take: impl FnMut(&mut HostEngine, usize, usize) -> Result<()>,
) -> Result<()> {
    for (o, k) in chunks {
        stage(e, o, k)?;
        e.step(what, mine, agree)?;
        take(e, o, k)?;
        e.ws.finish_step();
    }
    Ok(())
}

/// Stages input chunk `[o, o + k)` of `send` into this rank's scratch at element `at`.
///
/// # Safety
/// `send + o` valid for `k` reads.
#[inline]
pub(crate) unsafe fn stage_chunk<T: Element>(
    e: &HostEngine,
    send: *const T,
    o: usize,
    k: usize,
    at: usize,
) -> Result<()> {
    // SAFETY: forwarded from the caller; `scratch` checked that the area holds k elements.
    unsafe { copy(send.add(o), scratch::<T>(&e.ws, e.ws.rank(), at, k)?, k) };
    Ok(())
}

/// Reduces every rank's scratch elements `[elem, elem + len)` of the current step, in rank
/// order, with `op` into `out`, without allocating for up to 64 ranks.
///
/// # Safety
/// `out` valid for `len` writes and disjoint from every rank's range; every rank finished
/// writing its range before the step's arrival and does not write it until the next step.
#[inline]
pub(crate) unsafe fn reduce_scratch<T: Element>(
    e: &HostEngine,
    op: ReduceOp,
    elem: usize,
    len: usize,
    out: *mut T,
) -> Result<()> {
    let n = e.ws.world_size();
    let mut srcs = crate::per_rank::PerRank::new(n, std::ptr::null::<T>());
    let srcs = srcs.as_mut_slice();
    for (r, src) in srcs.iter_mut().enumerate() {
        *src = scratch::<T>(&e.ws, r, elem, len)?;
    }
    // SAFETY: every source is a rank's stable scratch range of `len` elements; `out` as the
    // caller promised.
    unsafe { reduce_raw(op, n, out, srcs, len) };
    Ok(())
}

/// What a rank publishes for a call of `collective` on `count` elements of `T` (with `op`,
/// `algo` and `root` where the collective has them): the signature every rank must share, the
/// count and the root.
#[inline]
pub(crate) fn call_publication<T: Element>(
    collective: Collective,
    op: Option<ReduceOp>,
    algo: Algorithm,
    count: usize,
    root: usize,
) -> Publication {
    let signature = signature(collective, T::DTYPE, op, algo);
    Publication { signature, count: count as u64, root: root as u64, ..Publication::default() }
}

/// Scratch capacity in elements of `T`.
pub(crate) fn capacity<T: Element>(ws: &Workspace) -> usize {
    ws.scratch_bytes() / std::mem::size_of::<T>()
}

/// The chunks of a pass over `count` elements through a scratch area of `cap` elements, as
/// (offset, length) in order. At least one, empty when `count` is 0, so that every rank takes
/// part in a step even with nothing to move.
pub(crate) fn chunks(count: usize, cap: usize) -> impl Iterator<Item = (usize, usize)> {
    let steps = count.div_ceil(cap.max(1)).max(1);
    (0..steps).map(move |s| {
        let o = s * cap;
        (o, (count - o).min(cap))
    })
}

/// Typed address of element `elem` of `rank`'s scratch, valid for `len` elements.
pub(crate) fn scratch<T: Element>(ws: &Workspace, rank: usize, elem: usize, len: usize) -> Result<*mut T> {
    let sz = std::mem::size_of::<T>();
    Ok(ws.scratch(rank, elem * sz, len * sz)?.cast::<T>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_count() {
        assert_eq!(chunks(0, 5).collect::<Vec<_>>(), [(0, 0)]);
        assert_eq!(chunks(12, 5).collect::<Vec<_>>(), [(0, 5), (5, 5), (10, 2)]);
    }
}
