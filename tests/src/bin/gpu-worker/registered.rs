//! The `registered` scenario: each rank allocates its own buffer (`cuMemAlloc`) and registers
//! it alone (`register_device`, NCCL's `ncclCommRegister`), using it at an offset that differs
//! between ranks; 1,000 all-reduces of several sizes, types and operators on it, out of place
//! and in place, checked exactly, with no workspace area made beyond the control area (nothing
//! passes through the workspace: the zero-copy check). A registration belongs to its
//! communicator (another communicator's calls on the same memory copy, and its deregistration
//! there is refused); after deregistering, calls on the memory copy and are exact.

use std::sync::Arc;

use collectives::{Communicator, DataType, DeviceRegistration, ReduceOp};
use comm_core::{Error, Result};
use cudarc::driver::CudaStream;

use super::{cuda, gpu};

/// Bytes of each rank's buffer.
const BUFFER_BYTES: usize = 8 << 20;
/// Where the output starts, from the input (out of place).
const OUTPUT_AT: usize = 4 << 20;

/// Where this rank's input starts in its buffer: different on every rank, so the kernel must
/// learn each peer's offset from the peer.
fn input_at(rank: usize) -> usize {
    rank * 4096 + 256
}

/// The input of rank `r` in call `call`: small integers, so every sum is exact.
fn value(call: usize, r: usize, i: usize) -> f32 {
    ((i * 5 + call * 7 + r * 3) % 11) as f32
}

struct Buffer {
    base: u64,
    stream: Arc<CudaStream>,
}

impl Buffer {
    fn put(&self, at: usize, values: &[f32]) -> Result<()> {
        // SAFETY: inside the buffer (the callers' offsets leave room); `values` outlives the copy,
        // which is synchronized before returning.
        unsafe { cudarc::driver::result::memcpy_htod_async(self.base + at as u64, values, self.stream.cu_stream()) }
            .map_err(cuda("upload"))?;
        self.stream.synchronize().map_err(cuda("synchronize"))
    }

    fn get(&self, at: usize, count: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; count];
        // SAFETY: inside the buffer; `out` lives past the synchronize.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, self.base + at as u64, self.stream.cu_stream()) }
            .map_err(cuda("download"))?;
        self.stream.synchronize().map_err(cuda("synchronize"))?;
        Ok(out)
    }

    /// An all-reduce (sum, or max when `call` is odd) of `count` f32 on `comm`, checked.
    fn all_reduce(&self, comm: &Communicator, call: usize, count: usize, in_place: bool) -> Result<()> {
        let r = comm.rank();
        let from = input_at(r);
        let to = if in_place { from } else { OUTPUT_AT + from };
        self.put(from, &(0..count).map(|i| value(call, r, i)).collect::<Vec<_>>())?;
        let op = if call % 2 == 1 { ReduceOp::Max } else { ReduceOp::Sum };
        let (send, recv) = (self.base + from as u64, self.base + to as u64);
        // SAFETY: both ranges lie in this rank's buffer, allocated until the scenario frees it
        // after the calls; equal or disjoint.
        unsafe { comm.all_reduce_device_raw(send, recv, count, DataType::F32, op, &self.stream) }?;
        let out = self.get(to, count)?;
        let n = comm.world_size();
        for (i, &got) in out.iter().enumerate() {
            let values = (0..n).map(|q| value(call, q, i));
            let want = if call % 2 == 1 { values.fold(f32::MIN, f32::max) } else { values.sum() };
            if got != want {
                return Err(Error::protocol(format!(
                    "all-reduce #{call} of {count} f32 on registered buffers (in place: {in_place}): element {i} is \
                     {got}, not {want}"
                )));
            }
        }
        Ok(())
    }
}

pub(super) fn registered() -> Result<String> {
    let g = gpu()?;
    // SAFETY: a plain device allocation, freed below after the registration is ended.
    let base = unsafe { cudarc::driver::result::malloc_sync(BUFFER_BYTES) }.map_err(cuda("cuMemAlloc"))?;
    let result = with_registration(&g.comm, base, &g.stream);
    // SAFETY: allocated above; `with_registration` ended the registration (which waited for the
    // GPU work) or failed before any call used it.
    unsafe { cudarc::driver::result::free_sync(base) }.map_err(cuda("cuMemFree"))?;
    result
}

fn with_registration(comm: &Communicator, base: u64, stream: &Arc<CudaStream>) -> Result<String> {
    let other = comm
        .split(Some(0), comm.rank() as i64)?
        .ok_or_else(|| Error::protocol("a split with a color gave no communicator"))?;
    // SAFETY: `base` holds BUFFER_BYTES of device memory until the caller frees it, after
    // deregistering.
    let registration: DeviceRegistration = unsafe { comm.register_device(base, BUFFER_BYTES) }?;
    if !registration.zero_copy() {
        return Err(Error::protocol("a registration between GPUs reached by CUDA IPC is not used in place"));
    }
    let control_only = comm.device_memory().releasable;
    let buffer = Buffer { base, stream: stream.clone() };
    // One element to 1 MiB of f32 (the largest would take the pipelined slots when copied).
    const COUNTS: [usize; 8] = [1, 3, 1000, 4096, 16_383, 65_536, 100_003, 262_144];
    for call in 0..1000 {
        buffer.all_reduce(comm, call, COUNTS[call % COUNTS.len()], call % 3 == 0)?;
    }
    let after = comm.device_memory().releasable;
    if after != control_only {
        return Err(Error::protocol(format!(
            "all-reduces on registered buffers made workspace areas: {control_only} B before, {after} B after"
        )));
    }
    // The other communicator has no registration of this memory: its calls copy, and exactly.
    let other_before = other.device_memory().releasable;
    buffer.all_reduce(&other, 5, 262_144, false)?;
    if other.device_memory().releasable <= other_before {
        return Err(Error::protocol("a call of a communicator without the registration made no workspace area"));
    }
    match other.deregister_device(registration.clone()) {
        Err(Error::InvalidArgument(m)) if m.contains("another communicator") => {}
        r => return Err(Error::protocol(format!("ending another communicator's registration gave {r:?}"))),
    }
    comm.deregister_device(registration.clone())?;
    if comm.deregister_device(registration).is_ok() {
        return Err(Error::protocol("a registration was ended twice"));
    }
    // No registration any more: the calls copy (through the slots the size needs) and are exact.
    buffer.all_reduce(comm, 7, 262_144, false)?;
    if comm.device_memory().releasable <= control_only {
        return Err(Error::protocol("after deregistering, a 1 MiB all-reduce made no workspace area"));
    }
    Ok(format!(
        "1000 all-reduces on registered buffers at different offsets per rank (1 to 262,144 f32, in and out of \
         place) exact, no workspace area made ({control_only} B held); another communicator copies and its \
         deregistration is refused; after deregistering, copied and exact"
    ))
}
