//! Exported: local buffer registration.
//!
//! | symbol | behaviour |
//! |---|---|
//! | `ncclCommRegister(comm, buff, size, &handle)` | local: registers the buffer with its communicator (`Communicator::register_device`) and hands out a handle; device all-reduces whose send and receive buffers both lie in registrations read and write the peers' buffers in place (as NCCL requires, every rank then passes registered buffers). Memory that cannot be shared (host memory, a stream-ordered pool, another GPU's) or a communicator without the direct kernels is recorded all the same, and its calls copy (`NCCL_DEBUG=INFO` says why) |
//! | `ncclCommDeregister(comm, handle)` | ends a registration of `comm` after this rank's GPU work is done, and has the peers unmap it; a handle of another communicator, an unknown or a deregistered one is `ncclInvalidArgument` |
//!
//! A registration belongs to the communicator that made it, as NCCL's does.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use collectives::DeviceRegistration;

use crate::abi::{NcclCommPtr, NcclResult};
use crate::error::{Fail, guard};
use crate::handle;

/// One registration: the communicator it belongs to, the buffer, and weave's registration where
/// the buffer could be registered in place.
struct Registration {
    comm: usize,
    address: usize,
    size: usize,
    in_place: Option<DeviceRegistration>,
}

/// The registrations handed out, by the address of their handle (a box of their own): an
/// unknown or stale handle is an error, never a read.
static REGISTRATIONS: Mutex<Option<HashMap<usize, Registration>>> = Mutex::new(None);

fn registrations() -> MutexGuard<'static, Option<HashMap<usize, Registration>>> {
    REGISTRATIONS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops the registrations communicator `comm` (its `ncclComm_t`) still holds and frees their
/// handles, as `ncclCommDestroy` and `ncclCommAbort` do in NCCL.
pub(crate) fn forget_communicator(comm: usize) {
    let gone: Vec<(usize, Registration)> = {
        let mut all = registrations();
        let Some(table) = all.as_mut() else { return };
        let keys: Vec<usize> = table.iter().filter(|(_, r)| r.comm == comm).map(|(&k, _)| k).collect();
        keys.into_iter().filter_map(|k| table.remove(&k).map(|r| (k, r))).collect()
    };
    for (key, registration) in gone {
        drop(registration);
        // SAFETY: `key` came from Box::into_raw in ncclCommRegister and left the table just now,
        // so it is freed once.
        drop(unsafe { Box::from_raw(key as *mut u8) });
    }
}

/// `ncclCommRegister`: see the module table.
///
/// # Safety
/// `reg_handle` writable; `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommRegister(
    comm: NcclCommPtr,
    buff: *mut c_void,
    size: usize,
    reg_handle: *mut *mut c_void,
) -> NcclResult {
    guard("ncclCommRegister", || {
        let c = handle::lookup(comm)?;
        if reg_handle.is_null() {
            return Err(Fail::invalid("handle is NULL"));
        }
        // SAFETY: the caller of ncclCommRegister vouches that `buff` holds `size` bytes until it
        // deregisters; memory weave cannot share is refused by register_device, not touched.
        let registered = c.with_live(|live| Ok(unsafe { live.comm.register_device(buff as u64, size) }?));
        let in_place = match registered {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::info!(
                    target: comm_core::diagnostics::INIT,
                    "ncclCommRegister: [{buff:p}, +{size}) is recorded, and calls on it copy: {}",
                    e.message
                );
                None
            }
        };
        let token = Box::into_raw(Box::new(0u8)).cast::<c_void>();
        let registration = Registration { comm: comm as usize, address: buff as usize, size, in_place };
        registrations().get_or_insert_with(HashMap::new).insert(token as usize, registration);
        // SAFETY: checked non-null; the caller vouches it is writable.
        unsafe { *reg_handle = token };
        Ok(())
    })
}

/// `ncclCommDeregister`: see the module table.
///
/// # Safety
/// `comm` and `reg_handle` are any values (checked against the live handles and registrations).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDeregister(comm: NcclCommPtr, reg_handle: *mut c_void) -> NcclResult {
    guard("ncclCommDeregister", || {
        let c = handle::lookup(comm)?;
        let key = reg_handle as usize;
        let mut all = registrations();
        let table = all.get_or_insert_with(HashMap::new);
        let registration = match table.get(&key) {
            None => {
                return Err(Fail::invalid(format!(
                    "{reg_handle:p} is no registration of weave's libnccl (deregistered already?)"
                )));
            }
            Some(r) if r.comm != comm as usize => {
                return Err(Fail::invalid(format!(
                    "registration {reg_handle:p} of [{:#x}, +{}) was made with communicator {:#x}, not {comm:p}; \
                 deregister it with the communicator that made it",
                    r.address, r.size, r.comm
                )));
            }
            Some(_) => table.remove(&key),
        };
        drop(all);
        // SAFETY: `key` came from Box::into_raw in ncclCommRegister and left the table just
        // now, so it is freed once.
        drop(unsafe { Box::from_raw(reg_handle.cast::<u8>()) });
        match registration.and_then(|r| r.in_place) {
            Some(r) => c.with_live(|live| Ok(live.comm.deregister_device(r)?)),
            None => Ok(()),
        }
    })
}
