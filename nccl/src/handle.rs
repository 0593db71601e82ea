//! The object behind an `ncclComm_t`, and the registry of live handles.
//!
//! An `ncclComm_t` is `Arc::into_raw` of an [`NcclComm`]. Every call first looks the pointer up
//! in the registry of live handles, so a NULL, destroyed or foreign handle gives
//! `ncclInvalidArgument` instead of a crash, and takes its own reference, so a concurrent
//! `ncclCommDestroy` or `ncclCommAbort` never frees the object under a running call.
//!
//! The weave [`Communicator`] inside is used by one thread at a time (it is `Send`, not
//! `Sync`): calls lock the handle's state. What must not wait for a running call takes no
//! lock: `ncclCommAbort` goes through a cloned [`AbortHandle`], and `ncclCommGetAsyncError`
//! falls back to the cached error when the lock is busy.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use collectives::{AbortHandle, Communicator};

use crate::abi::{NcclCommPtr, NcclResult};
use crate::error::Fail;
use crate::premul::PreMulTable;

/// What an `ncclComm_t` holds.
pub struct NcclComm {
    /// This rank.
    pub rank: usize,
    /// Ranks of the communicator.
    pub nranks: usize,
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
}

/// Where a communicator is in its life.
pub enum State {
    /// A background init (non-blocking config, or an init inside a group).
    Initializing(JoinHandle<Result<Communicator, Fail>>),
    /// Usable.
    Ready(Box<Live>),
    /// Init failed, or the communicator broke; every call returns this.
    Failed(Fail),
    /// Destroyed or aborted (only reachable by calls that looked the handle up before).
    Gone,
}

/// A ready communicator and the stream its last call used.
pub struct Live {
    /// The weave communicator.
    pub comm: Communicator,
    /// The stream of the last call: a call on another stream first waits for it, so the
    /// calls of one communicator run in the order they were made, as NCCL's do.
    pub last_stream: usize,
}

impl NcclComm {
    /// A handle whose communicator `state` makes or holds.
    pub fn new(rank: usize, nranks: usize, device: i32, blocking: bool, state: State) -> Self {
        let abort = match &state {
            State::Ready(l) => Some(l.comm.abort_handle()),
            _ => None,
        };
        NcclComm {
            rank,
            nranks,
            device,
            blocking,
            state: Mutex::new(state),
            abort: Mutex::new(abort),
            async_code: AtomicI32::new(NcclResult::SUCCESS.0),
            async_message: Mutex::new(String::new()),
            premul: Mutex::new(PreMulTable::default()),
            grow_id: Mutex::new(None),
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

    /// Finishes a background init if it is done (`wait`: wait for it). Returns the state.
    pub fn settle<'a>(&self, mut g: MutexGuard<'a, State>, wait: bool) -> MutexGuard<'a, State> {
        let done = matches!(&*g, State::Initializing(h) if wait || h.is_finished());
        if done && let State::Initializing(h) = std::mem::replace(&mut *g, State::Gone) {
            *g = match h.join() {
                Ok(Ok(comm)) => {
                    if let Ok(mut a) = self.abort.lock() {
                        *a = Some(comm.abort_handle());
                    }
                    State::Ready(Box::new(Live { comm, last_stream: usize::MAX }))
                }
                Ok(Err(fail)) => {
                    self.record_async(&fail);
                    State::Failed(fail)
                }
                Err(_) => {
                    let fail = Fail::new(NcclResult::INTERNAL_ERROR, "communicator init panicked; please report it");
                    self.record_async(&fail);
                    State::Failed(fail)
                }
            };
        }
        g
    }

    /// Runs `f` on the ready communicator (waiting for a background init first).
    pub fn with_live<R>(&self, f: impl FnOnce(&mut Live) -> Result<R, Fail>) -> Result<R, Fail> {
        let g = self.lock()?;
        let mut g = self.settle(g, true);
        match &mut *g {
            State::Ready(live) => {
                let r = f(live);
                if let Err(fail) = &r
                    && fail.code != NcclResult::INVALID_ARGUMENT
                    && fail.code != NcclResult::INVALID_USAGE
                {
                    self.record_async(fail);
                }
                r
            }
            State::Failed(fail) => Err(fail.clone()),
            State::Initializing(_) => Err(Fail::new(NcclResult::INTERNAL_ERROR, "init did not settle")),
            State::Gone => Err(Fail::usage("the communicator was destroyed or aborted")),
        }
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

    /// The id of the next grow, once (an id is good for one grow).
    pub fn take_grow_id(&self) -> Option<comm_core::bootstrap::UniqueId> {
        self.grow_id.lock().ok().and_then(|mut g| g.take())
    }

    /// The abort handle, once the communicator is ready.
    pub fn abort_handle(&self) -> Option<AbortHandle> {
        self.abort.lock().ok().and_then(|a| a.clone())
    }
}

/// Addresses of the live handles.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live() -> Result<MutexGuard<'static, Option<HashSet<usize>>>, Fail> {
    LIVE.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "handle registry poisoned by a panic"))
}

/// Makes `comm` a handle C can hold.
pub fn register(comm: NcclComm) -> Result<NcclCommPtr, Fail> {
    let mut set = live()?;
    let p = Arc::into_raw(Arc::new(comm)) as NcclCommPtr;
    set.get_or_insert_with(HashSet::new).insert(p as usize);
    Ok(p)
}

/// The handle behind `p`, with a reference of its own.
pub fn lookup(p: NcclCommPtr) -> Result<Arc<NcclComm>, Fail> {
    if p.is_null() {
        return Err(Fail::invalid("comm is NULL"));
    }
    let set = live()?;
    if !set.as_ref().is_some_and(|s| s.contains(&(p as usize))) {
        return Err(Fail::invalid(format!(
            "comm {p:p} is not a live communicator of this library (destroyed already, or never made by it)"
        )));
    }
    // SAFETY: `p` is in the registry, so it came from Arc::into_raw in `register` and the
    // registry still owns that reference (we hold the registry lock).
    unsafe {
        Arc::increment_strong_count(p as *const NcclComm);
        Ok(Arc::from_raw(p as *const NcclComm))
    }
}

/// Removes `p` from the registry and returns the registry's reference.
pub fn unregister(p: NcclCommPtr) -> Result<Arc<NcclComm>, Fail> {
    if p.is_null() {
        return Err(Fail::invalid("comm is NULL"));
    }
    let mut set = live()?;
    if !set.as_mut().is_some_and(|s| s.remove(&(p as usize))) {
        return Err(Fail::invalid(format!("comm {p:p} is not a live communicator (destroyed twice?)")));
    }
    // SAFETY: `p` was in the registry (removed just now under the lock): it came from
    // Arc::into_raw and this takes back the registry's reference exactly once.
    Ok(unsafe { Arc::from_raw(p as *const NcclComm) })
}
