//! Exported: the collectives and point-to-point calls. Each checks its arguments, builds a
//! [`Call`] and hands it to [`group::submit`] (run now, or queued inside a group).
//!
//! NCCL's in-place rules hold: all-reduce, broadcast, reduce and all-to-all with
//! `sendbuff == recvbuff`; all-gather with `sendbuff == recvbuff + rank × sendcount`;
//! reduce-scatter with `recvbuff == sendbuff + rank × recvcount` (elements). A count of 0 is
//! valid and does nothing.

use std::ffi::{c_int, c_void};

use crate::abi::{CudaStreamPtr, NcclCommPtr, NcclDataType, NcclRedOp, NcclResult};
use collectives::DataType;

use crate::coll::{Call, Reduction, bytes_of, check_buffer, check_rank, data_type, reduction};
use crate::error::{Fail, guard};
use crate::group;
use crate::handle::{self, NcclComm};

/// Runs `make` (which checks the arguments) and submits its calls on `stream`.
fn submit(
    name: &'static str,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
    make: impl FnOnce(&NcclComm) -> Result<Vec<Call>, Fail>,
) -> NcclResult {
    guard(name, || {
        let c = handle::lookup(comm)?;
        let calls = c.check_made().and_then(|()| make(&c)).inspect_err(group::record_error)?;
        group::submit(c, &calls, stream as usize)
    })
}

/// The checks of a call with a send and a receive buffer of `count` elements each, moving
/// `count` elements per rank from `blocks` ranks: the size fits the address space and neither
/// buffer is NULL.
fn check_buffers(
    count: usize,
    dtype: DataType,
    blocks: usize,
    send: *const c_void,
    recv: *mut c_void,
) -> Result<(), Fail> {
    bytes_of(count, dtype, blocks)?;
    check_buffer("sendbuff", send as u64, count)?;
    check_buffer("recvbuff", recv as u64, count)
}

/// The checks of a reducing call with a send and a receive buffer (the data type, then the
/// operator, then [`check_buffers`]): its data type and reduction.
fn reducing_call(
    c: &NcclComm,
    datatype: NcclDataType,
    op: NcclRedOp,
    count: usize,
    blocks: usize,
    send: *const c_void,
    recv: *mut c_void,
) -> Result<(DataType, Reduction), Fail> {
    let dtype = data_type(datatype)?;
    let op = reduction(op, dtype, c)?;
    check_buffers(count, dtype, blocks, send, recv)?;
    Ok((dtype, op))
}

/// `ncclAllReduce`.
///
/// # Safety
/// Device buffers of `count` elements, valid until the call completes on `stream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclAllReduce", comm, stream, |c| {
        let (dtype, op) = reducing_call(c, datatype, op, count, 1, sendbuff, recvbuff)?;
        Ok(vec![Call::AllReduce { send: sendbuff as u64, recv: recvbuff as u64, count, dtype, op }])
    })
}

/// `ncclAllGather`: `sendcount` elements per rank into `recvbuff` (`nranks × sendcount`).
///
/// # Safety
/// As [`ncclAllReduce`], with the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: NcclDataType,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclAllGather", comm, stream, |c| {
        let dtype = data_type(datatype)?;
        check_buffers(sendcount, dtype, c.nranks(), sendbuff, recvbuff)?;
        Ok(vec![Call::AllGather { send: sendbuff as u64, recv: recvbuff as u64, count: sendcount, dtype }])
    })
}

/// `ncclReduceScatter`: `sendbuff` holds `nranks × recvcount` elements.
///
/// # Safety
/// As [`ncclAllReduce`], with the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclReduceScatter", comm, stream, |c| {
        let (dtype, op) = reducing_call(c, datatype, op, recvcount, c.nranks(), sendbuff, recvbuff)?;
        Ok(vec![Call::ReduceScatter { send: sendbuff as u64, recv: recvbuff as u64, count: recvcount, dtype, op }])
    })
}

/// `ncclBroadcast`: `sendbuff` is read on the root only.
///
/// # Safety
/// As [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclBroadcast", comm, stream, |c| {
        let dtype = data_type(datatype)?;
        let root = check_rank("root", root, c.nranks())?;
        bytes_of(count, dtype, 1)?;
        if c.rank() == root {
            check_buffer("sendbuff (on the root)", sendbuff as u64, count)?;
        }
        check_buffer("recvbuff", recvbuff as u64, count)?;
        Ok(vec![Call::Broadcast { send: sendbuff as u64, recv: recvbuff as u64, count, dtype, root }])
    })
}

/// `ncclBcast`: broadcast in place.
///
/// # Safety
/// As [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { ncclBroadcast(buff, buff, count, datatype, root, comm, stream) }
}

/// `ncclReduce`: `recvbuff` is written on the root only.
///
/// # Safety
/// As [`ncclAllReduce`].
#[allow(clippy::too_many_arguments, reason = "NCCL's signature")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    op: NcclRedOp,
    root: c_int,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclReduce", comm, stream, |c| {
        let dtype = data_type(datatype)?;
        let op = reduction(op, dtype, c)?;
        let root = check_rank("root", root, c.nranks())?;
        bytes_of(count, dtype, 1)?;
        check_buffer("sendbuff", sendbuff as u64, count)?;
        if c.rank() == root {
            check_buffer("recvbuff (on the root)", recvbuff as u64, count)?;
        }
        Ok(vec![Call::Reduce { send: sendbuff as u64, recv: recvbuff as u64, count, dtype, op, root }])
    })
}

/// `ncclAlltoAll`: `count` elements per pair of ranks (buffers of `nranks × count`).
///
/// # Safety
/// As [`ncclAllReduce`], with the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclAlltoAll", comm, stream, |c| {
        let dtype = data_type(datatype)?;
        check_buffers(count, dtype, c.nranks(), sendbuff, recvbuff)?;
        Ok(vec![Call::AllToAll { send: sendbuff as u64, recv: recvbuff as u64, count, dtype }])
    })
}

/// The sends or receives of gather (`to_root`) and scatter: block `p` of the root's buffer
/// pairs with rank `p`'s `count` elements (the root's own block is a copy).
fn rooted(
    c: &NcclComm,
    root: c_int,
    count: usize,
    dt: NcclDataType,
    mine: u64,
    blocks: u64,
    to_root: bool,
) -> Result<Vec<Call>, Fail> {
    let dtype = data_type(dt)?;
    let root = check_rank("root", root, c.nranks())?;
    let bytes = bytes_of(count, dtype, 1)?;
    bytes_of(count, dtype, c.nranks())?;
    check_buffer(if to_root { "sendbuff" } else { "recvbuff" }, mine, count)?;
    let one =
        |peer, buf, send: bool| if send { Call::Send { buf, bytes, peer } } else { Call::Recv { buf, bytes, peer } };
    if c.rank() != root {
        return Ok(vec![one(root, mine, to_root)]);
    }
    check_buffer(if to_root { "recvbuff (on the root)" } else { "sendbuff (on the root)" }, blocks, count)?;
    Ok((0..c.nranks())
        .flat_map(|p| {
            let block = blocks + (p * bytes) as u64;
            if p == root {
                // The root's own block: a send to self paired with a receive from self.
                let (src, dst) = if to_root { (mine, block) } else { (block, mine) };
                vec![one(p, src, true), one(p, dst, false)]
            } else {
                vec![one(p, block, !to_root)]
            }
        })
        .collect())
}

/// `ncclGather`: every rank's `count` elements into block `rank` of the root's `recvbuff`.
///
/// # Safety
/// As [`ncclAllReduce`].
#[allow(clippy::too_many_arguments, reason = "NCCL's signature")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclGather", comm, stream, |c| rooted(c, root, count, datatype, sendbuff as u64, recvbuff as u64, true))
}

/// `ncclScatter`: block `rank` of the root's `sendbuff` into every rank's `recvbuff`.
///
/// # Safety
/// As [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    root: c_int,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclScatter", comm, stream, |c| rooted(c, root, count, datatype, recvbuff as u64, sendbuff as u64, false))
}

fn p2p(c: &NcclComm, buf: u64, count: usize, dt: NcclDataType, peer: c_int, send: bool) -> Result<Vec<Call>, Fail> {
    let dtype = data_type(dt)?;
    let peer = check_rank("peer", peer, c.nranks())?;
    let bytes = bytes_of(count, dtype, 1)?;
    check_buffer(if send { "sendbuff" } else { "recvbuff" }, buf, count)?;
    Ok(vec![if send { Call::Send { buf, bytes, peer } } else { Call::Recv { buf, bytes, peer } }])
}

/// `ncclSend`: `count` elements to `peer` (which calls `ncclRecv`). Outside a group it runs
/// alone; inside one, with the group's other calls (see [`crate::group`]).
///
/// # Safety
/// As [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclSend", comm, stream, |c| p2p(c, sendbuff as u64, count, datatype, peer, true))
}

/// `ncclRecv`: `count` elements from `peer`.
///
/// # Safety
/// As [`ncclAllReduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: NcclDataType,
    peer: c_int,
    comm: NcclCommPtr,
    stream: CudaStreamPtr,
) -> NcclResult {
    submit("ncclRecv", comm, stream, |c| p2p(c, recvbuff as u64, count, datatype, peer, false))
}

/// `ncclGroupStart`: opens a group (groups nest).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    guard("ncclGroupStart", || {
        group::start();
        Ok(())
    })
}

/// `ncclGroupEnd`: closes a group; the outermost runs what was queued (see [`crate::group`]).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    guard("ncclGroupEnd", group::end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_foreign_comms_are_invalid_arguments() {
        let mut x = 0.0f32;
        let p = &mut x as *mut f32 as *mut c_void;
        // SAFETY: the comm checks fail before any buffer is touched.
        unsafe {
            let r = ncclAllReduce(
                p,
                p,
                1,
                NcclDataType::FLOAT32,
                NcclRedOp::SUM,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            assert_eq!(r, NcclResult::INVALID_ARGUMENT);
            let r = ncclSend(p, 1, NcclDataType::FLOAT32, 0, p, std::ptr::null_mut());
            assert_eq!(r, NcclResult::INVALID_ARGUMENT);
        }
    }

    #[test]
    fn group_end_without_start_is_invalid_usage() {
        assert_eq!(ncclGroupEnd(), NcclResult::INVALID_USAGE);
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        assert_eq!(ncclGroupEnd(), NcclResult::SUCCESS);
        assert_eq!(ncclGroupEnd(), NcclResult::SUCCESS);
    }
}
