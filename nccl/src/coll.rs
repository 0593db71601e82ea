//! One NCCL call as weave takes it: data types and operators translated and arguments checked
//! (NCCL's in-place rules included) into a [`Call`], which `group.rs` enqueues with weave's
//! `*_device_raw` calls.
//!
//! Data types: every NCCL type of 2.28 works everywhere: int8, uint8, int32, uint32, int64,
//! uint64, half, float, double, bfloat16, and the FP8 types (`ncclFloat8e4m3`,
//! `ncclFloat8e5m2`), which weave reduces in `f32` and `f64` and rounds once
//! (`collectives::fp8`).

use collectives::{DataType, ReduceOp};

use crate::abi::{NcclDataType, NcclRedOp, NcclResult};
use crate::error::Fail;
use crate::handle::NcclComm;
use crate::premul::PreMul;

/// The reduction of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// A built-in operator.
    Plain(ReduceOp),
    /// Scale by a scalar, then sum.
    PreMul(PreMul),
}

/// One call, with device addresses and element counts as NCCL passes them.
///
/// Fields: `send`, `recv`, `buf` are device addresses; `count` counts elements of `dtype`
/// (per rank where NCCL's signature says so); `bytes` counts bytes; `root` and `peer` are
/// ranks of the communicator; `op` is the reduction.
#[allow(missing_docs, reason = "the fields are described once above")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `ncclAllReduce`.
    AllReduce { send: u64, recv: u64, count: usize, dtype: DataType, op: Reduction },
    /// `ncclAllGather` (`count` per rank).
    AllGather { send: u64, recv: u64, count: usize, dtype: DataType },
    /// `ncclReduceScatter` (`count` per rank).
    ReduceScatter { send: u64, recv: u64, count: usize, dtype: DataType, op: Reduction },
    /// `ncclBroadcast` / `ncclBcast`.
    Broadcast { send: u64, recv: u64, count: usize, dtype: DataType, root: usize },
    /// `ncclReduce`.
    Reduce { send: u64, recv: u64, count: usize, dtype: DataType, op: Reduction, root: usize },
    /// `ncclAlltoAll` (`count` per pair of ranks).
    AllToAll { send: u64, recv: u64, count: usize, dtype: DataType },
    /// `ncclSend` (and the sends of gather and scatter).
    Send { buf: u64, bytes: usize, peer: usize },
    /// `ncclRecv` (and the receives of gather and scatter).
    Recv { buf: u64, bytes: usize, peer: usize },
}

impl Call {
    /// True for point-to-point calls.
    pub fn is_p2p(&self) -> bool {
        matches!(self, Call::Send { .. } | Call::Recv { .. })
    }

    /// True when the call moves nothing (count 0): NCCL returns success at once.
    pub fn is_empty(&self) -> bool {
        match *self {
            Call::AllReduce { count, .. }
            | Call::AllGather { count, .. }
            | Call::ReduceScatter { count, .. }
            | Call::Broadcast { count, .. }
            | Call::Reduce { count, .. }
            | Call::AllToAll { count, .. } => count == 0,
            Call::Send { bytes, .. } | Call::Recv { bytes, .. } => bytes == 0,
        }
    }
}

/// weave's type for NCCL's `dt`.
pub fn data_type(dt: NcclDataType) -> Result<DataType, Fail> {
    Ok(match dt {
        NcclDataType::INT8 => DataType::I8,
        NcclDataType::UINT8 => DataType::U8,
        NcclDataType::INT32 => DataType::I32,
        NcclDataType::UINT32 => DataType::U32,
        NcclDataType::INT64 => DataType::I64,
        NcclDataType::UINT64 => DataType::U64,
        NcclDataType::FLOAT16 => DataType::F16,
        NcclDataType::FLOAT32 => DataType::F32,
        NcclDataType::FLOAT64 => DataType::F64,
        NcclDataType::BFLOAT16 => DataType::Bf16,
        NcclDataType::FLOAT8_E4M3 => DataType::F8E4M3,
        NcclDataType::FLOAT8_E5M2 => DataType::F8E5M2,
        _ => {
            return Err(Fail::invalid(format!(
                "data type {} is not an ncclDataType_t of NCCL 2.28 (0..{})",
                dt.0,
                NcclDataType::NUM_TYPES.0 - 1
            )));
        }
    })
}

/// The reduction for operator `op` of a call on `dtype` over `comm`.
pub fn reduction(op: NcclRedOp, dtype: DataType, comm: &NcclComm) -> Result<Reduction, Fail> {
    Ok(Reduction::Plain(match op {
        NcclRedOp::SUM => ReduceOp::Sum,
        NcclRedOp::PROD => ReduceOp::Prod,
        NcclRedOp::MAX => ReduceOp::Max,
        NcclRedOp::MIN => ReduceOp::Min,
        NcclRedOp::AVG => ReduceOp::Avg,
        _ => {
            let table =
                comm.premul.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "premul table poisoned"))?;
            let p = table.get(op).ok_or_else(|| {
                Fail::invalid(format!(
                    "operator {} is neither built in (0..4) nor a live ncclRedOpCreatePreMulSum operator of this \
                     communicator",
                    op.0
                ))
            })?;
            if p.dtype != dtype {
                return Err(Fail::invalid(format!(
                    "operator {} was created for {} but the call passes {}",
                    op.0,
                    p.dtype.name(),
                    dtype.name()
                )));
            }
            return Ok(Reduction::PreMul(p));
        }
    }))
}

/// Checks a root or peer rank against a world of `n`.
pub fn check_rank(what: &str, rank: i32, n: usize) -> Result<usize, Fail> {
    usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| Fail::invalid(format!("{what} {rank} is not a rank of this {n}-rank communicator")))
}

/// Checks that a buffer needed for a call with data is not NULL.
pub fn check_buffer(what: &str, p: u64, count: usize) -> Result<(), Fail> {
    if p == 0 && count > 0 {
        return Err(Fail::invalid(format!("{what} is NULL but the count is {count}")));
    }
    Ok(())
}

/// `count × size` without overflow.
pub fn bytes_of(count: usize, dtype: DataType, ranks: usize) -> Result<usize, Fail> {
    count
        .checked_mul(dtype.size())
        .and_then(|b| b.checked_mul(ranks))
        .ok_or_else(|| Fail::invalid(format!("count {count} × {ranks} rank(s) overflows the address space")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_types_map_fp8_included() {
        assert_eq!(data_type(NcclDataType::BFLOAT16).unwrap(), DataType::Bf16);
        assert_eq!(data_type(NcclDataType::UINT8).unwrap(), DataType::U8);
        assert_eq!(data_type(NcclDataType::FLOAT8_E4M3).unwrap(), DataType::F8E4M3);
        assert_eq!(data_type(NcclDataType::FLOAT8_E5M2).unwrap(), DataType::F8E5M2);
        assert_eq!(data_type(NcclDataType(12)).unwrap_err().code, NcclResult::INVALID_ARGUMENT);
        assert_eq!(data_type(NcclDataType(-3)).unwrap_err().code, NcclResult::INVALID_ARGUMENT);
    }

    #[test]
    fn ranks_and_buffers_are_checked() {
        assert_eq!(check_rank("root", 1, 2).unwrap(), 1);
        assert!(check_rank("root", 2, 2).is_err());
        assert!(check_rank("peer", -1, 2).is_err());
        assert!(check_buffer("sendbuff", 0, 1).is_err());
        check_buffer("sendbuff", 0, 0).unwrap();
        assert!(bytes_of(usize::MAX / 2, DataType::F32, 1).is_err());
    }
}
