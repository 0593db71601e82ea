//! Exported: the GPU memory a communicator holds, and releasing it while idle (NCCL 2.29.7).
//!
//! | symbol | behaviour |
//! |---|---|
//! | `ncclCommMemStats(comm, stat, *value)` | [`collectives::DeviceMemory`] of the communicator: `ncclStatGpuMemSuspend` (0) the bytes a suspend releases, `ncclStatGpuMemSuspended` (1) 1 while suspended, `ncclStatGpuMemPersist` (2) the bytes a suspend keeps, `ncclStatGpuMemTotal` (3) every byte held |
//! | `ncclCommSuspend(comm, flags)` | `NCCL_SUSPEND_MEM` (1): releases the workspace ([`collectives::Communicator::suspend_device_memory`]); collective in weave — every rank calls it, and it waits (within the timeout) for every rank, so no kernel anywhere still uses the memory; 0: nothing; other bits: `ncclInvalidArgument` |
//! | `ncclCommResume(comm)` | collective: makes the control area again ([`collectives::Communicator::resume_device_memory`]); nothing when not suspended |
//!
//! Between the two, collectives and point-to-point calls of the communicator fail with
//! `ncclInvalidArgument` naming the suspension.

use std::ffi::c_int;

use crate::abi::{NcclCommPtr, NcclResult};
use crate::error::{Fail, guard};
use crate::handle;

/// `NCCL_SUSPEND_MEM`: `ncclCommSuspend` releases the communicator's dynamic GPU memory.
pub const SUSPEND_MEM: c_int = 0x01;

/// `ncclStatGpuMemSuspend`: bytes a suspend would release now.
pub const STAT_GPU_MEM_SUSPEND: c_int = 0;
/// `ncclStatGpuMemSuspended`: 1 while suspended, else 0.
pub const STAT_GPU_MEM_SUSPENDED: c_int = 1;
/// `ncclStatGpuMemPersist`: bytes a suspend keeps.
pub const STAT_GPU_MEM_PERSIST: c_int = 2;
/// `ncclStatGpuMemTotal`: every byte of GPU memory the communicator holds.
pub const STAT_GPU_MEM_TOTAL: c_int = 3;

/// `ncclCommMemStats`: one figure of the communicator's GPU memory (see the module table).
///
/// # Safety
/// `value` writable; `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommMemStats(comm: NcclCommPtr, stat: c_int, value: *mut u64) -> NcclResult {
    guard("ncclCommMemStats", || {
        if value.is_null() {
            return Err(Fail::invalid("value is NULL"));
        }
        let c = handle::lookup(comm)?;
        let memory = c.with_live(|live| Ok(live.comm.device_memory()))?;
        let figure = match stat {
            STAT_GPU_MEM_SUSPEND => memory.releasable as u64,
            STAT_GPU_MEM_SUSPENDED => u64::from(memory.suspended),
            STAT_GPU_MEM_PERSIST => memory.persistent as u64,
            STAT_GPU_MEM_TOTAL => memory.total() as u64,
            other => {
                return Err(Fail::invalid(format!(
                    "stat is {other}; ncclCommMemStats knows ncclStatGpuMemSuspend (0), ncclStatGpuMemSuspended (1), \
                     ncclStatGpuMemPersist (2) and ncclStatGpuMemTotal (3)"
                )));
            }
        };
        // SAFETY: checked non-null; the caller vouches it is writable.
        unsafe { *value = figure };
        Ok(())
    })
}

/// `ncclCommSuspend`: with `NCCL_SUSPEND_MEM`, releases the communicator's workspace on every
/// rank (collective; see the module table).
///
/// # Safety
/// `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSuspend(comm: NcclCommPtr, flags: c_int) -> NcclResult {
    guard("ncclCommSuspend", || {
        if flags & !SUSPEND_MEM != 0 {
            return Err(Fail::invalid(format!("flags is {flags:#x}; only NCCL_SUSPEND_MEM (0x1) exists")));
        }
        let c = handle::lookup(comm)?;
        if flags & SUSPEND_MEM == 0 {
            return Ok(());
        }
        c.with_live(|live| Ok(live.comm.suspend_device_memory()?))
    })
}

/// `ncclCommResume`: ends a suspension on every rank (collective); nothing when not suspended.
///
/// # Safety
/// `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommResume(comm: NcclCommPtr) -> NcclResult {
    guard("ncclCommResume", || {
        let c = handle::lookup(comm)?;
        c.with_live(|live| {
            if !live.comm.device_memory().suspended {
                return Ok(());
            }
            Ok(live.comm.resume_device_memory()?)
        })
    })
}
