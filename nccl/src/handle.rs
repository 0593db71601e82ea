//! The object behind an `ncclComm_t`, and the registry of live handles.
//!
//! An `ncclComm_t` is an opaque number, never handed out twice in a process, that the registry
//! of live handles maps to its [`NcclComm`]. Every call first looks it up there, so a NULL,
//! destroyed or foreign handle gives `ncclInvalidArgument` instead of a crash, even after the
//! process made new communicators (an object's address may be reused by the allocator, a
//! handle's number never is), and takes its own reference, so a concurrent
//! `ncclCommDestroy` or `ncclCommAbort` never frees the object under a running call.
//!
//! The weave [`Communicator`] inside is used by one thread at a time (it is `Send`, not
//! `Sync`): a call locks it, in its [`Family`] (a teardown waits there for a running call too).
//! What must not wait for a running call takes no lock: `ncclCommAbort` goes through a cloned
//! [`AbortHandle`], and `ncclCommGetAsyncError` falls back to the cached error when the lock is
//! busy.
//!
//! **Families (`splitShare`).** A split that keeps every rank in its order, of a parent made with
//! `splitShare = 1` (`ncclConfig_t` or `NCCL_COMM_SPLIT_SHARE_RESOURCES`), shares the parent's
//! weave communicator instead of building one: its workspaces, connections and GPU memory. The
//! handles of a family run their calls through that one communicator, one at a time, in the
//! order they are made, and on the GPU in that order too (a call on another stream first waits
//! for the end of the family's last call), which is how NCCL runs a family sharing its
//! resources. As in NCCL, aborting or revoking one member makes every member unusable, and the
//! program issues the calls of a family from one thread at a time in the same order on every
//! rank. The communicator goes with the family's last handle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use collectives::{AbortHandle, Communicator};

use crate::abi::{NcclCommPtr, NcclResult};
use crate::background_init::BackgroundInit;
use crate::cuda::EndMark;
use crate::error::Fail;
use crate::premul::PreMulTable;

/// What an `ncclComm_t` holds.
pub struct NcclComm {
    /// This rank (set once more by [`take_derived`](Self::take_derived) for a communicator
    /// derived at a group's end).
    rank: AtomicUsize,
    /// Ranks of the communicator (as `rank`).
    nranks: AtomicUsize,
    /// The CUDA device (-1 in the CPU test mode).
    pub device: i32,
    /// Whether calls block (`ncclConfig_t::blocking`, default 1).
    pub blocking: bool,
    /// The communicator, or the init that makes it.
    state: Mutex<State>,
    /// Aborts the communicator without its lock (set once it is ready).
    abort: Mutex<Option<AbortHandle>>,
    /// The first asynchronous error (`ncclSuccess` while none).
    async_code: AtomicI32,
    /// Its message.
    async_message: Mutex<String>,
    /// Operators made by `ncclRedOpCreatePreMulSum` on this communicator.
    pub premul: Mutex<PreMulTable>,
    /// The id `ncclCommGetUniqueId` handed out for the next `ncclCommGrow` (rank 0).
    grow_id: Mutex<Option<comm_core::bootstrap::UniqueId>>,
    /// Whether this communicator's splits that keep every rank share its weave communicator
    /// (`splitShare`, see the module doc).
    pub split_share: bool,
    /// Names the family: the same for a parent and the splits sharing its communicator, unique
    /// otherwise (a group runs a family's calls as one communicator's).
    family_key: AtomicUsize,
}

/// The weave communicator behind the handles of one family (see the module doc): one handle,
/// or a parent and the splits that share it.
pub struct Family {
    /// `None` once the last handle went.
    live: Mutex<Option<Live>>,
    /// Handles of the family not yet torn down.
    members: AtomicUsize,
}

impl Family {
    /// A family of one handle around `comm`.
    pub fn new(comm: Communicator) -> Arc<Self> {
        Arc::new(Family { live: Mutex::new(Some(Live::new(comm))), members: AtomicUsize::new(1) })
    }

    /// Counts one more handle of the family (a split sharing it).
    pub fn join(self: &Arc<Self>) -> Arc<Self> {
        self.members.fetch_add(1, Ordering::AcqRel);
        Arc::clone(self)
    }

    /// Handles of the family not yet torn down.
    pub fn members(&self) -> usize {
        self.members.load(Ordering::Acquire)
    }

    /// Locks the communicator (a poisoned lock is an internal error).
    pub fn lock(&self) -> Result<MutexGuard<'_, Option<Live>>, Fail> {
        self.live.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "communicator lock poisoned by a panic"))
    }

    /// Tries the lock without waiting (`None` when a call of the family holds it).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, Option<Live>>> {
        self.live.try_lock().ok()
    }

    /// After a wait for all of the context's work, begun when `batches` batches had run: when no
    /// batch ran since, nothing is left to order after (see [`Live::forget_stream`]).
    pub fn forget_finished_stream(&self, batches: u64) -> Result<(), Fail> {
        if let Some(live) = self.lock()?.as_mut()
            && live.batches() == batches
        {
            live.forget_stream();
        }
        Ok(())
    }

    /// One handle leaves: the communicator when it was the last one, else `None` (the others
    /// keep it).
    pub fn leave(&self) -> Result<Option<Live>, Fail> {
        if self.members.fetch_sub(1, Ordering::AcqRel) == 1 { Ok(self.lock()?.take()) } else { Ok(None) }
    }
}

/// How often a call waiting for a background init looks whether it is over ([`NcclComm::settled`]).
const SETTLE_NAP: std::time::Duration = std::time::Duration::from_millis(1);

/// Numbers the families of this process.
static FAMILIES: AtomicUsize = AtomicUsize::new(1);

/// Where a communicator is in its life.
pub enum State {
    /// A background init (non-blocking config, or an init inside a group).
    Initializing(BackgroundInit),
    /// Usable: the communicator of its family.
    Ready(Arc<Family>),
    /// Init failed, or the communicator broke; every call returns this.
    Failed(Fail),
    /// Destroyed or aborted (only reachable by calls that looked the handle up before).
    Gone,
    /// A split, shrink or grow asked for inside a group: the group's `ncclGroupEnd` makes it
    /// ([`NcclComm::take_derived`], `derived.rs`).
    AwaitingGroup,
}

/// What a split, shrink or grow made of one rank: its place in the new communicator and the
/// communicator.
pub struct Derived {
    /// This rank in the new communicator.
    pub rank: usize,
    /// Its ranks.
    pub nranks: usize,
    /// The new communicator: [`State::Ready`].
    pub state: State,
    /// The parent's family key where the split shares the parent's communicator (`splitShare`).
    pub family_key: Option<usize>,
}

impl State {
    /// A usable communicator, the first of its family.
    pub fn ready(comm: Communicator) -> Self {
        State::Ready(Family::new(comm))
    }
}

/// A ready communicator and where its last call ended.
pub struct Live {
    /// The weave communicator.
    pub comm: Communicator,
    /// The stream of the last batch of calls while its work may still be queued: a call on
    /// another stream first waits for that batch's end (`end_mark`), so the calls of one
    /// communicator (or family) run in the order they were made, as NCCL's do. `None` when
    /// nothing is left to wait for.
    last_stream: Option<usize>,
    /// Where the last batch ends: an event recorded on `last_stream`, so that waiting for it never
    /// touches a stream the program may have destroyed since. Made by the first batch.
    end_mark: Option<EndMark>,
    /// Batches of calls run so far (tells a teardown whether a call came after its wait).
    batches: u64,
    /// Whether a batch was captured into a CUDA graph: each run of that graph records the end
    /// mark again, so every later eager batch waits for the mark, whatever its stream.
    in_graphs: bool,
}

impl Live {
    fn new(comm: Communicator) -> Self {
        Live { comm, last_stream: None, end_mark: None, batches: 0, in_graphs: false }
    }

    /// The stream of the last batch, while there is one to wait for.
    pub fn stream_to_follow(&self) -> Option<usize> {
        self.last_stream
    }

    /// Whether a batch was captured into a CUDA graph (see the field).
    pub fn in_graphs(&self) -> bool {
        self.in_graphs
    }

    /// Makes `stream` wait for the end of the last batch, eager or a run of a captured one (its
    /// event stays valid whatever became of its stream, so a failure here is `stream`'s own).
    pub fn follow_on(&mut self, stream: usize) -> Result<(), Fail> {
        match &self.end_mark {
            Some(mark) if self.last_stream.is_some() || self.in_graphs => Ok(mark.make_wait(stream)?),
            _ => Ok(()),
        }
    }

    /// Inside a stream capture on `stream`: each run of the graph first waits for the end of the
    /// batch before its launch, eager or another graph's (an external wait on the end mark, made
    /// here if no batch made it yet: later eager batches record it).
    pub fn follow_in_graph(&mut self, stream: usize) -> Result<(), Fail> {
        if self.end_mark.is_none() {
            self.end_mark = Some(EndMark::new()?);
        }
        match &self.end_mark {
            Some(mark) => Ok(mark.make_wait_in_graph(stream)?),
            None => Ok(()),
        }
    }

    /// Records a batch captured on `stream` (with the communicator's context current): each run
    /// of the graph marks its end, which later batches wait for.
    pub fn ran_in_graph(&mut self, stream: usize) -> Result<(), Fail> {
        let mark = match self.end_mark.take() {
            Some(mark) => mark,
            None => EndMark::new()?,
        };
        let recorded = mark.record_in_graph(stream);
        self.end_mark = Some(mark);
        self.in_graphs = true;
        Ok(recorded?)
    }

    /// Records a batch of calls enqueued on `stream` (with the communicator's context current).
    /// Where its end cannot be marked, the next call waits for nothing (and this one fails).
    pub fn ran_on(&mut self, stream: usize) -> Result<(), Fail> {
        self.batches += 1;
        self.last_stream = None;
        let mark = match self.end_mark.take() {
            Some(mark) => mark,
            None => EndMark::new()?,
        };
        let recorded = mark.record(stream);
        self.end_mark = Some(mark);
        self.last_stream = recorded.is_ok().then_some(stream);
        Ok(recorded?)
    }

    /// Batches of calls run so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Forgets the last batch: its work is done (the context was synchronized).
    pub fn forget_stream(&mut self) {
        self.last_stream = None;
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // The event goes while the communicator still holds its CUDA context.
        self.end_mark.take();
    }
}

impl NcclComm {
    /// A handle whose communicator `state` makes or holds.
    pub fn new(rank: usize, nranks: usize, device: i32, blocking: bool, state: State) -> Self {
        let abort = match &state {
            State::Ready(family) => family.lock().ok().and_then(|l| l.as_ref().map(|l| l.comm.abort_handle())),
            _ => None,
        };
        NcclComm {
            rank: AtomicUsize::new(rank),
            nranks: AtomicUsize::new(nranks),
            device,
            blocking,
            state: Mutex::new(state),
            abort: Mutex::new(abort),
            async_code: AtomicI32::new(NcclResult::SUCCESS.0),
            async_message: Mutex::new(String::new()),
            premul: Mutex::new(PreMulTable::default()),
            grow_id: Mutex::new(None),
            split_share: false,
            family_key: AtomicUsize::new(FAMILIES.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The handle of what a split, shrink or grow (`made`) made of this rank.
    pub fn derived(made: Derived, device: i32, blocking: bool) -> Self {
        let family_key = made.family_key;
        let handle = NcclComm::new(made.rank, made.nranks, device, blocking, made.state);
        if let Some(key) = family_key {
            handle.family_key.store(key, Ordering::Release);
        }
        handle
    }

    /// A handle whose communicator is derived at the end of the group it was asked for in
    /// ([`State::AwaitingGroup`]): its rank and size are 0 until then.
    pub fn awaiting_group(device: i32, blocking: bool) -> Self {
        NcclComm::new(0, 0, device, blocking, State::AwaitingGroup)
    }

    /// Makes this handle, awaiting its group's end, the communicator derived for it (or a
    /// failed one). A handle destroyed meanwhile takes nothing: a communicator shared with the
    /// parent's family leaves it again, one of its own goes.
    pub fn take_derived(&self, made: Result<Derived, Fail>) -> Result<(), Fail> {
        // Taken before the handle's lock: the family's lock may be held by a running call of
        // another of its handles, and the handle's lock must stay free meanwhile (an abort, an
        // async-error query).
        let abort = match &made {
            Ok(Derived { state: State::Ready(family), .. }) => {
                family.lock().ok().and_then(|live| live.as_ref().map(|live| live.comm.abort_handle()))
            }
            _ => None,
        };
        let mut g = self.lock()?;
        if !matches!(&*g, State::AwaitingGroup) {
            drop(g);
            if let Ok(Derived { state: State::Ready(family), family_key: Some(_), .. }) = made {
                family.leave()?;
            }
            return Ok(());
        }
        match made {
            Ok(made) => {
                self.rank.store(made.rank, Ordering::Release);
                self.nranks.store(made.nranks, Ordering::Release);
                if let Some(key) = made.family_key {
                    self.family_key.store(key, Ordering::Release);
                }
                if let Some(handle) = abort
                    && let Ok(mut a) = self.abort.lock()
                {
                    *a = Some(handle);
                }
                *g = made.state;
            }
            Err(fail) => {
                self.record_async(&fail);
                *g = State::Failed(fail);
            }
        }
        Ok(())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank.load(Ordering::Acquire)
    }

    /// Ranks of the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks.load(Ordering::Acquire)
    }

    /// Names the family (see the field's doc).
    pub fn family_key(&self) -> usize {
        self.family_key.load(Ordering::Acquire)
    }

    /// Fails while the handle awaits the end of the group that derives it: its rank, size and
    /// communicator do not exist yet.
    pub fn check_made(&self) -> Result<(), Fail> {
        match &*self.lock()? {
            State::AwaitingGroup => Err(awaiting_group()),
            _ => Ok(()),
        }
    }

    /// What a communicator derived from this one inherits where its config is silent.
    pub(crate) fn derived_config(&self) -> crate::config::DerivedConfig {
        crate::config::DerivedConfig { blocking: self.blocking, name: String::new(), split_share: self.split_share }
    }

    /// `self` with its splits sharing its communicator, or not (`splitShare`).
    pub fn with_split_share(mut self, on: bool) -> Self {
        self.split_share = on;
        self
    }

    /// The family of this handle's communicator (waiting for a background init first).
    pub fn family(&self) -> Result<Arc<Family>, Fail> {
        let g = self.settled()?;
        match &*g {
            State::Ready(family) => Ok(Arc::clone(family)),
            State::Failed(fail) => Err(fail.clone()),
            State::Initializing(_) => Err(Fail::new(NcclResult::INTERNAL_ERROR, "init did not settle")),
            State::Gone => Err(Fail::usage("the communicator was destroyed or aborted")),
            State::AwaitingGroup => Err(awaiting_group()),
        }
    }

    /// Locks the state (a poisoned lock is an internal error).
    pub fn lock(&self) -> Result<MutexGuard<'_, State>, Fail> {
        self.state.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "communicator lock poisoned by a panic"))
    }

    /// Tries the lock without waiting (`None` when another call holds it).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        self.state.try_lock().ok()
    }

    /// The state once a background init is over: waits for the init without holding the state
    /// lock (in naps of `SETTLE_NAP`), so that `ncclCommAbort` and `ncclCommGetAsyncError`
    /// from other threads see the init as running meanwhile instead of waiting for it. Bounded:
    /// an init ends within the communicator's timeout.
    pub fn settled(&self) -> Result<MutexGuard<'_, State>, Fail> {
        loop {
            let g = self.lock()?;
            if !matches!(&*g, State::Initializing(h) if !h.is_finished()) {
                return Ok(self.settle(g));
            }
            drop(g);
            std::thread::sleep(SETTLE_NAP);
        }
    }

    /// Finishes a background init if it is done; returns the state.
    pub fn settle<'a>(&self, mut g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let done = matches!(&*g, State::Initializing(h) if h.is_finished());
        if done && let State::Initializing(h) = std::mem::replace(&mut *g, State::Gone) {
            *g = match h.join() {
                Ok(comm) => {
                    if let Ok(mut a) = self.abort.lock() {
                        *a = Some(comm.abort_handle());
                    }
                    State::ready(comm)
                }
                Err(fail) => {
                    self.record_async(&fail);
                    State::Failed(fail)
                }
            };
        }
        g
    }

    /// Runs `f` on the ready communicator (waiting for a background init first).
    pub fn with_live<R>(&self, f: impl FnOnce(&mut Live) -> Result<R, Fail>) -> Result<R, Fail> {
        let family = self.family()?;
        let mut live = family.lock()?;
        let Some(live) = live.as_mut() else {
            return Err(Fail::usage("the communicator was destroyed (its family's last handle went)"));
        };
        let r = f(live);
        if let Err(fail) = &r
            && fail.code != NcclResult::INVALID_ARGUMENT
            && fail.code != NcclResult::INVALID_USAGE
        {
            self.record_async(fail);
        }
        r
    }

    /// Remembers the first error that breaks the communicator (for `ncclCommGetAsyncError`).
    pub fn record_async(&self, fail: &Fail) {
        let ok = NcclResult::SUCCESS.0;
        if self.async_code.compare_exchange(ok, fail.code.0, Ordering::AcqRel, Ordering::Acquire).is_ok()
            && let Ok(mut m) = self.async_message.lock()
        {
            *m = fail.message.clone();
        }
    }

    /// The first recorded asynchronous error.
    pub fn async_error(&self) -> Option<Fail> {
        let code = NcclResult(self.async_code.load(Ordering::Acquire));
        if code == NcclResult::SUCCESS {
            return None;
        }
        let message = self.async_message.lock().map(|m| m.clone()).unwrap_or_default();
        Some(Fail::new(code, message))
    }

    /// Keeps the id `ncclCommGetUniqueId` handed out, for the next grow.
    pub fn set_grow_id(&self, id: comm_core::bootstrap::UniqueId) {
        if let Ok(mut g) = self.grow_id.lock() {
            *g = Some(id);
        }
    }

    /// Gives back the id a grow took and did not use (its group was abandoned), unless a newer
    /// one was handed out meanwhile.
    pub fn give_back_grow_id(&self, id: comm_core::bootstrap::UniqueId) {
        if let Ok(mut g) = self.grow_id.lock()
            && g.is_none()
        {
            *g = Some(id);
        }
    }

    /// The id of the next grow, once (an id is good for one grow).
    pub fn take_grow_id(&self) -> Option<comm_core::bootstrap::UniqueId> {
        self.grow_id.lock().ok().and_then(|mut g| g.take())
    }

    /// The abort handle, once the communicator is ready.
    pub fn abort_handle(&self) -> Option<AbortHandle> {
        self.abort.lock().ok().and_then(|a| a.clone())
    }
}

/// The failure of a call on a handle that awaits the end of the group that derives it.
fn awaiting_group() -> Fail {
    Fail::usage(
        "this communicator comes from an ncclCommSplit, ncclCommShrink or ncclCommGrow inside a group that is still \
         open: use it after the group's ncclGroupEnd",
    )
}

/// Whether the handles `a` and `b` run their calls through one weave communicator (one
/// `splitShare` family, see the module doc).
pub fn share_a_communicator(a: NcclCommPtr, b: NcclCommPtr) -> Result<bool, Fail> {
    Ok(Arc::ptr_eq(&lookup(a)?.family()?, &lookup(b)?.family()?))
}

/// The live handles, by their number.
type Registry = Option<HashMap<usize, Arc<NcclComm>>>;

/// The registry of live handles.
static LIVE: Mutex<Registry> = Mutex::new(None);

/// The number of the next handle. Handles step by 16 from a page above NULL, so that they read
/// as aligned addresses in a caller's log; at 2⁶⁴ / 16 of them a process never reuses one.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(HANDLE_STEP * 256);

/// The distance between two handles' numbers.
const HANDLE_STEP: usize = 16;

fn live() -> Result<MutexGuard<'static, Registry>, Fail> {
    LIVE.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "handle registry poisoned by a panic"))
}

/// Makes `comm` a handle C can hold.
pub fn register(comm: NcclComm) -> Result<NcclCommPtr, Fail> {
    let mut map = live()?;
    let number = NEXT_HANDLE.fetch_add(HANDLE_STEP, Ordering::Relaxed);
    map.get_or_insert_with(HashMap::new).insert(number, Arc::new(comm));
    Ok(std::ptr::without_provenance_mut(number))
}

/// The handle behind `p`, with a reference of its own.
pub fn lookup(p: NcclCommPtr) -> Result<Arc<NcclComm>, Fail> {
    if p.is_null() {
        return Err(Fail::invalid("comm is NULL"));
    }
    live()?.as_ref().and_then(|map| map.get(&(p as usize)).cloned()).ok_or_else(|| {
        Fail::invalid(format!(
            "comm {p:p} is not a live communicator of this library (destroyed already, or never made by it)"
        ))
    })
}

/// Removes `p` from the registry and returns the registry's reference.
pub fn unregister(p: NcclCommPtr) -> Result<Arc<NcclComm>, Fail> {
    if p.is_null() {
        return Err(Fail::invalid("comm is NULL"));
    }
    live()?
        .as_mut()
        .and_then(|map| map.remove(&(p as usize)))
        .ok_or_else(|| Fail::invalid(format!("comm {p:p} is not a live communicator (destroyed twice?)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destroyed_handle_never_names_a_later_communicator() {
        let gone = register(NcclComm::awaiting_group(-1, true)).unwrap();
        assert!(lookup(gone).is_ok());
        drop(unregister(gone).unwrap());
        // Objects of the same size, made right after the free, that an address would reuse.
        let later: Vec<NcclCommPtr> = (0..64).map(|_| register(NcclComm::awaiting_group(-1, true)).unwrap()).collect();
        assert!(later.iter().all(|&p| p != gone), "a handle was handed out twice");
        let err = lookup(gone).err().expect("a destroyed handle must not resolve");
        assert_eq!(err.code, NcclResult::INVALID_ARGUMENT);
        assert!(err.message.contains("not a live communicator"), "{}", err.message);
        assert!(unregister(gone).is_err(), "destroyed twice");
        for p in later {
            drop(unregister(p).unwrap());
        }
    }
}
