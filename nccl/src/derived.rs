//! Communicators derived from another inside a group: `ncclCommSplit`, `ncclCommShrink` and a
//! member's `ncclCommGrow` asked for between `ncclGroupStart` and `ncclGroupEnd` hand their
//! handle out at once ([`State::AwaitingGroup`](crate::handle::State::AwaitingGroup)) and are
//! made at the group's end, as NCCL makes them: so one thread may derive the communicators of
//! several ranks of its process (one per GPU) in one group, where making each at once would wait
//! for the next rank's call, made by the same thread. Each parent's derivations are made in the
//! order asked (they are collective over its ranks), on one thread per parent.

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use comm_core::bootstrap::UniqueId;

use crate::abi::{NcclCommPtr, NcclResult};
use crate::api_comm::clear_out;
use crate::config::DerivedConfig;
use crate::error::{Fail, guard};
use crate::group;
use crate::handle::{self, Derived, NcclComm};

/// The frame of `ncclCommSplit`, `ncclCommShrink` and `ncclCommGrow`: `newcomm` cleared first
/// (a refused call leaves the caller no handle), then `body`, whose failure an open group
/// remembers, as NCCL's does, so that its `ncclGroupEnd` fails too.
///
/// # Safety
/// `newcomm` is NULL or writable.
pub(crate) unsafe fn derivation_call(
    symbol: &'static str,
    newcomm: *mut NcclCommPtr,
    body: impl FnOnce() -> Result<(), Fail>,
) -> NcclResult {
    guard(symbol, || {
        group::recording(|| {
            // SAFETY: NULL or writable, as the caller guarantees.
            unsafe { clear_out(newcomm, "newcomm") }?;
            body()
        })
    })
}

/// Which derivation of the parent.
pub(crate) enum Derivation {
    /// `ncclCommSplit(color, key)`; color `None` is `NCCL_SPLIT_NOCOLOR`.
    Split { color: Option<u32>, key: c_int },
    /// `ncclCommShrink` without these ranks.
    Shrink { excluded: Vec<usize> },
    /// A member's `ncclCommGrow` by `joiners` ranks (rank 0 holds the joiners' id).
    Grow { joiners: usize, rank0_id: Option<UniqueId> },
}

/// A derivation asked for inside a group, made at its `ncclGroupEnd`.
pub(crate) struct DerivedRequest {
    /// The communicator derived from.
    pub(crate) parent: Arc<NcclComm>,
    /// What is derived.
    pub(crate) derivation: Derivation,
    /// The new communicator's `commName` (for the log).
    pub(crate) name: String,
    /// The handle handed out, awaiting the group's end (none for `NCCL_SPLIT_NOCOLOR`).
    pub(crate) handle: Option<Arc<NcclComm>>,
    /// Set once [`make`](Self::make) began: a grow that ran used rank 0's id.
    pub(crate) started: AtomicBool,
}

impl DerivedRequest {
    /// Derives this rank's communicator (collective over the parent's ranks) and hands it to the
    /// handle; a failure goes to the handle too, and is returned.
    pub(crate) fn make(&self) -> Result<(), Fail> {
        self.started.store(true, Ordering::Release);
        let made = derive(&self.parent, &self.derivation, &self.name);
        let Some(handle) = &self.handle else { return made.map(drop) };
        let made = made.and_then(|m| {
            m.ok_or_else(|| {
                Fail::new(NcclResult::INTERNAL_ERROR, "a split with a color made no communicator; please report it")
            })
        });
        let failed = made.as_ref().err().cloned();
        handle.take_derived(made)?;
        failed.map_or(Ok(()), Err)
    }

    /// Gives the derivation up, its group having failed (or been simulated) before it ran: its
    /// handle fails with `why`.
    pub(crate) fn abandon(&self, why: &Fail) {
        // Rank 0's id of a grow that never ran goes back to the parent: the joiners hold it, and
        // a grow asked again uses it.
        if let Derivation::Grow { rank0_id: Some(id), .. } = &self.derivation
            && !self.started.load(Ordering::Acquire)
        {
            self.parent.give_back_grow_id(id.clone());
        }
        if let Some(h) = &self.handle {
            let _ = h.take_derived(Err(why.clone().context("the group of this call did not run it")));
        }
    }
}

/// Makes `derivation` of `parent` for this rank now (collective over the parent's ranks):
/// `None` for a split with `NCCL_SPLIT_NOCOLOR`.
pub(crate) fn derive(parent: &NcclComm, derivation: &Derivation, name: &str) -> Result<Option<Derived>, Fail> {
    match derivation {
        Derivation::Split { color, key } => crate::api_split::split(parent, *color, *key, name),
        Derivation::Shrink { excluded } => crate::api_elastic::shrink(parent, excluded, name).map(Some),
        Derivation::Grow { joiners, rank0_id } => {
            crate::api_elastic::grow(parent, *joiners, rank0_id.clone(), name).map(Some)
        }
    }
}

/// Derives `derivation` of `parent` for a caller that configured the new communicator as
/// `config` says: inside a group, hands out (through `out`) a handle awaiting the group's end and
/// queues the request; else makes it now and hands out its handle. `out` keeps NULL for a split
/// with `NCCL_SPLIT_NOCOLOR`.
///
/// # Safety
/// `out` is non-null and writable.
pub(crate) unsafe fn derive_or_queue(
    parent: Arc<NcclComm>,
    derivation: Derivation,
    config: &DerivedConfig,
    out: *mut NcclCommPtr,
) -> Result<(), Fail> {
    let gets_handle = !matches!(derivation, Derivation::Split { color: None, .. });
    if group::in_group() {
        let handle = if gets_handle {
            let awaiting = NcclComm::awaiting_group(parent.device, config.blocking);
            let p = handle::register(awaiting.with_split_share(config.split_share))?;
            // SAFETY: non-null and writable, as the caller guarantees.
            unsafe { *out = p };
            Some(handle::lookup(p)?)
        } else {
            None
        };
        let started = AtomicBool::new(false);
        group::add_derived(DerivedRequest { parent, derivation, name: config.name.clone(), handle, started });
        return Ok(());
    }
    let Some(made) = derive(&parent, &derivation, &config.name)? else { return Ok(()) };
    let handle = NcclComm::derived(made, parent.device, config.blocking);
    let p = handle::register(handle.with_split_share(config.split_share))?;
    // SAFETY: non-null and writable, as the caller guarantees.
    unsafe { *out = p };
    Ok(())
}
