//! Exported: memory allocation, pre-multiplied-sum operators, and the calls this library refuses.
//!
//! | symbol | behaviour |
//! |---|---|
//! | `ncclMemAlloc` / `ncclMemFree` | `cuMemAlloc` / `cuMemFree` in the current context |
//! | `ncclCommRegister` / `ncclCommDeregister` | see [`crate::api_register`] |
//! | `ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy` | work (see [`crate::premul`]) |
//! | `ncclCommWindowRegister` / `ncclCommWindowDeregister` | work (see [`crate::api_window`]) |
//! | `ncclDevCommCreate` / `ncclDevCommDestroy` | `ncclInvalidUsage`: no device API |
//! | `ncclGroupSimulateEnd` | closes the group without running it; the estimated time of its calls |
//!
//! Each refusal is logged once at `NCCL_DEBUG=WARN`.

use std::ffi::c_void;

use crate::abi::{NcclCommPtr, NcclDataType, NcclRedOp, NcclResult, NcclScalarResidence, NcclSimInfo, SIM_INFO_MAGIC};
use crate::coll::data_type;
use crate::cuda;
use crate::error::{Fail, guard, warn_once};
use crate::group;
use crate::handle;
use crate::premul::{PreMul, Scalar};

fn refuse(symbol: &'static str, why: &str) -> NcclResult {
    warn_once(symbol, why);
    guard(symbol, || Err(Fail::usage(why.to_string())))
}

/// `ncclMemAlloc`: device memory of `size` bytes in the current context.
///
/// # Safety
/// `ptr` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    guard("ncclMemAlloc", || {
        if ptr.is_null() {
            return Err(Fail::invalid("ptr is NULL"));
        }
        let p = cuda::mem_alloc(size)?;
        // SAFETY: checked non-null.
        unsafe { *ptr = p };
        Ok(())
    })
}

/// `ncclMemFree`: frees what `ncclMemAlloc` returned (NULL is a no-op).
///
/// # Safety
/// `ptr` is NULL or from `ncclMemAlloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    guard("ncclMemFree", || if ptr.is_null() { Ok(()) } else { Ok(cuda::mem_free(ptr)?) })
}

/// `ncclDevCommCreate`: refused (`ncclInvalidUsage`).
///
/// # Safety
/// Any arguments (nothing is read).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclDevCommCreate(_comm: NcclCommPtr, _reqs: *const c_void, _out: *mut c_void) -> NcclResult {
    refuse("ncclDevCommCreate", "NCCL's device API (ncclDevComm) is not provided by weave's libnccl")
}

/// `ncclDevCommDestroy`: refused (`ncclInvalidUsage`).
///
/// # Safety
/// Any arguments (nothing is read).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclDevCommDestroy(_comm: NcclCommPtr, _dev_comm: *const c_void) -> NcclResult {
    refuse("ncclDevCommDestroy", "NCCL's device API (ncclDevComm) is not provided by weave's libnccl")
}

/// `ncclGroupSimulateEnd`: closes the group level like `ncclGroupEnd` but runs none of its
/// calls, and writes their estimated time in microseconds into `sim_info->estimatedTime` (see
/// [`group::simulate`]; 0 for a nested level). `sim_info` must be NULL or start as
/// `NCCL_SIM_INFO_INITIALIZER` sets it.
///
/// # Safety
/// `sim_info` NULL or a writable `ncclSimInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGroupSimulateEnd(sim_info: *mut NcclSimInfo) -> NcclResult {
    guard("ncclGroupSimulateEnd", || {
        // SAFETY: the caller passes NULL or a writable ncclSimInfo_t.
        let info = unsafe { sim_info.as_mut() };
        if let Some(info) = &info
            && (info.magic != SIM_INFO_MAGIC || info.size < std::mem::size_of::<NcclSimInfo>())
        {
            return Err(Fail::invalid(format!(
                "sim_info (magic {:#x}, size {}) was not set up with NCCL_SIM_INFO_INITIALIZER; the group is still \
                 open",
                info.magic, info.size
            )));
        }
        let micros = group::simulate()?;
        if let Some(info) = info {
            info.estimatedTime = micros as f32;
        }
        Ok(())
    })
}

/// Reads a host scalar of `dtype` as its bytes, zero-extended to 8.
///
/// # Safety
/// `p` points at one readable element of `dtype`.
unsafe fn host_scalar(p: *const c_void, size: usize) -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: `p` holds `size` (≤ 8) readable bytes as the caller guarantees.
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), bytes.as_mut_ptr(), size) };
    u64::from_le_bytes(bytes)
}

/// `ncclRedOpCreatePreMulSum`: an operator that multiplies each rank's input by `scalar`,
/// then sums (see [`crate::premul`]).
///
/// # Safety
/// `op` writable; `scalar` one element of `datatype` in host memory (`ncclScalarHostImmediate`)
/// or device memory that stays valid while the operator is used (`ncclScalarDevice`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut NcclRedOp,
    scalar: *mut c_void,
    datatype: NcclDataType,
    residence: NcclScalarResidence,
    comm: NcclCommPtr,
) -> NcclResult {
    guard("ncclRedOpCreatePreMulSum", || {
        if op.is_null() || scalar.is_null() {
            return Err(Fail::invalid(format!("op ({op:p}) and scalar ({scalar:p}) must not be NULL")));
        }
        let c = handle::lookup(comm)?;
        let dtype = data_type(datatype)?;
        let scalar = match residence {
            // SAFETY: a host scalar holds one element of `dtype` (size ≤ 8).
            NcclScalarResidence::HOST_IMMEDIATE => Scalar::Host(unsafe { host_scalar(scalar, dtype.size()) }),
            NcclScalarResidence::DEVICE => Scalar::Device(scalar as u64),
            other => return Err(Fail::invalid(format!("scalar residence {} is neither 0 nor 1", other.0))),
        };
        let mut table = c.premul.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "premul table poisoned"))?;
        let made = table.create(PreMul { dtype, scalar })?;
        // SAFETY: checked non-null.
        unsafe { *op = made };
        Ok(())
    })
}

/// `ncclRedOpDestroy`: destroys an operator of `ncclRedOpCreatePreMulSum`.
///
/// # Safety
/// Any arguments (the comm is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpDestroy(op: NcclRedOp, comm: NcclCommPtr) -> NcclResult {
    guard("ncclRedOpDestroy", || {
        let c = handle::lookup(comm)?;
        if op.0 < NcclRedOp::NUM_OPS.0 {
            return Err(Fail::invalid(format!("operator {} is built in and cannot be destroyed", op.0)));
        }
        let mut table = c.premul.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "premul table poisoned"))?;
        table.destroy(op)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::NCCL_VERSION;

    fn initialized() -> NcclSimInfo {
        let (major, minor, patch) = NCCL_VERSION;
        NcclSimInfo {
            size: std::mem::size_of::<NcclSimInfo>(),
            magic: SIM_INFO_MAGIC,
            version: (major * 10000 + minor * 100 + patch) as std::ffi::c_uint,
            estimatedTime: -1.0,
        }
    }

    #[test]
    fn simulate_end_closes_one_level_and_checks_its_info() {
        let mut info = initialized();
        // SAFETY: (each call) a live ncclSimInfo_t or NULL.
        unsafe {
            assert_eq!(ncclGroupSimulateEnd(&mut info), NcclResult::INVALID_USAGE, "no group is open");
            group::start();
            group::start();
            let mut bad = NcclSimInfo { magic: 0, ..initialized() };
            assert_eq!(ncclGroupSimulateEnd(&mut bad), NcclResult::INVALID_ARGUMENT);
            assert!(group::in_group(), "a refused info leaves the level open");
            assert_eq!(ncclGroupSimulateEnd(&mut info), NcclResult::SUCCESS);
            assert_eq!(info.estimatedTime, 0.0, "a nested level estimates nothing");
            assert!(group::in_group());
            info.estimatedTime = -1.0;
            assert_eq!(ncclGroupSimulateEnd(std::ptr::null_mut()), NcclResult::SUCCESS, "NULL is allowed");
            assert!(!group::in_group(), "the outermost level closed");
            group::start();
            assert_eq!(ncclGroupSimulateEnd(&mut info), NcclResult::SUCCESS);
            assert_eq!(info.estimatedTime, 0.0, "an empty group takes no time");
        }
    }
}
