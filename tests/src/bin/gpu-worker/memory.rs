//! The `device-memory` scenario: the GPU memory a communicator holds, as
//! `Communicator::device_memory` reports it, after creation, after an 8-byte all-reduce, after
//! all-reduces up to 1 MiB and after one of 256 MiB; suspended (nothing releasable held, device
//! calls refused, a second suspend refused) and resumed (calls exact again); and a one-rank
//! communicator, which holds none before or after its calls.

use collectives::{Communicator, DeviceMemory, ReduceOp};
use comm_core::{Error, Result};
use cudarc::driver::CudaStream;

use super::{cuda, gpu};

/// The most a communicator may hold after creation and after small calls.
const SMALL_LIMIT: usize = 64 << 20;
/// The most it may hold after a 256 MiB all-reduce: the workspace before areas were made when
/// first needed took 310–340 MiB per rank.
const LARGE_LIMIT: usize = 340 << 20;

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn at_most(what: &str, m: DeviceMemory, limit: usize) -> Result<()> {
    if m.total() > limit || m.suspended {
        return Err(Error::protocol(format!(
            "{what}: the communicator holds {m:?}, more than {} (or suspended)",
            mib(limit)
        )));
    }
    Ok(())
}

/// An all-reduce (sum) of `count` f32 on `comm`, checked exactly: rank r gives (i mod 7) + r.
fn all_reduce_checked(comm: &Communicator, stream: &std::sync::Arc<CudaStream>, count: usize) -> Result<()> {
    let (n, r) = (comm.world_size(), comm.rank());
    let input: Vec<f32> = (0..count).map(|i| (i % 7 + r) as f32).collect();
    let send = stream.clone_htod(&input).map_err(cuda("upload"))?;
    let mut recv = stream.alloc_zeros::<f32>(count).map_err(cuda("allocate"))?;
    comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, stream)?;
    let out = stream.clone_dtoh(&recv).map_err(cuda("download"))?;
    let ranks_sum = n * (n - 1) / 2;
    if let Some(i) = (0..count).find(|&i| out[i] != (n * (i % 7) + ranks_sum) as f32) {
        return Err(Error::protocol(format!(
            "all-reduce of {count} f32 on {n} ranks: element {i} is {}, not {}",
            out[i],
            n * (i % 7) + ranks_sum
        )));
    }
    Ok(())
}

pub(super) fn device_memory() -> Result<String> {
    let g = gpu()?;
    let (comm, stream) = (&g.comm, &g.stream);
    let created = comm.device_memory();
    at_most("after creation", created, SMALL_LIMIT)?;
    if comm.world_size() > 1 && created.releasable == 0 {
        return Err(Error::protocol("a communicator with peers reports no control area after creation"));
    }
    all_reduce_checked(comm, stream, 2)?;
    let eight_bytes = comm.device_memory();
    at_most("after an 8-byte all-reduce", eight_bytes, SMALL_LIMIT)?;
    for count in [1 << 10, 1 << 14, 1 << 16, 1 << 18] {
        all_reduce_checked(comm, stream, count)?;
    }
    let to_1mib = comm.device_memory();
    at_most("after all-reduces up to 1 MiB", to_1mib, SMALL_LIMIT)?;
    all_reduce_checked(comm, stream, 64 << 20)?;
    let large = comm.device_memory();
    at_most("after a 256 MiB all-reduce", large, LARGE_LIMIT)?;

    comm.suspend_device_memory()?;
    let suspended = comm.device_memory();
    if suspended.releasable != 0 || !suspended.suspended {
        return Err(Error::protocol(format!("suspended, the communicator still holds {suspended:?}")));
    }
    match all_reduce_checked(comm, stream, 2) {
        Err(Error::InvalidArgument(m)) if m.contains("suspended") => {}
        other => return Err(Error::protocol(format!("a device call while suspended gave {other:?}"))),
    }
    if comm.suspend_device_memory().is_ok() {
        return Err(Error::protocol("a second suspend was accepted"));
    }
    comm.resume_device_memory()?;
    let resumed = comm.device_memory();
    at_most("resumed", resumed, SMALL_LIMIT)?;
    all_reduce_checked(comm, stream, 2)?;
    all_reduce_checked(comm, stream, 64 << 20)?;
    let again = comm.device_memory();
    at_most("resumed, after a 256 MiB all-reduce", again, LARGE_LIMIT)?;

    let alone = comm
        .split(Some(comm.rank() as u32), 0)?
        .ok_or_else(|| Error::protocol("a split with a color gave no communicator"))?;
    let one_rank_created = alone.device_memory().total();
    all_reduce_checked(&alone, stream, 1000)?;
    let one_rank_after = alone.device_memory().total();
    if one_rank_created + one_rank_after != 0 {
        return Err(Error::protocol(format!(
            "a one-rank communicator holds {one_rank_created} B after creation and {one_rank_after} B after a call"
        )));
    }
    Ok(format!(
        "rank {} of {}: created {}, after 8 B {}, after ≤ 1 MiB {}, after 256 MiB {}, suspended {}, resumed {}, \
         again after 256 MiB {}; one rank 0 B",
        comm.rank(),
        comm.world_size(),
        mib(created.total()),
        mib(eight_bytes.total()),
        mib(to_1mib.total()),
        mib(large.total()),
        mib(suspended.total()),
        mib(resumed.total()),
        mib(again.total())
    ))
}
