//! One rank of a weave GPU test: `gpu-worker SCENARIO`, launched once per GPU by the GPU test
//! target. Prints `OK SCENARIO …` and exits 0 on success; prints the error and exits 1.
//! Scenarios: `precompile [EXPORT_DIR]` (fills the kernel cache, no GPU needed; copies the
//! entries of every program into `EXPORT_DIR` when given), `matrix`, `forced`, `wide`,
//! `graph`, `stale-state`, `fault-kill`, `kill-trial`, `p2p`, `typed` (the safe calls on cudarc
//! buffers, `typed.rs`), `survive-device` (a rank killed mid all-reduce; the others shrink and go
//! on, `survive.rs`), `gpu-off`, `device-memory` (what a communicator holds on its GPU,
//! suspended and resumed, `memory.rs`), `windows` (one buffer a window of two communicators,
//! used in place from two streams at once, `windows.rs`), `registered` (buffers each rank
//! registered alone, used in place at offsets that differ between ranks, `registered.rs`).

mod hierarchy;
mod memory;
mod registered;
mod survive;
mod typed;
mod windows;

use std::sync::Arc;
use std::time::{Duration, Instant};

use collectives::{Communicator, DataType, Element, F8E4M3, F8E5M2, ReduceOp, bf16, f16};
use comm_core::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use weave_tests::matrix::{compare, fill, input, reference};
use weave_tests::worker;

fn main() {
    worker::run(|scenario, arg| match scenario {
        "precompile" => precompile(arg),
        "matrix" => matrix(),
        "forced" => forced(),
        "wide" => wide(),
        "graph" => graph(),
        "stale-state" => stale_state(),
        "fault-kill" => fault_kill(),
        "kill-trial" => kill_trial(arg),
        "p2p" => p2p(),
        "typed" => typed::typed(),
        "survive-device" => survive::survive_device(),
        "stall-device" => survive::stall_device(arg),
        "p2p-mismatch-device" => survive::p2p_mismatch_device(),
        "gpu-off" => gpu_off(),
        "device-memory" => memory::device_memory(),
        "windows" => windows::windows(),
        "registered" => registered::registered(),
        other => Err(worker::unknown_scenario(other)),
    })
}

fn cuda(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Cuda { operation: what.to_string(), message: e.to_string() }
}

/// Compiles the collective, conversion and channel kernels for sm_90 into the kernel cache
/// (`WEAVE_KERNEL_CACHE`), so GPU hosts load them instead of compiling; with a non-empty
/// `export_dir`, also copies each program's cache entry there (a cache of exactly these
/// programs, for `cargo xtask gpu-bundle --kernel-cache`).
fn precompile(export_dir: &str) -> Result<String> {
    use kernels::channel::{ChannelKernel, REDUCING_TYPES};
    let compiler = kernels::compile::Compiler::from_env();
    let mut programs = vec![
        ("collective kernels".to_string(), kernels::direct::program()),
        ("busy kernel".to_string(), survive::BUSY_KERNEL.to_string()),
        ("conversion kernels".to_string(), kernels::convert::program()),
    ];
    let channel =
        std::iter::once(ChannelKernel::Moving).chain(REDUCING_TYPES.iter().map(|(t, _)| ChannelKernel::Reducing(t)));
    for k in channel {
        programs.push((k.name().to_string(), k.program()?));
    }
    let mut outcomes = Vec::new();
    for (name, program) in &programs {
        let compiled = compiler.compile(program, "sm_90")?;
        outcomes.push(format!("{name}: {:?}", compiled.cache()));
        if !export_dir.is_empty() {
            export_entry(&compiler, compiled.key(), std::path::Path::new(export_dir))?;
        }
    }
    let exported = if export_dir.is_empty() { String::new() } else { format!("; exported to {export_dir}") };
    Ok(format!("sm_90 programs: {}{exported}", outcomes.join(", ")))
}

/// Copies the cache entry of `key` from `compiler`'s cache into `dir`.
fn export_entry(compiler: &kernels::compile::Compiler, key: u128, dir: &std::path::Path) -> Result<()> {
    let cache = compiler.cache_dir().ok_or_else(|| {
        Error::invalid("precompile EXPORT_DIR needs a kernel cache to export from; WEAVE_KERNEL_CACHE disables it")
    })?;
    let (from, to) = (kernels::compile::entry_path(cache, key), kernels::compile::entry_path(dir, key));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    std::fs::copy(&from, &to)
        .map_err(|e| Error::io(format!("copying {} to {} (was the entry stored?)", from.display(), to.display()), e))?;
    Ok(())
}

struct Gpu {
    comm: Communicator,
    stream: Arc<CudaStream>,
}

/// The communicator from the environment and a stream of the worker's own, made from a context
/// handle of its own as a program's would be (not the communicator's handle, whose first
/// stream the engine itself makes, or not).
fn gpu() -> Result<Gpu> {
    let comm = Communicator::from_env()?;
    if !comm.has_gpu() {
        return Err(Error::Unsupported("no GPU path on this rank (no CUDA device or driver)".into()));
    }
    let ordinal = comm.gpu_context().ok_or_else(|| Error::Unsupported("no GPU context".into()))?.ordinal();
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(cuda("open the device"))?;
    let stream = ctx.new_stream().map_err(cuda("new stream"))?;
    Ok(Gpu { comm, stream })
}

/// Run with `WEAVE_GPU=off` on a GPU host: the communicator builds without a GPU path and
/// refuses a device call, saying why; its host calls work.
fn gpu_off() -> Result<String> {
    let comm = Communicator::from_env()?;
    if comm.has_gpu() || comm.gpu_context().is_some() {
        return Err(Error::protocol("WEAVE_GPU=off, yet the communicator has a GPU path"));
    }
    let stream = cudarc::driver::CudaContext::new(0).map_err(cuda("open device 0"))?.default_stream();
    // SAFETY: the call is refused before it reads any address.
    let refused = unsafe { comm.all_reduce_device_raw(0, 0, 1, DataType::F32, ReduceOp::Sum, &stream) };
    match refused {
        Err(e) if e.to_string().contains("WEAVE_GPU") => {}
        other => return Err(Error::protocol(format!("a device call with WEAVE_GPU=off gave {other:?}"))),
    }
    let mut sum = [0u32; 4];
    comm.all_reduce(&[1u32; 4], &mut sum, ReduceOp::Sum)?;
    if sum != [comm.world_size() as u32; 4] {
        return Err(Error::protocol(format!("host all-reduce gave {sum:?}")));
    }
    Ok(format!("gpu-off rank {}: no GPU path, device call refused, host calls run", comm.rank()))
}

fn bytes_of<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data without padding; the byte view covers exactly the
    // slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn from_bytes<T: Element>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    let mut out = vec![T::default(); n];
    // SAFETY: out holds n elements = b.len() bytes (rounded down); every bit pattern is a valid
    // Element value.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>()) };
    out
}

impl Gpu {
    fn upload<T: Element>(&self, v: &[T]) -> Result<CudaSlice<u8>> {
        // At least one byte: a zero-length allocation has no address to pass.
        let mut bytes = bytes_of(v).to_vec();
        if bytes.is_empty() {
            bytes.push(0);
        }
        self.stream.clone_htod(&bytes).map_err(cuda("upload"))
    }

    fn zeros(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(cuda("alloc"))
    }

    fn download<T: Element>(&self, d: &CudaSlice<u8>, len: usize) -> Result<Vec<T>> {
        let b = self.stream.clone_dtoh(d).map_err(cuda("download"))?;
        Ok(from_bytes::<T>(&b[..len * std::mem::size_of::<T>()]))
    }

    fn addr(&self, d: &CudaSlice<u8>) -> u64 {
        d.device_ptr(&self.stream).0
    }

    fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda("synchronize"))?;
        self.comm.check_gpu()
    }
}

/// Every device collective × dtype × op × size against the host reference, out of place and in
/// place; `big` adds one large f32 sum per collective.
fn run_typed<T: Element>(g: &Gpu, counts: &[usize], ops: &[ReduceOp]) -> Result<usize> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let d = T::DTYPE;
    let sz = std::mem::size_of::<T>();
    let mut checked = 0;
    for &count in counts {
        for &op in ops {
            let tag = |c: &str| format!("{c} {} {} count {count} on {n} GPUs (rank {me})", d.name(), op.name());
            let all = |i: usize| reference::<T>(op, (0..n).map(|r| input(d, op, r, i)));
            // all_reduce out of place, then in place.
            let send = g.upload(&fill::<T>(d, op, me, count))?;
            let recv = g.zeros(count * sz)?;
            // SAFETY: both buffers hold count elements and live until after the sync below.
            unsafe { g.comm.all_reduce_device_raw(g.addr(&send), g.addr(&recv), count, d, op, &g.stream)? };
            g.sync()?;
            compare(&tag("all_reduce"), &g.download::<T>(&recv, count)?, all)?;
            // SAFETY: in place on `send`, count elements.
            unsafe { g.comm.all_reduce_device_raw(g.addr(&send), g.addr(&send), count, d, op, &g.stream)? };
            g.sync()?;
            compare(&tag("all_reduce in place"), &g.download::<T>(&send, count)?, all)?;
            // reduce_scatter: n blocks of count.
            let send = g.upload(&fill::<T>(d, op, me, n * count))?;
            let recv = g.zeros(count * sz)?;
            // SAFETY: send holds n × count, recv count elements.
            unsafe { g.comm.reduce_scatter_device_raw(g.addr(&send), g.addr(&recv), count, d, op, &g.stream)? };
            g.sync()?;
            compare(&tag("reduce_scatter"), &g.download::<T>(&recv, count)?, |i| all(me * count + i))?;
            // In place: the result lands in block `me` of the send buffer.
            let own_block = g.addr(&send) + (me * count * sz) as u64;
            // SAFETY: send holds n × count elements; block `me` is inside it.
            unsafe { g.comm.reduce_scatter_device_raw(g.addr(&send), own_block, count, d, op, &g.stream)? };
            g.sync()?;
            let whole = g.download::<T>(&send, n * count)?;
            compare(&tag("reduce_scatter in place"), &whole[me * count..(me + 1) * count], |i| all(me * count + i))?;
            // reduce to a moving root, in place.
            let root = count % n;
            let buf = g.upload(&fill::<T>(d, op, me, count))?;
            // SAFETY: count elements, in place.
            unsafe { g.comm.reduce_device_raw(g.addr(&buf), g.addr(&buf), count, d, op, root, &g.stream)? };
            g.sync()?;
            if me == root {
                compare(&tag("reduce"), &g.download::<T>(&buf, count)?, all)?;
            }
            checked += 5;
        }
        // Data movement (operator-independent).
        let op = ops[0];
        let own = |r: usize, i: usize| T::from_f64(input(d, op, r, i)).to_f64();
        let tag = |c: &str| format!("{c} {} count {count} on {n} GPUs (rank {me})", d.name());
        let send = g.upload(&fill::<T>(d, op, me, count))?;
        let recv = g.zeros(n * count * sz)?;
        // SAFETY: send count, recv n × count elements.
        unsafe { g.comm.all_gather_device_raw(g.addr(&send), g.addr(&recv), count, d, &g.stream)? };
        g.sync()?;
        compare(&tag("all_gather"), &g.download::<T>(&recv, n * count)?, |j| own(j / count, j % count))?;
        // In place: this rank's contribution already sits in its block of the output.
        let mut staged = vec![T::default(); n * count];
        staged[me * count..(me + 1) * count].copy_from_slice(&fill::<T>(d, op, me, count));
        let buf = g.upload(&staged)?;
        let block = g.addr(&buf) + (me * count * sz) as u64;
        // SAFETY: buf holds n × count elements; the send block is block `me` of it.
        unsafe { g.comm.all_gather_device_raw(block, g.addr(&buf), count, d, &g.stream)? };
        g.sync()?;
        compare(&tag("all_gather in place"), &g.download::<T>(&buf, n * count)?, |j| own(j / count, j % count))?;
        let root = (count / 2) % n;
        let buf = if me == root { g.upload(&fill::<T>(d, op, me, count))? } else { g.zeros(count * sz)? };
        // SAFETY: count elements, in place.
        unsafe { g.comm.broadcast_device_raw(g.addr(&buf), g.addr(&buf), count, d, root, &g.stream)? };
        g.sync()?;
        compare(&tag("broadcast"), &g.download::<T>(&buf, count)?, |i| own(root, i))?;
        let send = g.upload(&fill::<T>(d, op, me, n * count))?;
        let recv = g.zeros(n * count * sz)?;
        // SAFETY: both hold n × count elements.
        unsafe { g.comm.all_to_all_device_raw(g.addr(&send), g.addr(&recv), count, d, &g.stream)? };
        g.sync()?;
        compare(&tag("all_to_all"), &g.download::<T>(&recv, n * count)?, |j| own(j / count, me * count + j % count))?;
        // SAFETY: send holds n × count elements, in place.
        unsafe { g.comm.all_to_all_device_raw(g.addr(&send), g.addr(&send), count, d, &g.stream)? };
        g.sync()?;
        compare(&tag("all_to_all in place"), &g.download::<T>(&send, n * count)?, |j| {
            own(j / count, me * count + j % count)
        })?;
        // all_to_allv with counts and displacements in device memory.
        let split = |p: usize, q: usize| -> usize {
            if (p + q + count).is_multiple_of(3) { 0 } else { count / (1 + (p + 2 * q) % 3) + 1 }
        };
        let send_counts: Vec<u64> = (0..n).map(|q| split(me, q) as u64).collect();
        let recv_counts: Vec<u64> = (0..n).map(|p| split(p, me) as u64).collect();
        let displs = |c: &[u64]| -> Vec<u64> {
            let mut at = 0;
            c.iter()
                .map(|x| {
                    let here = at;
                    at += x + 1;
                    here
                })
                .collect()
        };
        let (sd, rd) = (displs(&send_counts), displs(&recv_counts));
        let send_len = (sd[n - 1] + send_counts[n - 1] + 1) as usize;
        let recv_len = (rd[n - 1] + recv_counts[n - 1] + 1) as usize;
        let send = g.upload(&fill::<T>(d, op, me, send_len))?;
        let recv = g.zeros(recv_len * sz)?;
        let arrays: Vec<CudaSlice<u8>> =
            [&send_counts, &sd, &recv_counts, &rd].iter().map(|v| g.upload(v)).collect::<Result<_>>()?;
        let aux = [g.addr(&arrays[0]), g.addr(&arrays[1]), g.addr(&arrays[2]), g.addr(&arrays[3])];
        let longest = (0..n).flat_map(|p| (0..n).map(move |q| (p, q))).map(|(p, q)| split(p, q)).max().unwrap_or(0);
        // SAFETY: every block lies inside its buffer; the arrays hold n u64 each.
        unsafe { g.comm.all_to_allv_device_raw(g.addr(&send), g.addr(&recv), aux, d, longest * sz, &g.stream)? };
        g.sync()?;
        let got = g.download::<T>(&recv, recv_len)?;
        for p in 0..n {
            let their = displs(&(0..n).map(|q| split(p, q) as u64).collect::<Vec<_>>());
            let block = &got[rd[p] as usize..(rd[p] + recv_counts[p]) as usize];
            compare(&tag(&format!("all_to_allv from {p}")), block, |i| own(p, their[me] as usize + i))?;
        }
        checked += 8;
    }
    Ok(checked)
}

/// Every collective × {f32, f16, bf16, i32, f64, u8, e4m3, e5m2} × every op × {1, 7, 4095, 50 000,
/// 1 Mi + 3} elements, in place and out of place, plus every collective at 256 MiB per rank in
/// f32, bf16 and i32; then checks with nvidia-smi that every rank's process uses exactly one
/// GPU.
fn matrix() -> Result<String> {
    let g = gpu()?;
    let counts = [1usize, 7, 4095, 50_000, (1 << 20) + 3];
    let ops = ReduceOp::ALL;
    let started = Instant::now();
    let mut checked = 0;
    checked += run_typed::<f32>(&g, &counts, &ops)?;
    checked += run_typed::<f16>(&g, &counts, &ops)?;
    checked += run_typed::<bf16>(&g, &counts, &ops)?;
    checked += run_typed::<i32>(&g, &counts, &ops)?;
    checked += run_typed::<f64>(&g, &counts, &ops)?;
    checked += run_typed::<u8>(&g, &counts, &[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max])?;
    // FP8: reduced in a wide type and rounded once, so compared exactly with the rounded sum.
    checked += run_typed::<F8E4M3>(&g, &counts, &ops)?;
    checked += run_typed::<F8E5M2>(&g, &counts, &ops)?;
    // 256 MiB per rank: every collective in three dtypes.
    checked += run_typed::<f32>(&g, &[(256 << 20) / 4], &[ReduceOp::Sum])?;
    checked += run_typed::<bf16>(&g, &[(256 << 20) / 2], &[ReduceOp::Max])?;
    checked += run_typed::<i32>(&g, &[(256 << 20) / 4], &[ReduceOp::Min])?;
    let gpus = one_gpu_per_process(&g.comm)?;
    Ok(format!("{checked} device calls checked in {:.1?}; {gpus}", started.elapsed()))
}

/// The small and odd sizes of the matrix under whatever algorithms `WEAVE_ALGO` forces (the
/// GPU test runs it once per algorithm family): packet kernels at their largest, pipelined
/// kernels with a single element.
fn forced() -> Result<String> {
    let g = gpu()?;
    let started = Instant::now();
    let mut checked = run_typed::<f32>(&g, &[1, 7, 4095, 50_000], &[ReduceOp::Sum, ReduceOp::Avg])?;
    checked += run_typed::<u8>(&g, &[1, 7, 4095], &[ReduceOp::Max])?;
    checked += run_typed::<bf16>(&g, &[50_000], &[ReduceOp::Sum])?;
    // FP8 under every family: the same exactly rounded results whatever the algorithm.
    checked += run_typed::<F8E4M3>(&g, &[7, 50_000], &[ReduceOp::Sum, ReduceOp::Avg])?;
    checked += run_typed::<F8E5M2>(&g, &[4095], &[ReduceOp::Prod, ReduceOp::Max])?;
    // The largest packet messages (64 Ki words per peer by default): one element more falls back.
    checked += run_typed::<f64>(&g, &[(64 << 10) - 1, 64 << 10, (64 << 10) + 1], &[ReduceOp::Min])?;
    // The largest LL128 two-shot all-reduce on 2 to 4 GPUs (3.75 MiB), and one element more.
    checked += run_typed::<f32>(&g, &[983_040, 983_041], &[ReduceOp::Sum])?;
    checked += same_bits_on_every_rank(&g, &[1000, 50_000, 1 << 20])?;
    let algo = std::env::var("WEAVE_ALGO").unwrap_or_default();
    Ok(format!("{checked} device calls checked in {:.1?} with WEAVE_ALGO={algo:?}", started.elapsed()))
}

/// A world too large for the direct kernels (more than 8 ranks), or one across posed nodes: every
/// collective at small and odd sizes through the channel family, which the plan must pick by
/// itself, and on a grid of nodes the hierarchical steps of every collective that has them
/// (`hierarchy.rs`).
fn wide() -> Result<String> {
    let g = gpu()?;
    let started = Instant::now();
    // On a grid of several nodes of several ranks, a large all-reduce must run as node and
    // rail steps (hierarchy/device.rs); elsewhere as one flat call.
    let large = 200_000;
    let shape = collectives::select::CallShape {
        collective: collectives::Collective::AllReduce,
        memory: collectives::MemorySpace::Device,
        bytes: large,
        payload: large,
    };
    let plan = g.comm.plan(shape)?;
    let grid = g.comm.core().topology().node_grid();
    let steps = grid.is_some_and(|grid| grid.nodes > 1 && grid.ranks_per_node > 1);
    if (plan.executor == collectives::select::Executor::Hierarchical) != steps {
        return Err(Error::protocol(format!("a {large} B device all-reduce on {grid:?} plans {plan:?}")));
    }
    // 50,001: across a node grid, the all-reduce runs as steps with a tail of count % L.
    let mut checked = run_typed::<f32>(&g, &[1, 50_000, 50_001], &[ReduceOp::Sum, ReduceOp::Avg])?;
    checked += run_typed::<i32>(&g, &[4095], &[ReduceOp::Max])?;
    // The f32 all-reduce again, after the i32 calls (a halving reduce-scatter with its scratch
    // among them) and before the FP8 one, which runs the same f32 all-reduce between its
    // conversions: on 16 ranks sharing one GPU the FP8 one has hung in channel_halving
    // (docs/perf-log/gpu.md, session 26), and this call tells the order from the FP8 path.
    checked += run_typed::<f32>(&g, &[50_001], &[ReduceOp::Sum])?;
    checked += run_typed::<F8E4M3>(&g, &[50_001], &[ReduceOp::Sum])?;
    checked += queued_calls(&g, 24, 50_001)?;
    checked += same_bits_on_every_rank(&g, &[50_000])?;
    checked += hierarchy::hierarchical_calls(&g)?;
    ring_shift(&g, 300_001)?;
    // No rank leaves before every rank's device calls are done. A rank's calls complete at
    // different times on different ranks (a chain broadcast ends at its head first, a reduce's
    // senders before its root), and a rank that exits then is a lost peer to every rank whose
    // kernels still run: their GPU peer watch aborts them ("peer rank r was lost"), even where
    // they no longer need that rank. Without this barrier the hierarchical section's queued
    // calls (ending with a broadcast from the last rank) let the ranks near the head of the
    // chain finish the ring shift and exit while those near its end were still in their calls.
    g.comm.core().bootstrap().barrier()?;
    Ok(format!(
        "{} device calls checked on {} ranks in {:.1?}; a {large} B all-reduce runs {}",
        checked + 1,
        g.comm.world_size(),
        started.elapsed(),
        plan.algorithm
    ))
}

/// `calls` all-reduces (f32 sum, `count` elements) queued back to back on the stream, each
/// followed on the stream by a copy of its result, with one wait at the end: work queued behind
/// a collective while it runs, as a framework queues its next kernels. The channel family's
/// links must not need the caller's stream queue to drain (a proxy copy on a CUDA stream could
/// wait behind it: channel.cu). Every result is checked.
fn queued_calls(g: &Gpu, calls: usize, count: usize) -> Result<usize> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let value = |call: usize, r: usize, i: usize| ((i * 3 + call * 5 + r * 7) % 17) as f32;
    let mut buffers = Vec::with_capacity(calls);
    for call in 0..calls {
        let send = g.upload(&(0..count).map(|i| value(call, me, i)).collect::<Vec<f32>>())?;
        let recv = g.zeros(count * 4)?;
        let copy = g.zeros(count * 4)?;
        buffers.push((send, recv, copy));
    }
    for (send, recv, copy) in &buffers {
        // SAFETY: each buffer holds count f32 and lives until after the sync below.
        unsafe {
            g.comm.all_reduce_device_raw(g.addr(send), g.addr(recv), count, DataType::F32, ReduceOp::Sum, &g.stream)?;
            cudarc::driver::result::memcpy_dtod_async(g.addr(copy), g.addr(recv), count * 4, g.stream.cu_stream())
                .map_err(cuda("copy a result behind the collective"))?;
        }
    }
    g.sync()?;
    for (call, (_, _, copy)) in buffers.iter().enumerate() {
        let got = g.download::<f32>(copy, count)?;
        for (i, &v) in got.iter().enumerate() {
            let want: f32 = (0..n).map(|r| value(call, r, i)).sum();
            if v != want {
                return Err(Error::protocol(format!(
                    "queued all-reduce #{call} of {count} f32 on {n} GPUs: element {i} is {v}, not {want}"
                )));
            }
        }
    }
    Ok(calls)
}

/// f32 sum all-reduces of values whose sum rounds differently in different orders (mixed
/// magnitudes): every rank must get the same bits (on 3+ GPUs a rank that added in its own
/// order would not), and each result must be within rounding of the exact sum.
fn same_bits_on_every_rank(g: &Gpu, counts: &[usize]) -> Result<usize> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let value = |r: usize, i: usize| (1.0 + 0.1 * (r + 1) as f32) * 10f32.powi(((i * 7 + r * 3) % 13) as i32 - 6);
    for &count in counts {
        let send = g.upload(&(0..count).map(|i| value(me, i)).collect::<Vec<f32>>())?;
        let recv = g.zeros(count * 4)?;
        // SAFETY: both buffers hold count f32 and live until after the sync below.
        unsafe {
            g.comm.all_reduce_device_raw(
                g.addr(&send),
                g.addr(&recv),
                count,
                DataType::F32,
                ReduceOp::Sum,
                &g.stream,
            )?
        };
        g.sync()?;
        let got = g.download::<f32>(&recv, count)?;
        for (i, v) in got.iter().enumerate() {
            let exact: f64 = (0..n).map(|r| f64::from(value(r, i))).sum();
            if (f64::from(*v) - exact).abs() > exact.abs() * 1e-6 {
                return Err(Error::protocol(format!("same bits, count {count}: element {i} is {v}, expected {exact}")));
            }
        }
        let digests = g.comm.core().bootstrap().all_gather(bytes_of(&got))?;
        if let Some(r) = digests.iter().position(|d| d.as_slice() != bytes_of(&got)) {
            let first = from_bytes::<f32>(&digests[r]).iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
            return Err(Error::protocol(format!(
                "all_reduce of {count} f32 on {n} GPUs: rank {r}'s result differs from rank {me}'s (first at element {first:?})"
            )));
        }
    }
    Ok(counts.len())
}

/// With every rank alive, rank 0 asks nvidia-smi which GPUs each rank's process uses: each must
/// use exactly one, and no two ranks the same — unless the test shares one GPU between ranks
/// on purpose (`WEAVE_TEST_SHARE_GPU=1`, rank r on device r % count).
fn one_gpu_per_process(comm: &Communicator) -> Result<String> {
    let shared = std::env::var("WEAVE_TEST_SHARE_GPU").is_ok_and(|v| v == "1");
    let b = comm.core().bootstrap();
    let pids = b.all_gather(&std::process::id().to_le_bytes())?;
    let mut verdict = Ok("nvidia-smi check skipped (no nvidia-smi)".to_string());
    if comm.rank() == 0
        && let Ok(out) = std::process::Command::new("nvidia-smi")
            .args(["--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv,noheader"])
            .output()
    {
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut seen = Vec::new();
        for (r, pid) in pids.iter().enumerate() {
            let pid = u32::from_le_bytes(pid.as_slice().try_into().map_err(|_| Error::protocol("pid bytes"))?);
            let gpus: Vec<&str> =
                text.lines().filter(|l| l.split(',').next().map(str::trim) == Some(&pid.to_string())).collect();
            if gpus.len() != 1 {
                verdict = Err(Error::protocol(format!("rank {r} (pid {pid}) uses {} GPUs: {gpus:?}", gpus.len())));
                break;
            }
            let bus = gpus[0].split(',').nth(1).unwrap_or("").trim().to_string();
            if seen.contains(&bus) && !shared {
                verdict = Err(Error::protocol(format!("rank {r} shares GPU {bus} with another rank")));
                break;
            }
            seen.push(bus);
        }
        if verdict.is_ok() {
            verdict = Ok(format!(
                "nvidia-smi: each of {} processes on {} ({})",
                pids.len(),
                if shared { "the shared GPU" } else { "its own GPU" },
                text.trim().replace('\n', "; ")
            ));
        }
    }
    b.barrier()?;
    verdict
}

/// Captures an LL all-reduce, an RS+AG all-reduce and an all-gather into one CUDA graph, then
/// replays it with new inputs each time. The captured calls are the communicator's first, so
/// whatever their family builds at its first use (the channel family's links, table and
/// stream) is built inside the capture.
fn graph() -> Result<String> {
    let g = gpu()?;
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let small = 1000usize;
    let large = (8 << 20) + 5;
    let a = g.zeros(small * 4)?;
    let b = g.zeros(large * 4)?;
    let c = g.zeros(n * small * 4)?;
    let (pa, pb, pc) = (g.addr(&a), g.addr(&b), g.addr(&c));
    g.sync()?;
    g.stream
        .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(cuda("begin capture"))?;
    // SAFETY: the buffers live until the end of this function, after the last replay's sync.
    let captured = unsafe {
        g.comm
            .all_reduce_device_raw(pa, pa, small, DataType::F32, ReduceOp::Sum, &g.stream)
            .and_then(|_| g.comm.all_reduce_device_raw(pb, pb, large, DataType::F32, ReduceOp::Sum, &g.stream))
            .and_then(|_| g.comm.all_gather_device_raw(pa, pc, small, DataType::F32, &g.stream))
    };
    let graph = g.stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0)).map_err(cuda("end capture"))?;
    captured?;
    let graph = graph.ok_or_else(|| Error::protocol("capture produced no graph"))?;
    for replay in 0..10usize {
        let va: Vec<f32> = (0..small).map(|i| (me + replay + i % 7) as f32).collect();
        let vb: Vec<f32> = (0..large).map(|i| (me * 2 + replay + i % 5) as f32).collect();
        let da = g.upload(&va)?;
        let db = g.upload(&vb)?;
        // New inputs go into the captured buffers (outside the graph, on the same stream).
        let sa = g.addr(&da);
        let sb = g.addr(&db);
        // SAFETY: copies of exactly the buffer sizes between live device allocations.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(pa, sa, small * 4, g.stream.cu_stream())
                .map_err(cuda("copy a"))?;
            cudarc::driver::result::memcpy_dtod_async(pb, sb, large * 4, g.stream.cu_stream())
                .map_err(cuda("copy b"))?;
        }
        graph.launch().map_err(cuda("graph launch"))?;
        g.sync()?;
        let sum_a = |i: usize| (0..n).map(|r| (r + replay + i % 7) as f64).sum::<f64>();
        let sum_b = |i: usize| (0..n).map(|r| (r * 2 + replay + i % 5) as f64).sum::<f64>();
        compare(&format!("graph replay {replay}: small all_reduce"), &g.download::<f32>(&a, small)?, sum_a)?;
        compare(&format!("graph replay {replay}: large all_reduce"), &g.download::<f32>(&b, large)?, sum_b)?;
        compare(&format!("graph replay {replay}: all_gather"), &g.download::<f32>(&c, n * small)?, |j| {
            sum_a(j % small)
        })?;
    }
    Ok("10 graph replays of 3 captured collectives verified".into())
}

/// 1,000 calls in a row with changing sizes and collectives; every result checked.
fn stale_state() -> Result<String> {
    let g = gpu()?;
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let mut x: u64 = 0x2545_f491;
    for call in 0..1000usize {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let count =
            if call % 10 == 9 { ((x >> 33) % (3 << 20)) as usize + 1 } else { ((x >> 33) % 70_000) as usize + 1 };
        let v: Vec<i32> = (0..count).map(|i| ((me + i + call) % 97) as i32).collect();
        let d = g.upload(&v)?;
        if call % 2 == 0 {
            // SAFETY: count elements, in place.
            unsafe {
                g.comm.all_reduce_device_raw(g.addr(&d), g.addr(&d), count, DataType::I32, ReduceOp::Sum, &g.stream)?
            };
            g.sync()?;
            let got = g.download::<i32>(&d, count)?;
            if let Some(i) = (0..count).find(|&i| got[i] as usize != (0..n).map(|r| (r + i + call) % 97).sum::<usize>())
            {
                return Err(Error::protocol(format!("call {call}: all_reduce of {count} wrong at {i}")));
            }
        } else {
            let out = g.zeros(n * count * 4)?;
            // SAFETY: d holds count, out n × count elements.
            unsafe { g.comm.all_gather_device_raw(g.addr(&d), g.addr(&out), count, DataType::I32, &g.stream)? };
            g.sync()?;
            let got = g.download::<i32>(&out, n * count)?;
            if let Some(j) = (0..n * count).find(|&j| got[j] as usize != (j / count + j % count + call) % 97) {
                return Err(Error::protocol(format!("call {call}: all_gather of {count} wrong at {j}")));
            }
        }
    }
    Ok("1000 device calls with changing sizes verified".into())
}

/// The last rank dies (SIGKILL) after a first successful all-reduce; the others' next
/// all-reduce must end with an error within the timeout, and dropping the communicator must
/// release its mappings.
fn fault_kill() -> Result<String> {
    let g = gpu()?;
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let d = g.upload(&vec![1.0f32; 1 << 20])?;
    // SAFETY: 1 Mi elements, in place.
    unsafe { g.comm.all_reduce_device_raw(g.addr(&d), g.addr(&d), 1 << 20, DataType::F32, ReduceOp::Sum, &g.stream)? };
    g.sync()?;
    g.comm.core().bootstrap().barrier()?;
    if me == n - 1 {
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).map_err(|e| Error::errno("raise SIGKILL", e))?;
    }
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    // SAFETY: as above.
    let launched = unsafe {
        g.comm.all_reduce_device_raw(g.addr(&d), g.addr(&d), 1 << 20, DataType::F32, ReduceOp::Sum, &g.stream)
    };
    let outcome = launched.and_then(|_| g.sync());
    let waited = started.elapsed();
    match outcome {
        Ok(()) => Err(Error::protocol("an all-reduce with a dead peer succeeded")),
        // The peer watch aborts the kernels within milliseconds and names the dead rank.
        Err(e @ Error::PeerLost { peer, .. }) if peer == n - 1 && waited < Duration::from_secs(1) => {
            drop(d);
            drop(g);
            Ok(format!("failed after {waited:.2?} as it should: {e}; communicator dropped"))
        }
        Err(e) => {
            Err(Error::protocol(format!("after {waited:.2?}: {e}; expected PeerLost of rank {} within 1 s", n - 1)))
        }
    }
}

/// One send/receive call per rank that passes `count` i32 to the next rank and takes the previous
/// rank's (one kernel sends and receives, so the ring cannot deadlock); checks what arrived.
fn ring_shift(g: &Gpu, count: usize) -> Result<()> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mine: Vec<i32> = (0..count).map(|i| (me * 1_000_003 + i) as i32).collect();
    let send = g.upload(&mine)?;
    let recv = g.zeros(count * 4)?;
    // SAFETY: both buffers hold count elements and live past the sync.
    unsafe {
        g.comm.sendrecv_device_raw(
            Some((g.addr(&send), count, next)),
            Some((g.addr(&recv), count, prev)),
            DataType::I32,
            &g.stream,
        )?
    };
    g.sync()?;
    let got = g.download::<i32>(&recv, count)?;
    match (0..count).find(|&i| got[i] != (prev * 1_000_003 + i) as i32) {
        Some(i) => Err(Error::protocol(format!("ring shift of {count}: element {i} is {}", got[i]))),
        None => Ok(()),
    }
}

/// Device send/recv: ring shifts at many sizes (one kernel sends and receives, so no order can
/// deadlock), then rank 0 sends to every other rank with separate send and receive calls.
fn p2p() -> Result<String> {
    let g = gpu()?;
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let mut moved = 0;
    for count in [0usize, 1, 7, 4095, (1 << 20) + 3, 16 << 20] {
        ring_shift(&g, count)?;
        moved += count * 4;
    }
    // Separate calls: rank 0 sends a different message to each peer, in order.
    for round in 0..3usize {
        let count = 1000 + 333 * round;
        if me == 0 {
            for q in 1..n {
                let v: Vec<f32> = (0..count).map(|i| (q * 10 + round + i) as f32).collect();
                let d = g.upload(&v)?;
                // SAFETY: count elements.
                unsafe { g.comm.sendrecv_device_raw(Some((g.addr(&d), count, q)), None, DataType::F32, &g.stream)? };
                g.sync()?;
            }
        } else {
            let d = g.zeros(count * 4)?;
            // SAFETY: count elements.
            unsafe { g.comm.sendrecv_device_raw(None, Some((g.addr(&d), count, 0)), DataType::F32, &g.stream)? };
            g.sync()?;
            let got = g.download::<f32>(&d, count)?;
            if let Some(i) = (0..count).find(|&i| got[i] != (me * 10 + round + i) as f32) {
                return Err(Error::protocol(format!("send from rank 0, round {round}: element {i} wrong")));
            }
        }
    }
    Ok(format!("device send/recv verified ({moved} bytes in ring shifts, 3 rounds of rank 0 to all)"))
}

/// Nanoseconds since the Unix epoch: one clock for every process of the host.
fn wall_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// One trial of the GPU fault figure: every rank runs 64 MiB collectives `op` back to back;
/// the last rank prints `KILL_AT <ns>` and SIGKILLs itself after a pseudo-random 0–50 ms; the
/// others run until a call fails and print `DETECTED_AT <ns>` with the error (which must be
/// PeerLost naming the victim). The harness subtracts the two.
fn kill_trial(op: &str) -> Result<String> {
    let g = gpu()?;
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let bytes = 64usize << 20;
    let elems = bytes / 4;
    let a = g.zeros(bytes)?;
    let b = g.zeros(bytes)?;
    let (pa, pb) = (g.addr(&a), g.addr(&b));
    let run = || -> Result<()> {
        // SAFETY: both buffers hold 64 MiB and live past every sync below.
        unsafe {
            match op {
                "all_reduce" => g.comm.all_reduce_device_raw(pa, pb, elems, DataType::F32, ReduceOp::Sum, &g.stream),
                "all_gather" => g.comm.all_gather_device_raw(pa, pb, elems / n, DataType::F32, &g.stream),
                "reduce_scatter" => {
                    g.comm.reduce_scatter_device_raw(pa, pb, elems / n, DataType::F32, ReduceOp::Sum, &g.stream)
                }
                "broadcast" => g.comm.broadcast_device_raw(pa, pb, elems, DataType::F32, 0, &g.stream),
                "all_to_all" => g.comm.all_to_all_device_raw(pa, pb, elems / n, DataType::F32, &g.stream),
                other => Err(Error::invalid(format!("kill-trial: unknown collective {other:?}"))),
            }
        }?;
        g.sync()
    };
    run()?;
    g.comm.core().bootstrap().barrier()?;
    if me == n - 1 {
        let delay = Duration::from_micros(u64::from(std::process::id().wrapping_mul(2_654_435_761) % 50_000));
        let started = Instant::now();
        while started.elapsed() < delay {
            run()?;
        }
        // SAFETY: as in `run`; launched, not waited for, so the kill lands mid-collective.
        unsafe { g.comm.all_reduce_device_raw(pa, pb, elems, DataType::F32, ReduceOp::Sum, &g.stream)? };
        println!("KILL_AT {}", wall_ns());
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).map_err(|e| Error::errno("raise SIGKILL", e))?;
    }
    let started = Instant::now();
    loop {
        match run() {
            Ok(()) if started.elapsed() < Duration::from_secs(30) => continue,
            Ok(()) => return Err(Error::protocol("30 s of collectives went through with a killed peer")),
            Err(e @ Error::PeerLost { peer, .. }) if peer == n - 1 => {
                println!("DETECTED_AT {}", wall_ns());
                drop((a, b));
                drop(g);
                return Ok(format!("{op}: {e}"));
            }
            Err(e) => return Err(Error::protocol(format!("{op}: expected PeerLost of rank {}, got {e}", n - 1))),
        }
    }
}
