//! A window of user memory used in place, and the GPU memory a communicator holds, as N ranks
//! (one GPU each, or sharing GPUs):
//!
//! ```text
//! cargo build -p collectives --example gpu_windows
//! cargo xtask launch -n 2 -- target/debug/examples/gpu_windows
//! ```
//!
//! Each rank allocates 1 MiB with `cuMemAlloc`, registers it as a symmetric window, all-reduces
//! in it in place and out of place (the peers' windows are read and written directly, no copy
//! through the workspace), prints what the communicator holds on the GPU, suspends and resumes
//! that memory, then deregisters the window. Then it registers the same memory on its own
//! (`register_device`, NCCL's `ncclCommRegister`: local, no peer takes part) and all-reduces
//! at an offset of its own rank's choosing, in place again, and frees the buffer.

mod common;

use std::error::Error;

use collectives::{DataType, ReduceOp, WindowOffsets};

fn main() -> Result<(), Box<dyn Error>> {
    let Some(common::GpuRank { comm, stream }) = common::gpu_rank()? else { return Ok(()) };
    let (me, n) = (comm.rank(), comm.world_size());
    const COUNT: usize = 1 << 16;
    let bytes = 2 * COUNT * 4;
    // SAFETY: a plain device allocation, freed at the end after the window is deregistered.
    let base = unsafe { cudarc::driver::result::malloc_sync(bytes) }?;
    // SAFETY: `base` holds `bytes` of device memory until it is freed below, after the window.
    let window = unsafe { comm.register_window(base, bytes, WindowOffsets::Symmetric) }?;
    println!("rank {me}: window of {bytes} B, used in place: {}", window.zero_copy());

    // Every rank gives its rank number; the sum is the same on every rank.
    let values = vec![me as f32; COUNT];
    // SAFETY: the first half of the window holds COUNT f32; `values` outlives the synchronize.
    unsafe { cudarc::driver::result::memcpy_htod_async(window.at(0, COUNT * 4)?, &values, stream.cu_stream()) }?;
    // Out of place, into the second half; then in place, in the first.
    comm.all_reduce_in_window(&window, 0, COUNT * 4, COUNT, DataType::F32, ReduceOp::Sum, &stream)?;
    comm.all_reduce_in_window(&window, 0, 0, COUNT, DataType::F32, ReduceOp::Max, &stream)?;
    let mut sums = vec![0f32; COUNT];
    let mut maxima = vec![0f32; COUNT];
    // SAFETY: both halves lie in the window; the vectors outlive the synchronize.
    unsafe {
        cudarc::driver::result::memcpy_dtoh_async(&mut sums, window.at(COUNT * 4, COUNT * 4)?, stream.cu_stream())?;
        cudarc::driver::result::memcpy_dtoh_async(&mut maxima, window.at(0, COUNT * 4)?, stream.cu_stream())?;
    }
    stream.synchronize()?;
    let (sum, max) = ((n * (n - 1) / 2) as f32, (n - 1) as f32);
    if sums.iter().any(|&v| v != sum) || maxima.iter().any(|&v| v != max) {
        return Err(format!("rank {me}: the all-reduces in the window gave wrong results").into());
    }

    let held = comm.device_memory();
    println!("rank {me}: the communicator holds {} B of GPU memory ({held:?})", held.total());
    comm.suspend_device_memory()?;
    println!("rank {me}: suspended, it holds {} B", comm.device_memory().total());
    comm.resume_device_memory()?;

    comm.deregister_window(window)?;

    // The same memory registered by this rank alone; each rank's buffer starts at an offset of
    // its own (rank * 256 bytes): the kernel learns the peers' offsets from them.
    // SAFETY: `base` holds `bytes` of device memory until it is freed below.
    let registration = unsafe { comm.register_device(base, bytes) }?;
    let at = base + (me * 256) as u64;
    let count = COUNT / 2;
    // SAFETY: `at` + `count` f32 lies inside the buffer (me * 256 < COUNT * 4 for up to 1024 ranks);
    // `values` outlives the synchronize.
    unsafe { cudarc::driver::result::memcpy_htod_async(at, &values[..count], stream.cu_stream()) }?;
    // SAFETY: in place inside the registered buffer, which stays allocated until freed below.
    unsafe { comm.all_reduce_device_raw(at, at, count, DataType::F32, ReduceOp::Sum, &stream) }?;
    let mut registered_sums = vec![0f32; count];
    // SAFETY: as above; `registered_sums` outlives the synchronize.
    unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut registered_sums, at, stream.cu_stream()) }?;
    stream.synchronize()?;
    if registered_sums.iter().any(|&v| v != sum) {
        return Err(format!("rank {me}: the all-reduce on the registered buffer gave wrong results").into());
    }
    println!("rank {me}: registered buffer used in place: {}", registration.zero_copy());
    comm.deregister_device(registration)?;
    // SAFETY: allocated above; the window and the registration are gone, and ending them waited
    // for the GPU work.
    unsafe { cudarc::driver::result::free_sync(base) }?;
    println!("rank {me} of {n}: sums and maxima in the window verified");
    Ok(())
}
