//! The `windows` scenario: one buffer (from `cuMemAlloc`) registered as a symmetric window of
//! two communicators over the same ranks (SGLang's pool per process group), each working in its
//! own half of it from its own stream at the same time: all-reduces of several sizes, types and
//! operators, out of place and in place, checked exactly; in place on the windows, no workspace
//! area beyond the control area is made (nothing passes through the workspace, even where the
//! copying kernels would use the pipelined slots). Then a window used with the other
//! communicator is refused, a call on memory outside any window copies as before, and a
//! deregistered window's memory is copied like any other.

use std::sync::Arc;

use collectives::{Communicator, DataType, ReduceOp, Window, WindowOffsets};
use comm_core::{Error, Result};
use cudarc::driver::CudaStream;

use super::{cuda, gpu};

/// Bytes of the window buffer; each communicator takes one half.
const WINDOW_BYTES: usize = 16 << 20;
const HALF: usize = WINDOW_BYTES / 2;

/// One communicator's use of its half of the window buffer.
struct Lane<'a> {
    comm: &'a Communicator,
    window: Window,
    stream: Arc<CudaStream>,
    /// Offset of this lane's half in the window.
    base: usize,
    /// Whether calls name the window (`all_reduce_in_window`) or pass its addresses raw.
    through_window: bool,
}

/// Writes `values` at `offset` bytes into the window (this rank's part), ordered on the lane's
/// stream.
fn put(lane: &Lane<'_>, offset: usize, values: &[f32]) -> Result<()> {
    let at = lane.window.at(lane.base + offset, std::mem::size_of_val(values))?;
    // SAFETY: inside this rank's part of the window (checked by `at`); `values` outlives the
    // copy, which the lane synchronizes before returning to the caller's next use.
    unsafe { cudarc::driver::result::memcpy_htod_async(at, values, lane.stream.cu_stream()) }
        .map_err(cuda("upload into the window"))?;
    lane.stream.synchronize().map_err(cuda("synchronize"))
}

/// Reads `count` f32 at `offset` bytes into the window.
fn get(lane: &Lane<'_>, offset: usize, count: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; count];
    let at = lane.window.at(lane.base + offset, count * 4)?;
    // SAFETY: inside this rank's part of the window (checked); `out` lives past the synchronize.
    unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut out, at, lane.stream.cu_stream()) }
        .map_err(cuda("download from the window"))?;
    lane.stream.synchronize().map_err(cuda("synchronize"))?;
    Ok(out)
}

/// The input of rank `r` in call `call`: small integers, so every sum is exact.
fn value(call: usize, r: usize, i: usize) -> f32 {
    ((i * 7 + call * 3 + r * 5) % 13) as f32
}

/// Starts an all-reduce (sum, or max when `call` is odd) of `count` f32 on the lane: in place at
/// the half's start, or from there to the half's middle.
fn start(lane: &Lane<'_>, call: usize, count: usize, in_place: bool) -> Result<()> {
    let r = lane.comm.rank();
    let input: Vec<f32> = (0..count).map(|i| value(call, r, i)).collect();
    put(lane, 0, &input)?;
    let op = if call % 2 == 1 { ReduceOp::Max } else { ReduceOp::Sum };
    let recv = lane.base + if in_place { 0 } else { HALF / 2 };
    if lane.through_window {
        return lane.comm.all_reduce_in_window(&lane.window, lane.base, recv, count, DataType::F32, op, &lane.stream);
    }
    let (send, recv) = (lane.window.at(lane.base, count * 4)?, lane.window.at(recv, count * 4)?);
    // SAFETY: both ranges lie in the window's memory (checked), which the caller keeps
    // allocated; equal or disjoint.
    unsafe { lane.comm.all_reduce_device_raw(send, recv, count, DataType::F32, op, &lane.stream) }
}

/// Checks the result of [`start`]'s call.
fn check(lane: &Lane<'_>, call: usize, count: usize, in_place: bool) -> Result<()> {
    let n = lane.comm.world_size();
    let out = get(lane, if in_place { 0 } else { HALF / 2 }, count)?;
    for (i, &got) in out.iter().enumerate() {
        let values = (0..n).map(|r| value(call, r, i));
        let want = if call % 2 == 1 { values.fold(f32::MIN, f32::max) } else { values.sum() };
        if got != want {
            return Err(Error::protocol(format!(
                "windowed all-reduce #{call} of {count} f32 (in place: {in_place}) on the communicator at offset {}: \
                 element {i} is {got}, not {want}",
                lane.base
            )));
        }
    }
    Ok(())
}

pub(super) fn windows() -> Result<String> {
    let g = gpu()?;
    let other = g
        .comm
        .split(Some(0), g.comm.rank() as i64)?
        .ok_or_else(|| Error::protocol("a split with a color gave no communicator"))?;
    let ctx = g.comm.gpu_context().ok_or_else(|| Error::Unsupported("no GPU context".into()))?;
    // SAFETY: a plain device allocation, freed below after both windows are deregistered.
    let base = unsafe { cudarc::driver::result::malloc_sync(WINDOW_BYTES) }.map_err(cuda("cuMemAlloc"))?;
    let result = with_windows(&g.comm, &other, &ctx, base);
    // SAFETY: allocated above; no window or call uses it any more (`with_windows` deregistered
    // both windows, which waited for the GPU work).
    unsafe { cudarc::driver::result::free_sync(base) }.map_err(cuda("cuMemFree"))?;
    result
}

fn with_windows(
    comm: &Communicator,
    other: &Communicator,
    ctx: &Arc<cudarc::driver::CudaContext>,
    base: u64,
) -> Result<String> {
    // SAFETY: `base` holds WINDOW_BYTES of device memory until the caller frees it, after
    // deregistering.
    let window_a = unsafe { comm.register_window(base, WINDOW_BYTES, WindowOffsets::Symmetric) }?;
    // SAFETY: as above; the same memory, a window of the other communicator too.
    let window_b = unsafe { other.register_window(base, WINDOW_BYTES, WindowOffsets::Symmetric) }?;
    if !window_a.zero_copy() || !window_b.zero_copy() {
        return Err(Error::protocol("windows between GPUs reached by CUDA IPC are not used in place"));
    }
    let control_only = comm.device_memory().releasable;
    let stream = || ctx.new_stream().map_err(cuda("stream"));
    let a = Lane { comm, window: window_a.clone(), stream: stream()?, base: 0, through_window: true };
    let b = Lane { comm: other, window: window_b.clone(), stream: stream()?, base: HALF, through_window: true };
    // Sizes from one element to 1 MiB of f32 (the last ones would take the pipelined slots
    // through the workspace).
    const COUNTS: [usize; 8] = [1, 7, 1000, 4096, 16_383, 65_536, 100_003, 262_144];
    let mut calls = 0;
    for call in 0..500 {
        let count = COUNTS[call % COUNTS.len()];
        let in_place = call % 3 == 0;
        // Both communicators' calls in flight at once, on their own streams.
        start(&a, call, count, in_place)?;
        start(&b, call + 1, count, in_place)?;
        check(&a, call, count, in_place)?;
        check(&b, call + 1, count, in_place)?;
        calls += 2;
    }
    let after = comm.device_memory().releasable;
    if after != control_only {
        return Err(Error::protocol(format!(
            "windowed all-reduces made workspace areas: {control_only} B before, {after} B after"
        )));
    }
    // A window of one communicator used with the other is an error naming the mistake.
    match other.all_reduce_in_window(&window_a, HALF, HALF, 16, DataType::F32, ReduceOp::Sum, &b.stream) {
        Err(Error::InvalidArgument(m)) if m.contains("another communicator") => {}
        other => return Err(Error::protocol(format!("a window of another communicator gave {other:?}"))),
    }
    comm.deregister_window(window_a.clone())?;
    if comm.deregister_window(window_a).is_ok() {
        return Err(Error::protocol("a window was deregistered twice"));
    }
    // The memory is no window of `comm` any more: its calls copy through the workspace.
    let after_lane = Lane { comm, window: window_b.clone(), stream: a.stream.clone(), base: 0, through_window: false };
    start(&after_lane, 7, 100_003, false)?;
    check(&after_lane, 7, 100_003, false)?;
    other.deregister_window(window_b)?;
    Ok(format!(
        "{calls} windowed all-reduces on two communicators at once (1 to 262,144 f32, in and out of place) exact, \
         no workspace area made; wrong communicator refused; after deregistering, copied and exact"
    ))
}
