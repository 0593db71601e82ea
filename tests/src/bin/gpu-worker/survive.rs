//! `gpu-worker survive-device`: checked device all-reduces and all-gathers until the middle rank
//! ([`victim`]) SIGKILLs itself in the middle of one; every survivor must fail, revoke, agree on
//! exactly that rank, shrink (the ranks above it renumbered), and run checked device
//! all-reduces and all-gathers on the shrunk communicator — with the family the table picks, or
//! the channel family under `WEAVE_ALGO=channel`. The `OK` line says how long after the kill
//! the survivor failed, how long agreement and shrink took, and whether the shrink carried the
//! transports and connections over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use collectives::{Communicator, ReduceOp};
use comm_core::{Error, Result};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream};

use super::{Gpu, cuda, gpu, wall_ns};

/// Elements of each call (4 MiB of f32).
const ELEMS: usize = 1 << 20;
/// Checked calls on the shrunk communicator.
const CALLS_AFTER: usize = 50;

/// The value original rank `r` contributes in round `i`.
fn value(r: usize, i: usize) -> f32 {
    ((r + 1) * (i % 13 + 1)) as f32
}

/// Launches round `i` on `comm` (whose members are the original ranks `members`): an
/// all-reduce (even `i`) or all-gather (odd `i`) of this rank's values; returns its send and
/// receive buffers, which must outlive the call.
fn launch_round(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    members: &[usize],
    i: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let me = members[comm.rank()];
    let n = members.len();
    let reducing = i.is_multiple_of(2);
    let count = if reducing { ELEMS } else { ELEMS / 8 };
    let send: CudaSlice<f32> = stream.clone_htod(&vec![value(me, i); count]).map_err(cuda("upload"))?;
    let mut recv: CudaSlice<f32> =
        stream.alloc_zeros(if reducing { count } else { count * n }).map_err(cuda("alloc"))?;
    if reducing {
        comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, stream)?;
    } else {
        comm.all_gather_device(&send, &mut recv, stream)?;
    }
    Ok((send, recv))
}

/// One checked round `i` (see [`launch_round`]).
fn checked(comm: &Communicator, stream: &Arc<CudaStream>, members: &[usize], i: usize) -> Result<()> {
    let reducing = i.is_multiple_of(2);
    let count = if reducing { ELEMS } else { ELEMS / 8 };
    let (_send, recv) = launch_round(comm, stream, members, i)?;
    let got = stream.clone_dtoh(&recv).map_err(cuda("download"))?;
    // Device calls are stream-ordered: a call whose peer died returned before it ran, and says
    // so here, after the stream's work is done and before its results are trusted.
    comm.check_gpu()?;
    let want =
        |at: usize| if reducing { members.iter().map(|&r| value(r, i)).sum() } else { value(members[at / count], i) };
    if let Some(at) = (0..got.len()).find(|&at| got[at] != want(at)) {
        return Err(Error::protocol(format!(
            "WRONG DATA: round {i} ({}): element {at} is {}, want {}",
            if reducing { "all_reduce" } else { "all_gather" },
            got[at],
            want(at)
        )));
    }
    Ok(())
}

/// The rank of `n` that dies: the middle one, so that the ranks above it are renumbered.
pub(crate) fn victim(n: usize) -> usize {
    n / 2
}

/// Runs the scenario on this rank (see the module documentation).
pub(crate) fn survive_device() -> Result<String> {
    let Gpu { comm, stream } = gpu()?;
    let n = comm.world_size();
    let me = comm.rank();
    let victim = victim(n);
    let members: Vec<usize> = (0..n).collect();
    for i in 0..4 {
        checked(&comm, &stream, &members, i)?;
    }
    comm.core().bootstrap().barrier()?;
    if me == victim {
        let delay = Duration::from_micros(u64::from(std::process::id().wrapping_mul(2_654_435_761) % 30_000));
        let started = Instant::now();
        let mut i = 0;
        while started.elapsed() < delay {
            checked(&comm, &stream, &members, i)?;
            i += 1;
        }
        // Round i, launched and not waited for: the kill lands in the middle of it. Its values
        // are the round's, so a survivor whose call completed before the kill got exact data.
        let _buffers = launch_round(&comm, &stream, &members, i)?;
        println!("KILL_AT {}", wall_ns());
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).map_err(|e| Error::errno("raise SIGKILL", e))?;
        return Err(Error::protocol("SIGKILL returned"));
    }
    let mut i = 0;
    let failure = loop {
        match checked(&comm, &stream, &members, i) {
            Ok(()) => i += 1,
            Err(e @ Error::Protocol(_)) if e.to_string().contains("WRONG DATA") => return Err(e),
            Err(e @ Error::InvalidArgument(_)) => return Err(e),
            Err(e) => break e,
        }
        if i > 100_000 {
            return Err(Error::protocol("100,000 device calls went through with a killed peer"));
        }
    };
    println!("DETECTED_AT {}", wall_ns());
    comm.revoke();
    // The old communicator's work must be over before its buffers and stream are reused.
    let _ = stream.synchronize();
    let t = Instant::now();
    let lost = comm.agree_on_failed()?;
    let agreed = t.elapsed();
    if lost != [victim] {
        return Err(Error::protocol(format!("agreed on {lost:?}, but only rank {victim} died")));
    }
    let t = Instant::now();
    let shrunk = comm.shrink(&lost)?;
    let took = t.elapsed();
    if !shrunk.has_gpu() {
        return Err(Error::protocol("the shrunk communicator has no GPU path"));
    }
    let stream = shrunk
        .gpu_context()
        .ok_or_else(|| Error::Unsupported("no GPU context".into()))?
        .new_stream()
        .map_err(cuda("new stream"))?;
    let carried = shrunk.core().shares_transports_with(comm.core());
    let survivors: Vec<usize> = (0..n).filter(|&r| r != victim).collect();
    for i in 0..CALLS_AFTER {
        checked(&shrunk, &stream, &survivors, i)?;
    }
    let family = std::env::var("WEAVE_ALGO").unwrap_or_else(|_| "table".into());
    Ok(format!(
        "{family}: failed with {}; agreed on {lost:?} in {} ms, shrunk in {} ms (transports {}); then {CALLS_AFTER} \
         checked device calls on {} ranks exact",
        weave_tests::survive::kind(&failure),
        agreed.as_millis(),
        took.as_millis(),
        if carried { weave_tests::survive::CARRIED } else { "opened anew" },
        shrunk.world_size()
    ))
}

/// The program of the kernel that keeps a GPU busy in `stall-device busy`: one thread spins
/// for `cycles` GPU clock cycles (also compiled ahead by `precompile`).
pub(crate) const BUSY_KERNEL: &str = r#"
extern "C" __global__ void weave_test_busy(unsigned long long cycles) {
  const long long start = clock64();
  while (clock64() - start < static_cast<long long>(cycles)) {
  }
}
"#;

/// The kernel of [`BUSY_KERNEL`], compiled and loaded on `stream`'s GPU.
fn busy_kernel(stream: &Arc<CudaStream>) -> Result<CudaFunction> {
    let ctx = stream.context();
    let arch = kernels::arch::device_arch(ctx)?;
    let compiled = kernels::compile::Compiler::from_env().compile(BUSY_KERNEL, &arch)?;
    kernels::module::KernelModule::load(ctx, &compiled)?.function("weave_test_busy")
}

/// Queues `function` (the [`busy_kernel`]) on `stream`, keeping the GPU busy for about `busy`.
fn keep_busy(function: &CudaFunction, stream: &Arc<CudaStream>, busy: Duration) -> Result<()> {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let ctx = stream.context();
    let khz = ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
        .map_err(cuda("clock rate"))?;
    let cycles = u64::try_from(khz).unwrap_or(2_000_000) * busy.as_millis() as u64;
    let config = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(function);
    launch.arg(&cycles);
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { launch.launch(config) }.map_err(cuda("launch the busy kernel"))?;
    Ok(())
}

/// `gpu-worker stall-device [skip|busy]`: two checked device calls, then the last rank holds
/// up the third — `skip`: it does not call it (it sleeps past the others' timeout); `busy`: it
/// calls it behind a kernel that keeps its GPU busy past the others' timeout. The others'
/// kernels wait for it until `WEAVE_TIMEOUT`, and `check_gpu` must return a timeout whose
/// verdict names the last rank as behind — the same text on every other rank. The `OK` line
/// reads `VERDICT text` (or what the last rank did).
pub(crate) fn stall_device(mode: &str) -> Result<String> {
    if !matches!(mode, "" | "skip" | "busy") {
        return Err(Error::invalid(format!("stall-device: unknown mode {mode:?} (skip or busy)")));
    }
    let Gpu { comm, stream } = gpu()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let members: Vec<usize> = (0..n).collect();
    // Loaded before the calls: the stall must come from the GPU, not from compiling.
    let busy = if mode == "busy" && me == n - 1 { Some(busy_kernel(&stream)?) } else { None };
    for i in 0..2 {
        checked(&comm, &stream, &members, i)?;
    }
    let timeout = comm.core().config().timeout;
    let send: CudaSlice<f32> = stream.alloc_zeros(ELEMS).map_err(cuda("alloc"))?;
    let mut recv: CudaSlice<f32> = stream.alloc_zeros(ELEMS).map_err(cuda("alloc"))?;
    match (me == n - 1, &busy) {
        (true, None) => {
            std::thread::sleep(timeout + Duration::from_secs(4));
            return Ok("skipped the third call".into());
        }
        (true, Some(function)) => {
            keep_busy(function, &stream, timeout + Duration::from_secs(3))?;
            comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &stream)?;
            // Reachable while the others ask; its own kernel then waits for kernels that gave up.
            std::thread::sleep(timeout + Duration::from_secs(4));
            let _ = stream.synchronize();
            return Ok(format!("called the third behind a busy GPU; then {:?}", comm.check_gpu().err()));
        }
        (false, _) => {}
    }
    let started = Instant::now();
    comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &stream)?;
    // The kernel gives up at the timeout; the stream then reports success or the launch's error.
    let _ = stream.synchronize();
    let e = match comm.check_gpu() {
        Ok(()) => return Err(Error::protocol("the device call completed without the last rank")),
        Err(e) => e,
    };
    let took = started.elapsed();
    let verdict = e.verdict().ok_or_else(|| Error::protocol(format!("no verdict in the device error: {e}")))?;
    // Reachable until the others have asked.
    std::thread::sleep(Duration::from_secs(2));
    Ok(format!("failed after {} ms; VERDICT {verdict}", took.as_millis()))
}

/// `gpu-worker p2p-mismatch-device`: rank 1 sends 36 B on the device to rank 0, which posts no
/// receive; then both exchange in a device group (rank 0 receives 20 B and sends 8 B). Rank 0's
/// `check_gpu` must report the mismatch (a protocol error), its receive buffer must not hold
/// the later message, and every rank's next call must fail with `Revoked` — with the family
/// the table picks, or the channel family under `WEAVE_ALGO=channel`.
pub(crate) fn p2p_mismatch_device() -> Result<String> {
    let Gpu { comm, stream } = gpu()?;
    let (me, n) = (comm.rank(), comm.world_size());
    if n < 2 {
        return Err(Error::invalid("p2p-mismatch-device needs at least 2 ranks"));
    }
    let upload = |bytes: &[u8]| stream.clone_htod(bytes).map_err(cuda("upload"));
    let mut got: CudaSlice<u8> = stream.alloc_zeros(20).map_err(cuda("alloc"))?;
    match me {
        0 => {
            let eight = upload(&[8u8; 8])?;
            let mut g = comm.device_group(&stream);
            g.recv(&mut got, 1).send(&eight, 1);
            g.run()?;
        }
        1 => {
            let (orphan, later) = (upload(&[0x0au8; 36])?, upload(&[0x0bu8; 20])?);
            comm.send_device(&orphan, 0, &stream)?;
            let mut back: CudaSlice<u8> = stream.alloc_zeros(8).map_err(cuda("alloc"))?;
            let mut g = comm.device_group(&stream);
            g.send(&later, 0).recv(&mut back, 0);
            g.run()?;
        }
        _ => {}
    }
    let _ = stream.synchronize();
    let checked = comm.check_gpu();
    let seen = match (me, checked) {
        (0, Err(e @ Error::Protocol(_))) if e.to_string().contains("mismatch on the GPU") => e.to_string(),
        (0, other) => return Err(Error::protocol(format!("rank 0 was to find the mismatch, got {other:?}"))),
        (_, Ok(()) | Err(Error::Protocol(_) | Error::Revoked(_))) => String::new(),
        (_, Err(e)) => return Err(Error::protocol(format!("rank {me}: expected a mismatch or a revocation, got {e}"))),
    };
    let received = stream.clone_dtoh(&got).map_err(cuda("download"))?;
    if me == 0 && received.contains(&0x0b) {
        return Err(Error::protocol("WRONG DATA: the failed receive holds the later message"));
    }
    let mut sum = [0u64];
    match comm.all_reduce(&[1u64], &mut sum, ReduceOp::Sum) {
        Err(Error::Revoked(_)) => {}
        other => return Err(Error::protocol(format!("the call after the mismatch returned {other:?}"))),
    }
    let family = std::env::var("WEAVE_ALGO").unwrap_or_else(|_| "table".into());
    Ok(match me {
        0 => format!("{family}: found: {seen}; then revoked"),
        _ => format!("{family}: revoked"),
    })
}
