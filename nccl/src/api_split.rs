//! Exported: `ncclCommSplit`, and the split itself (`split`): a communicator of the ranks
//! passing one color, ordered by key, or, where every rank's parent shares (`splitShare`) and the
//! split keeps every rank in order, the parent's own communicator (a family, `handle.rs`).

use std::ffi::c_int;

use collectives::Communicator;

use crate::abi::{NcclCommPtr, NcclConfig, NcclResult, SPLIT_NOCOLOR};
use crate::config::read_config;
use crate::derived::{Derivation, derivation_call, derive_or_queue};
use crate::error::Fail;
use crate::handle::{self, Derived, NcclComm, State};

/// `ncclCommSplit`: ranks passing the same `color` form a communicator ordered by `key`;
/// `NCCL_SPLIT_NOCOLOR` (-1) takes part and gets NULL. Blocking (also with a non-blocking
/// config, which NCCL allows). Where the parent shares (`splitShare`) on every rank and the
/// split keeps every rank in its order, the new handle shares the parent's communicator (a
/// family, see `handle.rs`) instead of building one.
///
/// Inside a group, as in NCCL, the handle comes at once and the split is made at the group's
/// `ncclGroupEnd` (`derived.rs`): one thread may split the communicators of several ranks
/// (one per GPU) in one group. The handle is usable after that `ncclGroupEnd`.
///
/// # Safety
/// `newcomm` writable; `config` NULL or initialized.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    comm: NcclCommPtr,
    color: c_int,
    key: c_int,
    newcomm: *mut NcclCommPtr,
    config: *mut NcclConfig,
) -> NcclResult {
    let body = || {
        let parent = handle::lookup(comm)?;
        parent.check_made()?;
        // SAFETY: NULL or initialized, as the caller guarantees.
        let derived = unsafe { read_config(config, &parent.derived_config()) }?;
        let color = match color {
            SPLIT_NOCOLOR => None,
            c if c >= 0 => Some(c as u32),
            c => return Err(Fail::invalid(format!("color {c} is negative and not NCCL_SPLIT_NOCOLOR (-1)"))),
        };
        // SAFETY: checked non-null above.
        unsafe { derive_or_queue(parent, Derivation::Split { color, key }, &derived, newcomm) }
    };
    // SAFETY: `newcomm` NULL or writable, as the caller guarantees.
    unsafe { derivation_call("ncclCommSplit", newcomm, body) }
}

/// Splits `parent` for this rank (collective over its ranks): what the split made of this rank,
/// or `None` for `NCCL_SPLIT_NOCOLOR`. See [`ncclCommSplit`].
pub(crate) fn split(parent: &NcclComm, color: Option<u32>, key: c_int, name: &str) -> Result<Option<Derived>, Fail> {
    let sharing = parent.with_live(|live| shares_the_parent(&live.comm, parent.split_share, color, key))?;
    if sharing {
        let family = parent.family()?.join();
        tracing::info!(
            target: crate::debug::NCCL,
            rank = parent.rank(),
            "split {name}: shares its parent's communicator (splitShare; every rank, in order), a family of {}",
            family.members()
        );
        let (rank, nranks, family_key) = (parent.rank(), parent.nranks(), Some(parent.family_key()));
        return Ok(Some(Derived { rank, nranks, state: State::Ready(family), family_key }));
    }
    let child = parent.with_live(|live| Ok(live.comm.split(color, i64::from(key))?))?;
    let Some(child) = child else { return Ok(None) };
    let (rank, nranks) = (child.rank(), child.world_size());
    tracing::info!(target: crate::debug::NCCL, rank, "split {name}: rank {rank} of {nranks}");
    Ok(Some(Derived { rank, nranks, state: State::ready(child), family_key: None }))
}

/// Whether a split shares its parent's communicator, the same answer on every rank (a
/// collective over the parent's ranks): where every rank's parent shares (`share`), is not
/// revoked, passes the same color, and the keys keep the ranks in their order. Where this
/// rank's parent shares but the split does not qualify, `NCCL_DEBUG=INFO` says why.
fn shares_the_parent(comm: &Communicator, share: bool, color: Option<u32>, key: c_int) -> Result<bool, Fail> {
    let willing = share && !comm.is_revoked();
    let mut mine = Vec::with_capacity(13);
    mine.push(u8::from(willing));
    mine.extend_from_slice(&color.map_or(-1, i64::from).to_le_bytes());
    mine.extend_from_slice(&key.to_le_bytes());
    // Ends when the parent is aborted (PyTorch's watchdog), as the split itself does.
    let all = comm.all_gather_for_derivation(&mine)?;
    let mut asks = Vec::with_capacity(all.len());
    for (r, bytes) in all.iter().enumerate() {
        let &[w, c0, c1, c2, c3, c4, c5, c6, c7, k0, k1, k2, k3] = bytes.as_slice() else {
            return Err(Fail::new(
                NcclResult::INTERNAL_ERROR,
                format!("split: rank {r} sent {} bytes of its color and key, not 13", bytes.len()),
            ));
        };
        asks.push((w == 1, i64::from_le_bytes([c0, c1, c2, c3, c4, c5, c6, c7]), i32::from_le_bytes([k0, k1, k2, k3])));
    }
    let why_not = if !asks.iter().all(|a| a.0) {
        Some("not every rank's parent shares (splitShare) or it was revoked")
    } else if asks[0].1 < 0 || asks.iter().any(|a| a.1 != asks[0].1) {
        Some("the split does not keep every rank (colors differ)")
    } else if asks.windows(2).any(|w| w[1].2 < w[0].2) {
        Some("the keys reorder the ranks")
    } else {
        None
    };
    if let Some(why) = why_not.filter(|_| share) {
        tracing::info!(target: crate::debug::NCCL, rank = comm.rank(), "splitShare: this split builds its own communicator: {why}");
    }
    Ok(why_not.is_none())
}
