//! Exported: symmetric memory windows.
//!
//! | symbol | behaviour |
//! |---|---|
//! | `ncclCommWindowRegister(comm, buff, size, &win, flags)` | collective ([`collectives::Communicator::register_window`]): every rank registers its part, in the same order; inside a group it runs at `ncclGroupEnd` (one thread per communicator, as the group's calls; `*win` is filled then); with `NCCL_WIN_COLL_SYMMETRIC` (every rank calls with buffers at the same offset in its window) all-reduces on window memory read and write the peers' parts in place; other flags: the window is kept and calls copy. `buff` must be `cudaMalloc`/`cuMemAlloc`/`ncclMemAlloc` memory, not a stream-ordered pool |
//! | `ncclCommWindowDeregister(comm, win)` | local: waits for the GPU work queued on this rank's GPU, then ends the window; a window of another communicator is `ncclInvalidArgument` |
//!
//! A window belongs to the communicator that registered it. One buffer may be a window of
//! several communicators (SGLang's pool per process group), each call using its own
//! communicator's.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

use collectives::{Window, WindowOffsets};

use crate::abi::{NcclCommPtr, NcclResult};
use crate::error::{Fail, guard};
use crate::group;
use crate::handle::{self, NcclComm};

/// `NCCL_WIN_COLL_SYMMETRIC`: collectives on the window use buffers at the same offset on every
/// rank.
pub const WIN_COLL_SYMMETRIC: c_int = 0x01;

/// The windows handed out, by the address of their `ncclWindow_t` (a box of their own), with the
/// communicator that registered them: an unknown or stale pointer is an error, never a read.
static WINDOWS: Mutex<Option<HashMap<usize, (usize, Window)>>> = Mutex::new(None);

fn windows() -> MutexGuard<'static, Option<HashMap<usize, (usize, Window)>>> {
    WINDOWS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops the windows communicator `comm` (its `ncclComm_t`) still holds and frees their
/// handles, as `ncclCommDestroy` and `ncclCommAbort` do in NCCL.
pub(crate) fn forget_communicator(comm: usize) {
    let gone: Vec<(usize, Window)> = {
        let mut all = windows();
        let Some(table) = all.as_mut() else { return };
        let keys: Vec<usize> = table.iter().filter(|(_, (owner, _))| *owner == comm).map(|(&k, _)| k).collect();
        keys.into_iter().filter_map(|k| table.remove(&k).map(|(_, w)| (k, w))).collect()
    };
    for (key, window) in gone {
        drop(window);
        // SAFETY: `key` came from Box::into_raw in ncclCommWindowRegister and left the table
        // just now, so it is freed once.
        drop(unsafe { Box::from_raw(key as *mut u8) });
    }
}

/// A window registration asked for: run at once, or at `ncclGroupEnd` inside a group.
pub(crate) struct WindowRequest {
    comm: Arc<NcclComm>,
    /// The `ncclComm_t` it was asked on (windows remember it for deregistration).
    comm_key: usize,
    address: u64,
    size: usize,
    offsets: WindowOffsets,
    /// Where the `ncclWindow_t` goes: the caller's `win`, valid until the registration ran (at
    /// once, or at the group's end, as NCCL says).
    out: usize,
}

impl WindowRequest {
    /// The communicator the registration is for.
    pub(crate) fn comm(&self) -> &Arc<NcclComm> {
        &self.comm
    }

    /// Registers the window (collective) and writes its handle into the caller's `win`.
    pub(crate) fn register(&self) -> Result<(), Fail> {
        let (address, size, offsets) = (self.address, self.size, self.offsets);
        // SAFETY: the caller of ncclCommWindowRegister vouched for the memory.
        let window = self.comm.with_live(|live| Ok(unsafe { live.comm.register_window(address, size, offsets) }?))?;
        let token = Box::into_raw(Box::new(0u8)).cast::<c_void>();
        windows().get_or_insert_with(HashMap::new).insert(token as usize, (self.comm_key, window));
        // SAFETY: `out` is the caller's non-null `win`, writable until the registration ran.
        unsafe { *(self.out as *mut *mut c_void) = token };
        Ok(())
    }
}

/// `ncclCommWindowRegister`: see the module table.
///
/// # Safety
/// `win` writable (until `ncclGroupEnd` inside a group); `buff` device memory of the
/// communicator's GPU, `size` bytes, live until the window is deregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: NcclCommPtr,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut c_void,
    win_flags: c_int,
) -> NcclResult {
    guard("ncclCommWindowRegister", || {
        if win.is_null() {
            return Err(Fail::invalid("win is NULL"));
        }
        let offsets = if win_flags & WIN_COLL_SYMMETRIC != 0 { WindowOffsets::Symmetric } else { WindowOffsets::Any };
        let request = WindowRequest {
            comm: handle::lookup(comm)?,
            comm_key: comm as usize,
            address: buff as u64,
            size,
            offsets,
            out: win as usize,
        };
        if group::in_group() {
            group::add_window(request);
            return Ok(());
        }
        request.register()
    })
}

/// `ncclCommWindowDeregister`: see the module table.
///
/// # Safety
/// `comm` and `win` are any values (checked against the live handles and windows).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommWindowDeregister(comm: NcclCommPtr, win: *mut c_void) -> NcclResult {
    guard("ncclCommWindowDeregister", || {
        let c = handle::lookup(comm)?;
        let key = win as usize;
        let window = {
            let mut all = windows();
            let table = all.get_or_insert_with(HashMap::new);
            match table.get(&key) {
                None => {
                    return Err(Fail::invalid(format!(
                        "{win:p} is no window of weave's libnccl (deregistered already?)"
                    )));
                }
                Some((owner, _)) if *owner != comm as usize => {
                    return Err(Fail::invalid(format!(
                        "window {win:p} was registered with communicator {:#x}, not {comm:p}; deregister it with the \
                         communicator that registered it",
                        owner
                    )));
                }
                Some(_) => table.remove(&key).map(|(_, w)| w),
            }
        };
        let Some(window) = window else { return Err(Fail::invalid("the window vanished")) };
        // SAFETY: `key` came from Box::into_raw in ncclCommWindowRegister and left the table
        // just now, so it is freed once.
        drop(unsafe { Box::from_raw(win.cast::<u8>()) });
        c.with_live(|live| Ok(live.comm.deregister_window(window)?))
    })
}
