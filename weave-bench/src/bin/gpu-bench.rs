//! One rank of the GPU benchmark: weave's device collectives, and with `--nccl` (built with
//! the `nccl` feature) NCCL's, on the same ranks, buffers and timing method, in the same run.
//! Rank 0 prints the nccl-tests table with the ratio per size.
//!
//! Timing as nccl-tests, made robust against a busy host: per size, `--warmup` calls; then
//! `--repeat` batches, each: a barrier, one aligning call (the collective itself lines the GPUs
//! up, so the ranks' start skew stays out of the batch), then `--iters` calls back to back on
//! one stream between two CUDA events; a batch's time is the event time / iters. Time = the
//! median batch per rank, then the maximum over ranks. With `--graph` the iters calls are
//! captured into a CUDA graph once and each batch replays the graph instead. `--check`
//! verifies one call per size against the host reference (#wrong counts elements).
//! `--host-time` adds a comment line per size with rank 0's host time to enqueue one eager call
//! (median batch): when it is close to the GPU time, the launches, not the GPUs, set the pace.

use std::sync::Arc;

use clap::Parser;
use collectives::{Collective, Communicator, DataType, ReduceOp};
use comm_core::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use weave_bench::record::{benched_collective, bus_factor, sweep_sizes};
use weave_bench::worker_args::{at_least, size};

/// A parsed command line.
#[derive(Debug, Clone, Parser)]
#[command(name = "gpu-bench", about = "One rank of weave-bench's GPU benchmark (see the source's header)")]
struct Options {
    /// all_reduce, all_gather, reduce_scatter, broadcast, all_to_all
    #[arg(long, default_value = "all_reduce", value_parser = gpu_collective)]
    op: Collective,
    /// Smallest size (bytes, with an optional K/M/G suffix: powers of 1024)
    #[arg(short = 'b', default_value = "8", value_parser = size)]
    min: usize,
    /// Largest size
    #[arg(short = 'e', default_value = "64M", value_parser = size)]
    max: usize,
    /// Size factor from one size to the next (at least 2)
    #[arg(short = 'f', default_value = "2", value_parser = at_least(2))]
    factor: usize,
    /// Timed calls per batch
    #[arg(long, default_value = "20", value_parser = at_least(1))]
    iters: usize,
    /// Untimed calls per size before the batches
    #[arg(long, default_value = "5", value_parser = at_least(0))]
    warmup: usize,
    /// Batches per size
    #[arg(long, default_value = "5", value_parser = at_least(1))]
    repeat: usize,
    /// Verify one call per size (the default)
    #[arg(long, overrides_with = "no_check")]
    check: bool,
    /// Do not verify
    #[arg(long, overrides_with = "check")]
    no_check: bool,
    /// Time CUDA-graph replays instead of eager launches
    #[arg(short = 'G', long)]
    graph: bool,
    /// In place (all_reduce and broadcast)
    #[arg(long)]
    inplace: bool,
    /// NCCL beside weave (built with the `nccl` feature)
    #[arg(long)]
    nccl: bool,
    /// A comment line per size with rank 0's host time to enqueue one eager call
    #[arg(long)]
    host_time: bool,
}

/// The collectives the GPU benchmark runs.
fn gpu_collective(name: &str) -> std::result::Result<Collective, String> {
    benched_collective(name)?;
    Collective::parse(name)
        .filter(|&c| c != Collective::Reduce)
        .ok_or_else(|| format!("{name}: the GPU bench has no reduce"))
}

impl Options {
    /// Checks what the parser cannot: the sizes and the in-place forms.
    fn settle(self) -> std::result::Result<Options, String> {
        if self.min == 0 || self.min > self.max {
            return Err(format!("need 0 < -b <= -e, got -b {} -e {}", self.min, self.max));
        }
        if self.inplace && !matches!(self.op, Collective::AllReduce | Collective::Broadcast) {
            return Err("--inplace is supported for all_reduce and broadcast".into());
        }
        Ok(self)
    }
}

fn cuda(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Cuda { operation: what.to_string(), message: e.to_string() }
}

fn main() {
    // NVLink multicast (NVLS) must never run on these hosts: forced off before NCCL loads.
    // SAFETY: the first statement of main, before any other thread exists.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    weave_tests::worker::install_subscriber();
    let o = match Options::parse().settle() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        eprintln!("gpu-bench rank {}: {e}", std::env::var("RANK").unwrap_or_default());
        std::process::exit(1);
    }
}

/// One library's way to run the op on raw device buffers.
trait Library {
    fn name(&self) -> &'static str;
    /// # Safety
    /// `send`/`recv` valid device buffers of the sizes the op needs for `count`.
    unsafe fn call(&self, op: Collective, send: u64, recv: u64, count: usize, stream: &Arc<CudaStream>) -> Result<()>;
}

struct Weave<'a>(&'a Communicator);

impl Library for Weave<'_> {
    fn name(&self) -> &'static str {
        "weave"
    }
    unsafe fn call(&self, op: Collective, send: u64, recv: u64, count: usize, stream: &Arc<CudaStream>) -> Result<()> {
        let d = DataType::F32;
        // SAFETY: forwarded from the caller.
        unsafe {
            match op {
                Collective::AllReduce => self.0.all_reduce_device_raw(send, recv, count, d, ReduceOp::Sum, stream),
                Collective::AllGather => self.0.all_gather_device_raw(send, recv, count, d, stream),
                Collective::ReduceScatter => {
                    self.0.reduce_scatter_device_raw(send, recv, count, d, ReduceOp::Sum, stream)
                }
                Collective::Broadcast => self.0.broadcast_device_raw(send, recv, count, d, 0, stream),
                _ => self.0.all_to_all_device_raw(send, recv, count, d, stream),
            }
        }
    }
}

#[cfg(feature = "nccl")]
mod nccl {
    use super::*;
    use cudarc::nccl::sys;

    pub(crate) struct Nccl {
        comm: sys::ncclComm_t,
        n: usize,
    }

    fn check(what: &str, r: sys::ncclResult_t) -> Result<()> {
        if r == sys::ncclResult_t::ncclSuccess {
            Ok(())
        } else {
            Err(Error::Cuda { operation: format!("NCCL {what}"), message: format!("{r:?}") })
        }
    }

    impl Nccl {
        /// Collective: an NCCL communicator over the same ranks (unique id through weave's
        /// bootstrap); the calling thread's current CUDA context must be this rank's GPU.
        pub(crate) fn new(comm: &Communicator) -> Result<Self> {
            let b = comm.core().bootstrap();
            let mut id = sys::ncclUniqueId { internal: [0; 128] };
            if comm.rank() == 0 {
                // SAFETY: id is a valid out-pointer.
                check("get unique id", unsafe { sys::ncclGetUniqueId(&mut id) })?;
            }
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            let got = b.broadcast(0, &bytes)?;
            for (d, s) in id.internal.iter_mut().zip(&got) {
                *d = *s as _;
            }
            let mut nc: sys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: out-pointer valid; id identical on every rank.
            check("comm init", unsafe {
                sys::ncclCommInitRank(&mut nc, comm.world_size() as i32, id, comm.rank() as i32)
            })?;
            Ok(Nccl { comm: nc, n: comm.world_size() })
        }
    }

    impl Drop for Nccl {
        fn drop(&mut self) {
            // SAFETY: the communicator was created by ncclCommInitRank and is destroyed once.
            unsafe { sys::ncclCommDestroy(self.comm) };
        }
    }

    impl Library for Nccl {
        fn name(&self) -> &'static str {
            "nccl"
        }
        unsafe fn call(
            &self,
            op: Collective,
            send: u64,
            recv: u64,
            count: usize,
            stream: &Arc<CudaStream>,
        ) -> Result<()> {
            let s = stream.cu_stream() as sys::cudaStream_t;
            let f = sys::ncclDataType_t::ncclFloat32;
            let (sp, rp) = (send as *const std::ffi::c_void, recv as *mut std::ffi::c_void);
            // SAFETY: forwarded from the caller; the communicator is live.
            unsafe {
                match op {
                    Collective::AllReduce => check(
                        "all_reduce",
                        sys::ncclAllReduce(sp, rp, count, f, sys::ncclRedOp_t::ncclSum, self.comm, s),
                    ),
                    Collective::AllGather => check("all_gather", sys::ncclAllGather(sp, rp, count, f, self.comm, s)),
                    Collective::ReduceScatter => check(
                        "reduce_scatter",
                        sys::ncclReduceScatter(sp, rp, count, f, sys::ncclRedOp_t::ncclSum, self.comm, s),
                    ),
                    Collective::Broadcast => check("broadcast", sys::ncclBroadcast(sp, rp, count, f, 0, self.comm, s)),
                    _ => {
                        check("group start", sys::ncclGroupStart())?;
                        for p in 0..self.n {
                            let off = (p * count * 4) as u64;
                            check("send", sys::ncclSend((send + off) as *const _, count, f, p as i32, self.comm, s))?;
                            check("recv", sys::ncclRecv((recv + off) as *mut _, count, f, p as i32, self.comm, s))?;
                        }
                        check("group end", sys::ncclGroupEnd())
                    }
                }
            }
        }
    }
}

/// Elements per rank (nccl-tests' count) and buffer lengths (send, recv) for a size in bytes.
fn shape(op: Collective, size: usize, n: usize) -> (usize, usize, usize) {
    match op {
        Collective::AllGather => {
            let c = size / 4 / n;
            (c, c, c * n)
        }
        Collective::ReduceScatter => {
            let c = size / 4 / n;
            (c, c * n, c)
        }
        Collective::AllToAll => {
            let c = size / 4 / n;
            (c, c * n, c * n)
        }
        _ => {
            let c = size / 4;
            (c, c, c)
        }
    }
}

/// Input element i of rank r.
fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 13) % 11) as f32
}

/// The expected output element j.
fn expected(op: Collective, me: usize, n: usize, count: usize, j: usize) -> f32 {
    match op {
        Collective::AllReduce => (0..n).map(|r| value(r, j)).sum(),
        Collective::AllGather => value(j / count, j % count),
        Collective::ReduceScatter => (0..n).map(|r| value(r, me * count + j)).sum(),
        Collective::Broadcast => value(0, j),
        _ => value(j / count, me * count + j % count),
    }
}

struct Buffers {
    send: CudaSlice<f32>,
    recv: CudaSlice<f32>,
}

fn run(o: &Options) -> Result<()> {
    let comm = Communicator::from_env()?;
    if !comm.has_gpu() {
        return Err(Error::Unsupported("no GPU path (CUDA device and driver needed on every rank)".into()));
    }
    let ctx = comm.gpu_context().ok_or_else(|| Error::Unsupported("no GPU context".into()))?;
    ctx.bind_to_thread().map_err(cuda("bind"))?;
    let stream = ctx.new_stream().map_err(cuda("stream"))?;
    let (me, n) = (comm.rank(), comm.world_size());
    let weave = Weave(&comm);
    #[cfg(feature = "nccl")]
    let nccl = if o.nccl { Some(nccl::Nccl::new(&comm)?) } else { None };
    #[cfg(not(feature = "nccl"))]
    if o.nccl {
        return Err(Error::Unsupported("built without the `nccl` feature".into()));
    }
    #[cfg(feature = "nccl")]
    let libs: Vec<&dyn Library> = match &nccl {
        Some(nc) => vec![&weave, nc],
        None => vec![&weave],
    };
    #[cfg(not(feature = "nccl"))]
    let libs: Vec<&dyn Library> = vec![&weave];
    let sizes: Vec<usize> =
        sweep_sizes(o.min as u64, o.max as u64, o.factor as u64).into_iter().map(|s| s as usize).collect();
    if me == 0 {
        println!(
            "# gpu-bench: {} on {n} GPUs, float sum, median of {} batches of {} iters after {} warmup, {}{}",
            o.op,
            o.repeat,
            o.iters,
            o.warmup,
            if o.graph { "CUDA graph replay" } else { "eager launches" },
            if o.inplace { ", in place" } else { ", out of place" }
        );
        let base = format!(
            "{:>12} {:>12} {:>10} {:>9} {:>9} {:>7}",
            "size(B)", "count", "time(us)", "algbw", "busbw", "#wrong"
        );
        if libs.len() > 1 {
            println!("#{base} {:>10} {:>9} {:>7} {:>9}", "nccl(us)", "busbw", "#wrong", "nccl/weave");
        } else {
            println!("#{base}");
        }
    }
    let mut ratios = Vec::new();
    for size in sizes {
        let (count, send_len, recv_len) = shape(o.op, size, n);
        if count == 0 {
            continue;
        }
        let host: Vec<f32> = (0..send_len).map(|i| value(me, i)).collect();
        let send = stream.clone_htod(&host).map_err(cuda("upload"))?;
        let recv = stream.alloc_zeros::<f32>(recv_len.max(send_len)).map_err(cuda("alloc"))?;
        let mut bufs = Buffers { send, recv };
        let mut results = Vec::new();
        for lib in &libs {
            results.push(time_one(*lib, o, &comm, &stream, &mut bufs, &host, count)?);
        }
        let bytes = size as f64;
        let (t, wrong, _) = results[0];
        let algbw = bytes / t / 1e3;
        let line = format!(
            "{size:>12} {count:>12} {t:>10.2} {algbw:>9.2} {:>9.2} {wrong:>7}",
            algbw * bus_factor(o.op, n as u64)
        );
        if me == 0 {
            if o.host_time && !o.graph {
                let hosts: Vec<String> =
                    libs.iter().zip(&results).map(|(l, r)| format!("{} {:.2}", l.name(), r.2)).collect();
                println!("# host enqueue us/call at {size} B: {}", hosts.join(", "));
            }
            if let Some(&(tn, wn, _)) = results.get(1) {
                let nb = bytes / tn / 1e3 * bus_factor(o.op, n as u64);
                ratios.push(tn / t);
                println!(" {line} {tn:>10.2} {nb:>9.2} {wn:>7} {:>9.2}", tn / t);
            } else {
                println!(" {line}");
            }
        }
        if wrong > 0 || results.get(1).is_some_and(|r| r.1 > 0) {
            return Err(Error::protocol(format!("{size} B: wrong results")));
        }
    }
    if me == 0 && !ratios.is_empty() {
        let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        let worst = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
        println!(
            "# time ratio nccl/weave (above 1: weave faster): geomean {geo:.2}, worst {worst:.2} over {} sizes",
            ratios.len()
        );
    }
    comm.core().bootstrap().barrier()?;
    Ok(())
}

/// Times one library at one size; returns (µs per call, max over ranks; wrong elements; this
/// rank's host µs to enqueue one eager call, median batch).
fn time_one(
    lib: &dyn Library,
    o: &Options,
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    bufs: &mut Buffers,
    host: &[f32],
    count: usize,
) -> Result<(f64, u64, f64)> {
    let (me, n) = (comm.rank(), comm.world_size());
    let s = bufs.send.device_ptr(stream).0;
    let r = if o.inplace { s } else { bufs.recv.device_ptr(stream).0 };
    // In place the input changes every call: time on it anyway (as nccl-tests), check on a reset.
    for _ in 0..o.warmup {
        // SAFETY: buffers sized by `shape` for this op and count.
        unsafe { lib.call(o.op, s, r, count, stream)? };
    }
    stream.synchronize().map_err(cuda("sync"))?;
    comm.check_gpu()?;
    let graph = if o.graph {
        stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(cuda("capture"))?;
        let mut captured = Ok(());
        for _ in 0..o.iters {
            // SAFETY: as above.
            captured = captured.and_then(|_| unsafe { lib.call(o.op, s, r, count, stream) });
        }
        let g = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0)).map_err(cuda("end capture"))?;
        captured?;
        let g = g.ok_or_else(|| Error::protocol("empty graph"))?;
        g.launch().map_err(cuda("graph warmup"))?;
        stream.synchronize().map_err(cuda("sync"))?;
        Some(g)
    } else {
        None
    };
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut batches = Vec::with_capacity(o.repeat);
    let mut enqueue = Vec::with_capacity(o.repeat);
    for _ in 0..o.repeat {
        comm.core().bootstrap().barrier()?;
        // SAFETY: as above. The aligning call: every rank's GPU leaves it at about the same time.
        unsafe { lib.call(o.op, s, r, count, stream)? };
        let start = stream.record_event(timing).map_err(cuda("record start"))?;
        match &graph {
            Some(g) => g.launch().map_err(cuda("graph launch"))?,
            None => {
                let began = std::time::Instant::now();
                for _ in 0..o.iters {
                    // SAFETY: as above.
                    unsafe { lib.call(o.op, s, r, count, stream)? };
                }
                enqueue.push(began.elapsed().as_secs_f64() * 1e6 / o.iters as f64);
            }
        }
        let end = stream.record_event(timing).map_err(cuda("record end"))?;
        let ms = start.elapsed_ms(&end).map_err(cuda("event time"))?;
        batches.push(f64::from(ms) * 1e3 / o.iters as f64);
    }
    batches.sort_by(f64::total_cmp);
    enqueue.sort_by(f64::total_cmp);
    let host_us = enqueue.get(enqueue.len() / 2).copied().unwrap_or(f64::NAN);
    let mine = batches[batches.len() / 2];
    comm.check_gpu()?;
    let all = comm.core().bootstrap().all_gather(&mine.to_le_bytes())?;
    let t = all.iter().filter_map(|b| b.as_slice().try_into().ok().map(f64::from_le_bytes)).fold(0.0, f64::max);
    let mut wrong = 0;
    if !o.no_check {
        stream.memcpy_htod(host, &mut bufs.send).map_err(cuda("reset"))?;
        // SAFETY: as above.
        unsafe { lib.call(o.op, s, r, count, stream)? };
        stream.synchronize().map_err(cuda("sync"))?;
        comm.check_gpu()?;
        let out = stream.clone_dtoh(if o.inplace { &bufs.send } else { &bufs.recv }).map_err(cuda("download"))?;
        let len = match o.op {
            Collective::AllGather | Collective::AllToAll => count * n,
            _ => count,
        };
        wrong = (0..len).filter(|&j| out[j] != expected(o.op, me, n, count, j)).count() as u64;
        // Keep the input pristine for the next library.
        stream.memcpy_htod(host, &mut bufs.send).map_err(cuda("reset"))?;
        stream.synchronize().map_err(cuda("sync"))?;
    }
    let _ = lib.name();
    Ok((t, wrong, host_us))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[&str]) -> std::result::Result<Options, String> {
        Options::try_parse_from(std::iter::once("gpu-bench").chain(line.iter().copied()))
            .map_err(|e| e.to_string())?
            .settle()
    }

    #[test]
    fn the_driver_s_arguments_parse() {
        let line = ["--op", "all_gather", "-b", "8", "-e", "1M", "-f", "4", "--iters", "3", "--warmup", "1"];
        let o = parse(&[&line[..], &["--no-check", "--graph", "--nccl"]].concat()).unwrap();
        assert_eq!((o.op, o.min, o.max, o.factor, o.iters, o.warmup), (Collective::AllGather, 8, 1 << 20, 4, 3, 1));
        assert!(o.no_check && o.graph && o.nccl && !o.inplace);
        assert!(!parse(&["--check"]).unwrap().no_check);
        assert!(parse(&["--op", "reduce"]).unwrap_err().contains("no reduce"));
        assert!(parse(&["--op", "gather"]).is_err());
        assert!(parse(&["--op", "all_gather", "--inplace"]).unwrap_err().contains("in"));
        assert!(parse(&["-b", "1M", "-e", "1K"]).is_err());
        assert!(parse(&["-f", "1"]).is_err());
        assert_eq!(shape(Collective::ReduceScatter, 1024, 4), (64, 256, 64));
        assert_eq!(expected(Collective::Broadcast, 1, 2, 4, 3), value(0, 3));
    }
}
