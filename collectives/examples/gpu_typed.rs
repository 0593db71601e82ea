//! The safe typed device calls on cudarc buffers, as N ranks (one GPU each, or sharing GPUs):
//!
//! ```text
//! cargo build -p collectives --example gpu_typed
//! cargo xtask launch -n 2 -- target/debug/examples/gpu_typed
//! ```
//!
//! Each rank averages "gradients" in place, gathers every rank's shard, takes rank 0's
//! parameters by broadcast, passes a message around the ring with a device group, then checks
//! every result on the host. Ranks without a GPU path print why and exit.

mod common;

use std::error::Error;

use collectives::ReduceOp;

fn main() -> Result<(), Box<dyn Error>> {
    let Some(common::GpuRank { comm, stream }) = common::gpu_rank()? else { return Ok(()) };
    let (me, n) = (comm.rank(), comm.world_size());
    let len = 1 << 20;

    // All-reduce in place: the average of every rank's gradients.
    let mut grads = stream.clone_htod(&vec![me as f32; len])?;
    comm.all_reduce_device_in_place(&mut grads, ReduceOp::Avg, &stream)?;

    // All-gather of a 1 Ki shard per rank, out of a view of the averaged gradients.
    let shard = grads.slice(me * 1024..(me + 1) * 1024);
    let mut gathered = stream.alloc_zeros::<f32>(n * 1024)?;
    comm.all_gather_device(&shard, &mut gathered, &stream)?;

    // Broadcast rank 0's parameters (only the root's send is read).
    let params = stream.clone_htod(&[if me == 0 { 0.5f32 } else { -1.0 }; 256])?;
    let mut mine = stream.alloc_zeros::<f32>(256)?;
    comm.broadcast_device(&params, &mut mine, 0, &stream)?;

    // A ring shift: one kernel sends to the next rank and receives from the previous one.
    let token = stream.clone_htod(&[me as u32; 64])?;
    let mut from_prev = stream.alloc_zeros::<u32>(64)?;
    let mut group = comm.device_group(&stream);
    group.send(&token, (me + 1) % n).recv(&mut from_prev, (me + n - 1) % n);
    group.run()?;

    // Nothing above waited for the GPU; the downloads below are ordered after the calls.
    let average = (n - 1) as f32 / 2.0;
    let checks = [
        ("all_reduce_device_in_place", stream.clone_dtoh(&grads)?.iter().all(|&v| v == average)),
        ("all_gather_device", stream.clone_dtoh(&gathered)?.iter().all(|&v| v == average)),
        ("broadcast_device", stream.clone_dtoh(&mine)?.iter().all(|&v| v == 0.5)),
        ("device group", stream.clone_dtoh(&from_prev)?.iter().all(|&v| v as usize == (me + n - 1) % n)),
    ];
    stream.synchronize()?;
    comm.check_gpu()?;
    for (call, ok) in checks {
        if !ok {
            return Err(format!("rank {me}: {call} gave a wrong result").into());
        }
    }
    println!("rank {me} of {n}: all_reduce, all_gather, broadcast and a ring shift on the GPU verified");
    Ok(())
}
