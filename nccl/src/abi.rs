//! The C types of NCCL's `nccl.h`, laid out and numbered as NCCL 2.28.3 does (the 2.29 calls this
//! library adds, revoke, shrink and grow, take no new types).
//!
//! Enums that come *in* from C (data types, operators, scalar residence) are plain `c_int`
//! newtypes, never Rust enums: a C caller may pass any integer, and a Rust enum holding an
//! unlisted value would be undefined behaviour. Each newtype names NCCL's values as constants.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ncclResult_t`: the status every call returns.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclResult(pub c_int);

impl NcclResult {
    /// `ncclSuccess`.
    pub const SUCCESS: Self = Self(0);
    /// `ncclUnhandledCudaError`: a CUDA call failed (no GPU, no driver, a bad device address).
    pub const UNHANDLED_CUDA_ERROR: Self = Self(1);
    /// `ncclSystemError`: the OS or the network failed (sockets, shared memory, a timeout).
    pub const SYSTEM_ERROR: Self = Self(2);
    /// `ncclInternalError`: a bug in this library (a caught panic).
    pub const INTERNAL_ERROR: Self = Self(3);
    /// `ncclInvalidArgument`: a bad argument (null pointer, data type, operator, rank, count).
    pub const INVALID_ARGUMENT: Self = Self(4);
    /// `ncclInvalidUsage`: a call this library does not support or one made at the wrong time.
    pub const INVALID_USAGE: Self = Self(5);
    /// `ncclRemoteError`: a peer process died or sent garbage.
    pub const REMOTE_ERROR: Self = Self(6);
    /// `ncclInProgress`: a non-blocking operation has not finished yet.
    pub const IN_PROGRESS: Self = Self(7);
    /// `ncclNumResults` (2.28 has no `ncclTimeout`; that value came in 2.29).
    pub const NUM_RESULTS: Self = Self(8);
}

/// `ncclDataType_t`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclDataType(pub c_int);

impl NcclDataType {
    /// `ncclInt8` / `ncclChar`.
    pub const INT8: Self = Self(0);
    /// `ncclUint8`.
    pub const UINT8: Self = Self(1);
    /// `ncclInt32` / `ncclInt`.
    pub const INT32: Self = Self(2);
    /// `ncclUint32`.
    pub const UINT32: Self = Self(3);
    /// `ncclInt64`.
    pub const INT64: Self = Self(4);
    /// `ncclUint64`.
    pub const UINT64: Self = Self(5);
    /// `ncclFloat16` / `ncclHalf`.
    pub const FLOAT16: Self = Self(6);
    /// `ncclFloat32` / `ncclFloat`.
    pub const FLOAT32: Self = Self(7);
    /// `ncclFloat64` / `ncclDouble`.
    pub const FLOAT64: Self = Self(8);
    /// `ncclBfloat16`.
    pub const BFLOAT16: Self = Self(9);
    /// `ncclFloat8e4m3`.
    pub const FLOAT8_E4M3: Self = Self(10);
    /// `ncclFloat8e5m2`.
    pub const FLOAT8_E5M2: Self = Self(11);
    /// `ncclNumTypes`.
    pub const NUM_TYPES: Self = Self(12);
}

/// `ncclRedOp_t`: the built-in operators, then operators made by `ncclRedOpCreatePreMulSum`
/// from [`NUM_OPS`](Self::NUM_OPS) up to [`MAX_RED_OP`](Self::MAX_RED_OP).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclRedOp(pub c_int);

impl NcclRedOp {
    /// `ncclSum`.
    pub const SUM: Self = Self(0);
    /// `ncclProd`.
    pub const PROD: Self = Self(1);
    /// `ncclMax`.
    pub const MAX: Self = Self(2);
    /// `ncclMin`.
    pub const MIN: Self = Self(3);
    /// `ncclAvg`.
    pub const AVG: Self = Self(4);
    /// `ncclNumOps`: the first value of a created operator.
    pub const NUM_OPS: Self = Self(5);
    /// `ncclMaxRedOp`: the largest value of an operator (`0x7fffffff` with a 4-byte enum).
    pub const MAX_RED_OP: Self = Self(0x7fff_ffff);
}

/// `ncclScalarResidence_t`: where the scalar of a pre-multiplied sum lives.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclScalarResidence(pub c_int);

impl NcclScalarResidence {
    /// `ncclScalarDevice`: device memory, read by the GPU when each collective runs.
    pub const DEVICE: Self = Self(0);
    /// `ncclScalarHostImmediate`: host memory, read once when the operator is created.
    pub const HOST_IMMEDIATE: Self = Self(1);
}

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes (here: weave's bootstrap address and secret, see
/// [`crate::unique_id`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// The bytes.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `NCCL_CONFIG_UNDEF_INT`: a config field the program left unset.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_API_MAGIC`: the `magic` of an initialized config (`NCCL_CONFIG_INITIALIZER`).
pub const API_MAGIC: c_uint = 0xcafe_beef;
/// `magic` of `NCCL_SIM_INFO_INITIALIZER`.
pub const SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `ncclConfig_t` as NCCL 2.28 lays it out (`struct ncclConfig_v22800`, 80 bytes on 64-bit
/// Linux). `NCCL_CONFIG_INITIALIZER` sets `size`, `magic` = [`API_MAGIC`], `version` and every
/// other field to [`CONFIG_UNDEF_INT`] or NULL; a program then sets the fields it wants. A
/// program built against an older NCCL passes a smaller `size`: fields past it are treated as
/// unset.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case, reason = "NCCL's field names")]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` of the program's header.
    pub size: usize,
    /// [`API_MAGIC`].
    pub magic: c_uint,
    /// The program's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 0: non-blocking init and calls (`ncclInProgress`); 1 or unset: blocking.
    pub blocking: c_int,
    /// Read and ignored (a tuning hint of NCCL's kernels).
    pub cgaClusterSize: c_int,
    /// Ignored (named at `NCCL_DEBUG=INFO`, as every ignored field the program sets).
    pub minCTAs: c_int,
    /// Caps the grid of weave's block-pipelined kernels of a new communicator (`crate::config`).
    pub maxCTAs: c_int,
    /// Read and ignored (weave picks its transports itself).
    pub netName: *const c_char,
    /// 0 or 1: whether splits that keep every rank in order share this communicator (`handle.rs`).
    pub splitShare: c_int,
    /// Read and ignored.
    pub trafficClass: c_int,
    /// Logged at `NCCL_DEBUG=INFO`.
    pub commName: *const c_char,
    /// Read and ignored.
    pub collnetEnable: c_int,
    /// Read and ignored.
    pub CTAPolicy: c_int,
    /// Read and ignored.
    pub shrinkShare: c_int,
    /// Read and ignored.
    pub nvlsCTAs: c_int,
    /// Read and ignored.
    pub nChannelsPerNetPeer: c_int,
    /// Read and ignored.
    pub nvlinkCentricSched: c_int,
}

/// `ncclSimInfo_t` (for `ncclGroupSimulateEnd`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case, reason = "NCCL's field names")]
pub struct NcclSimInfo {
    /// `sizeof(ncclSimInfo_t)`.
    pub size: usize,
    /// [`SIM_INFO_MAGIC`].
    pub magic: c_uint,
    /// The program's version code.
    pub version: c_uint,
    /// Estimated time of the group's calls in microseconds, written by `ncclGroupSimulateEnd`.
    pub estimatedTime: f32,
}

/// `ncclComm_t`: an opaque pointer (here an `Arc<NcclComm>` turned into a raw pointer; see
/// [`crate::handle`]).
pub type NcclCommPtr = *mut c_void;
/// `cudaStream_t` (a `CUstream`: runtime and driver streams are the same handles).
pub type CudaStreamPtr = *mut c_void;

/// `NCCL_MAJOR`, `NCCL_MINOR`, `NCCL_PATCH` of the NCCL this library stands in for: 2.29.2,
/// the first with `ncclCommGrow` (PyTorch 2.11 needs at least 2.27 for `shrink_group`; programs
/// built against 2.28 headers, as nccl-tests on the GPU host is, run on it unchanged).
pub const NCCL_VERSION: (c_int, c_int, c_int) = (2, 29, 2);

/// The version code `ncclGetVersion` returns: major × 10000 + minor × 100 + patch (NCCL's
/// `NCCL_VERSION` macro for versions after 2.8).
pub const fn version_code() -> c_int {
    NCCL_VERSION.0 * 10000 + NCCL_VERSION.1 * 100 + NCCL_VERSION.2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn enum_values_are_nccls() {
        let results = [
            NcclResult::SUCCESS,
            NcclResult::UNHANDLED_CUDA_ERROR,
            NcclResult::SYSTEM_ERROR,
            NcclResult::INTERNAL_ERROR,
            NcclResult::INVALID_ARGUMENT,
            NcclResult::INVALID_USAGE,
            NcclResult::REMOTE_ERROR,
            NcclResult::IN_PROGRESS,
            NcclResult::NUM_RESULTS,
        ];
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.0, i as c_int);
        }
        let types = [
            NcclDataType::INT8,
            NcclDataType::UINT8,
            NcclDataType::INT32,
            NcclDataType::UINT32,
            NcclDataType::INT64,
            NcclDataType::UINT64,
            NcclDataType::FLOAT16,
            NcclDataType::FLOAT32,
            NcclDataType::FLOAT64,
            NcclDataType::BFLOAT16,
            NcclDataType::FLOAT8_E4M3,
            NcclDataType::FLOAT8_E5M2,
            NcclDataType::NUM_TYPES,
        ];
        for (i, t) in types.iter().enumerate() {
            assert_eq!(t.0, i as c_int);
        }
        let ops = [NcclRedOp::SUM, NcclRedOp::PROD, NcclRedOp::MAX, NcclRedOp::MIN, NcclRedOp::AVG, NcclRedOp::NUM_OPS];
        for (i, o) in ops.iter().enumerate() {
            assert_eq!(o.0, i as c_int);
        }
        assert_eq!(NcclRedOp::MAX_RED_OP.0, i32::MAX);
        assert_eq!((NcclScalarResidence::DEVICE.0, NcclScalarResidence::HOST_IMMEDIATE.0), (0, 1));
        assert_eq!(SPLIT_NOCOLOR, -1);
        assert_eq!(CONFIG_UNDEF_INT, i32::MIN);
    }

    #[test]
    fn version_code_is_2_28_3() {
        assert_eq!(version_code(), 22902);
    }

    #[test]
    fn layouts_match_nccl_2_28() {
        assert_eq!(size_of::<NcclUniqueId>(), 128);
        assert_eq!(size_of::<NcclResult>(), 4);
        assert_eq!(size_of::<NcclConfig>(), 80);
        let offsets = [
            (offset_of!(NcclConfig, size), 0),
            (offset_of!(NcclConfig, magic), 8),
            (offset_of!(NcclConfig, version), 12),
            (offset_of!(NcclConfig, blocking), 16),
            (offset_of!(NcclConfig, cgaClusterSize), 20),
            (offset_of!(NcclConfig, minCTAs), 24),
            (offset_of!(NcclConfig, maxCTAs), 28),
            (offset_of!(NcclConfig, netName), 32),
            (offset_of!(NcclConfig, splitShare), 40),
            (offset_of!(NcclConfig, trafficClass), 44),
            (offset_of!(NcclConfig, commName), 48),
            (offset_of!(NcclConfig, collnetEnable), 56),
            (offset_of!(NcclConfig, CTAPolicy), 60),
            (offset_of!(NcclConfig, shrinkShare), 64),
            (offset_of!(NcclConfig, nvlsCTAs), 68),
            (offset_of!(NcclConfig, nChannelsPerNetPeer), 72),
            (offset_of!(NcclConfig, nvlinkCentricSched), 76),
        ];
        for (got, want) in offsets {
            assert_eq!(got, want);
        }
        assert_eq!(size_of::<NcclSimInfo>(), 24);
        assert_eq!(offset_of!(NcclSimInfo, estimatedTime), 16);
    }
}
