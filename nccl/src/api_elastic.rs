//! Exported: NCCL 2.29's elastic calls on weave's revoke, shrink and grow
//! ([`collectives::Communicator::revoke`], [`shrink`](collectives::Communicator::shrink),
//! [`grow_at`](collectives::Communicator::grow_at)).
//!
//! | symbol | behaviour |
//! |---|---|
//! | `ncclCommRevoke(comm, 0)` | revokes: this rank's pending and later calls fail, and every reachable rank of the communicator learns it within milliseconds (NCCL's own revoke stays local); later collectives return `ncclInvalidUsage`; destroy, abort and shrink still work |
//! | `ncclCommShrink(comm, exclude, count, newcomm, config, flags)` | the ranks not excluded, renumbered in order, built without the excluded taking part (they may be dead); `NCCL_SHRINK_ABORT` first revokes the parent, so its kernels stop; an excluded caller gets `ncclInvalidArgument`; works after the parent failed |
//! | `ncclCommGetUniqueId(comm, id)` | on rank 0 of `comm`: the id joiners pass to `ncclCommGrow` (other ranks: `ncclInvalidUsage`) |
//! | `ncclCommGrow(comm, nRanks, id, rank, newcomm, config)` | members (`comm`, `id` NULL or the same, `rank` -1) keep their ranks; joiners (`comm` NULL, `id`, `rank` in [old size, nRanks)) take the others |
//!
//! Destroying or aborting the parent after a shrink waits for no excluded rank: weave's
//! teardown has no collective step.
//!
//! Inside a group a shrink or a member's grow hands its handle out at once and is made at the
//! group's `ncclGroupEnd` (`derived.rs`); a joiner's grow runs in the background as an init does.

use std::ffi::c_int;

use comm_core::bootstrap::UniqueId;

use crate::abi::{NcclCommPtr, NcclConfig, NcclResult, NcclUniqueId};
use crate::api_comm::{InitArgs, caller_device, init};
use crate::config::{read_config, read_config_fields};
use crate::derived::{Derivation, derivation_call, derive_or_queue};
use crate::error::{Fail, guard};
use crate::handle::{self, Derived, NcclComm, State};
use crate::unique_id;

/// `ncclCommShrink`'s flag: the parent may have operations in flight (they are stopped).
pub const SHRINK_ABORT: c_int = 0x01;

/// `ncclCommRevoke`: see the module documentation. `revokeFlags` must be 0.
///
/// # Safety
/// `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommRevoke(comm: NcclCommPtr, revoke_flags: c_int) -> NcclResult {
    guard("ncclCommRevoke", || {
        if revoke_flags != 0 {
            return Err(Fail::invalid(format!("revokeFlags is {revoke_flags}; only NCCL_REVOKE_DEFAULT (0) exists")));
        }
        let c = handle::lookup(comm)?;
        // Through the abort handle, without the communicator's lock: a call may be running.
        match c.abort_handle() {
            Some(h) => h.revoke(),
            None => c.with_live(|live| {
                live.comm.revoke();
                Ok(())
            })?,
        }
        Ok(())
    })
}

/// `ncclCommShrink`: see the module documentation.
///
/// # Safety
/// `exclude_ranks` holds `exclude_count` ints; `newcomm` writable; `config` NULL or initialized.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommShrink(
    comm: NcclCommPtr,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut NcclCommPtr,
    config: *mut NcclConfig,
    shrink_flags: c_int,
) -> NcclResult {
    let body = || {
        if shrink_flags & !SHRINK_ABORT != 0 {
            return Err(Fail::invalid(format!(
                "shrinkFlags {shrink_flags:#x}: only NCCL_SHRINK_DEFAULT (0) and NCCL_SHRINK_ABORT (1) exist"
            )));
        }
        let count = usize::try_from(exclude_count)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| Fail::invalid(format!("excludeRanksCount is {exclude_count}; it must be at least 1")))?;
        if exclude_ranks.is_null() {
            return Err(Fail::invalid("excludeRanksList is NULL"));
        }
        let parent = handle::lookup(comm)?;
        parent.check_made()?;
        if count > parent.nranks() {
            return Err(Fail::invalid(format!(
                "excludeRanksCount is {count}, more than the communicator's {} ranks",
                parent.nranks()
            )));
        }
        let mut excluded = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: the list holds `count` ints, as the caller guarantees.
            let r = unsafe { *exclude_ranks.add(i) };
            let r = usize::try_from(r).ok().filter(|&r| r < parent.nranks()).ok_or_else(|| {
                Fail::invalid(format!("excludeRanksList[{i}] is {r}, not a rank of {}", parent.nranks()))
            })?;
            excluded.push(r);
        }
        // SAFETY: NULL or initialized, as the caller guarantees.
        let derived = unsafe { read_config(config, &parent.derived_config()) }?;
        if shrink_flags & SHRINK_ABORT != 0
            && let Some(h) = parent.abort_handle()
        {
            h.revoke();
        }
        // SAFETY: checked non-null above.
        unsafe { derive_or_queue(parent, Derivation::Shrink { excluded }, &derived, newcomm) }
    };
    // SAFETY: `newcomm` NULL or writable, as the caller guarantees.
    unsafe { derivation_call("ncclCommShrink", newcomm, body) }
}

/// Shrinks `parent` for this rank (collective over the ranks not excluded). See
/// [`ncclCommShrink`].
pub(crate) fn shrink(parent: &NcclComm, excluded: &[usize], name: &str) -> Result<Derived, Fail> {
    let child = parent.with_live(|live| Ok(live.comm.shrink(excluded)?))?;
    let (rank, nranks) = (child.rank(), child.world_size());
    tracing::info!(target: crate::debug::NCCL, rank, "shrink {name}: rank {rank} of {nranks}, excluding {excluded:?}");
    Ok(Derived { rank, nranks, state: State::ready(child), family_key: None })
}

/// Grows `parent` by `joiners` ranks, for this member (collective over the members and the
/// joiners; rank 0 passes the joiners' id). See [`ncclCommGrow`].
pub(crate) fn grow(parent: &NcclComm, joiners: usize, rank0_id: Option<UniqueId>, name: &str) -> Result<Derived, Fail> {
    let grown = parent.with_live(|live| Ok(live.comm.grow_at(joiners, rank0_id)?.complete()?))?;
    let (rank, nranks) = (grown.rank(), grown.world_size());
    tracing::info!(target: crate::debug::NCCL, rank, "grow {name}: rank {rank} of {nranks}");
    Ok(Derived { rank, nranks, state: State::ready(grown), family_key: None })
}

/// `ncclCommGetUniqueId`: see the module documentation.
///
/// # Safety
/// `unique_id` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetUniqueId(comm: NcclCommPtr, unique_id: *mut NcclUniqueId) -> NcclResult {
    guard("ncclCommGetUniqueId", || {
        if unique_id.is_null() {
            return Err(Fail::invalid("uniqueId is NULL"));
        }
        let c = handle::lookup(comm)?;
        c.check_made()?;
        if c.rank() != 0 {
            return Err(Fail::usage(format!(
                "ncclCommGetUniqueId on rank {}: weave's grow waits for the joiners at rank 0 of the communicator, \
                 so call it there",
                c.rank()
            )));
        }
        let id = UniqueId::on_free_port(collectives::grow::grow_ip()?)?;
        let encoded = unique_id::encode(&id)?;
        c.set_grow_id(id);
        // SAFETY: checked non-null; writable as the caller guarantees.
        unsafe { *unique_id = encoded };
        Ok(())
    })
}

/// `ncclCommGrow`: see the module documentation.
///
/// # Safety
/// `unique_id` NULL or readable; `newcomm` writable; `config` NULL or initialized.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGrow(
    comm: NcclCommPtr,
    n_ranks: c_int,
    unique_id: *const NcclUniqueId,
    rank: c_int,
    newcomm: *mut NcclCommPtr,
    config: *mut NcclConfig,
) -> NcclResult {
    let body = || {
        let size = usize::try_from(n_ranks).map_err(|_| Fail::invalid(format!("nRanks is {n_ranks}")))?;
        if comm.is_null() {
            // A joiner.
            if unique_id.is_null() {
                return Err(Fail::invalid("a joiner (comm NULL) must pass the uniqueId from ncclCommGetUniqueId"));
            }
            let rank = usize::try_from(rank)
                .ok()
                .filter(|&r| r < size)
                .ok_or_else(|| Fail::invalid(format!("rank {rank} is not a rank of {size}")))?;
            // SAFETY: non-null and readable, as the caller guarantees.
            let id = unique_id::decode(unsafe { &*unique_id })?;
            // SAFETY: NULL or initialized, as the caller guarantees.
            let (blocking, name, tuning) = unsafe { read_config_fields(config, true) }?;
            let device = caller_device()?;
            // A joiner builds its communicator as an init does: inside a group (or non-blocking)
            // in the background.
            return init(newcomm, InitArgs { ids: vec![id], rank, nranks: size, device, blocking, name, tuning });
        }
        let parent = handle::lookup(comm)?;
        parent.check_made()?;
        if rank != -1 && usize::try_from(rank).ok() != Some(parent.rank()) {
            return Err(Fail::invalid(format!(
                "a member passes rank -1 (it keeps rank {}); got {rank}",
                parent.rank()
            )));
        }
        let joiners = size.checked_sub(parent.nranks()).filter(|&j| j > 0).ok_or_else(|| {
            Fail::invalid(format!("nRanks {size} must exceed the communicator's {}", parent.nranks()))
        })?;
        // SAFETY: NULL or initialized, as the caller guarantees.
        let derived = unsafe { read_config(config, &parent.derived_config()) }?;
        // Taken last, once nothing else can refuse the call (an abandoned group gives it back).
        let rank0_id = if parent.rank() == 0 {
            Some(parent.take_grow_id().ok_or_else(|| {
                Fail::usage(
                    "rank 0 grows without an id: call ncclCommGetUniqueId there first and hand it to the joiners",
                )
            })?)
        } else {
            None
        };
        // SAFETY: checked non-null above.
        unsafe { derive_or_queue(parent, Derivation::Grow { joiners, rank0_id }, &derived, newcomm) }
    };
    // SAFETY: `newcomm` NULL or writable, as the caller guarantees.
    unsafe { derivation_call("ncclCommGrow", newcomm, body) }
}
