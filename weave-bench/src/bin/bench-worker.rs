//! One rank of `weave-bench` (`cargo xtask bench`): times one weave collective over a range of sizes, the way
//! nccl-tests does, and prints one JSON line per size on rank 0.
//!
//! ```text
//! bench-worker [--op OP] [-b MIN] [-e MAX] [-f FACTOR] [--dtype T] [--redop OP]
//!              [--iters N] [--warmup N] [--rounds K] [--turns SOCKET]
//!              [--turn-timeout SECS] [--check] [--inplace] [--threads N]
//! ```
//!
//! Launched as N ranks (`weave-bench`, or `cargo xtask launch -n N -- bench-worker …`).
//! With `--threads N` it is the whole job instead: one process whose N ranks are threads,
//! joined by the loopback bootstrap and transport (`comm_core::loopback`), for worlds larger
//! than the processes a host can hold (1,024 ranks on 2 cores); `WEAVE_TIMEOUT` and the other
//! `WEAVE_*` settings still apply, `--turns` does not.
//! The Open MPI baseline `weave-bench/src/mpi_bench.c` implements exactly the same method; keep the
//! two in step:
//!
//! - **Sizes**: from `-b` to `-e` (inclusive), multiplying by `-f`. "size" is the largest
//!   buffer of the call (all_gather: the receive buffer; reduce_scatter: the send buffer).
//!   all_gather, reduce_scatter and all_to_all use `count = (size / elt / n)` rounded down to
//!   a multiple of 16 bytes, per rank (per block), as nccl-tests does; the size printed is
//!   then `count × n × elt`.
//! - **Timing**: per size, `--rounds` batches (default 1); a batch is `--warmup` untimed calls,
//!   then `--iters` calls each timed on its own with a monotonic clock (no barrier between
//!   calls). After the last batch the per-call times of all batches are all-reduced with MAX
//!   through the communicator (outside the timed region), and the median of those maxima is
//!   reported.
//! - **Turns** (`--turns SOCKET`): the driver (`weave-bench`) listens on the Unix socket
//!   SOCKET and lets this job and the baseline's take turns, one batch at a time. Each rank
//!   connects once it is up and sends `weave RANK\n`; then, before every batch, it blocks (no
//!   spinning, so the other job has the CPUs) until it reads one byte `g`, and after the batch
//!   it writes one byte `d` (after the last batch of a size: once rank 0's line is printed).
//!   A closed socket, or no turn within `--turn-timeout` seconds (default 600), ends the rank
//!   with an error.
//! - **Check** (`--check`): before every call (untimed) the input is restored and the output
//!   poisoned; after it (untimed) every element of the result is compared with the exact
//!   expected value. Inputs are small integers, so every result is exact in every type; only
//!   a floating-point `avg` is compared with a relative tolerance. `wrong` is the number of
//!   wrong elements summed over ranks and over all calls (warm-up included).
//! - **Roots**: broadcast and reduce use root 0.
//! - **Thread ranks** (`--threads N`): every rank thread runs the same loop as a process rank
//!   would; `create_s` is then the time from before the loopback group was made until the
//!   slowest thread's communicator was built.
//!
//! Output: rank 0 prints, per size, one line
//! `{"op":…,"bytes":…,"count":…,"dtype":…,"redop":…,"inplace":…,"ranks":…,"time_us":…,"algbw":…,"busbw":…,"wrong":…,"algorithm":…,"shared_cpu":…,"create_s":…}`
//! (GB/s = 1e9 B/s; `wrong` is `null` without `--check`; `redop` is `none` for collectives
//! that do not reduce; `shared_cpu` is true when, at the end of the size, two ranks were on the
//! same CPU — their waits then went through the scheduler; `create_s` is the slowest rank's
//! time in `Communicator::from_env`, in seconds). Nothing else it prints to stdout starts with `{`. Errors go to stderr
//! with exit status 1; a bad command line exits 2.

use std::time::{Duration, Instant};

use clap::Parser;
use collectives::{Collective, Communicator, DataType, Element, ForEachElement, ReduceOp};
use comm_core::config::Config;
use comm_core::loopback::{LoopbackBootstrap, LoopbackTransport};
use comm_core::{Error, Result};
use weave_bench::record::{SizeResult, benched_collective, reduces, sweep_sizes};
use weave_bench::turns::RankTurns;
use weave_bench::worker_args::{at_least, size};
use weave_tests::matrix::tolerance;

/// The root of broadcast and reduce.
const ROOT: usize = 0;

/// What poisoned output elements hold before a checked call (outside every input's range).
const SENTINEL: f64 = -77.0;

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(name = "bench-worker", about = "One rank of weave-bench's host benchmark (see the source's header)")]
struct Options {
    /// all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all
    #[arg(long, default_value = "all_reduce", value_parser = benched_collective)]
    op: Collective,
    /// Smallest size (bytes, with an optional K/M/G suffix: powers of 1024)
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = size)]
    min_bytes: usize,
    /// Largest size
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = size)]
    max_bytes: usize,
    /// Size factor from one size to the next (at least 2)
    #[arg(short = 'f', long = "stepfactor", default_value = "2", value_parser = clap::value_parser!(u64).range(2..))]
    factor: u64,
    /// Element type (nccl-tests' or Rust's name)
    #[arg(long, default_value = "float", value_parser = |s: &str| DataType::parse(s).ok_or("unknown data type"))]
    dtype: DataType,
    /// Reduction operator
    #[arg(long, default_value = "sum", value_parser = |s: &str| ReduceOp::parse(s).ok_or("unknown reduction operator"))]
    redop: ReduceOp,
    /// Timed calls per batch
    #[arg(long, default_value = "20", value_parser = at_least(1))]
    iters: usize,
    /// Untimed calls per batch before them
    #[arg(long, default_value = "5", value_parser = at_least(0))]
    warmup: usize,
    /// Verify every call's result
    #[arg(long)]
    check: bool,
    /// In place
    #[arg(long)]
    inplace: bool,
    /// Batches per size
    #[arg(long, default_value = "1", value_parser = at_least(1))]
    rounds: usize,
    /// The driver's turn socket
    #[arg(long, value_name = "SOCKET", conflicts_with = "threads")]
    turns: Option<String>,
    /// How long to wait for a turn, in seconds
    #[arg(long = "turn-timeout", value_name = "SECS", default_value = "600", value_parser = turn_timeout)]
    turn_timeout: Duration,
    /// Run the whole job as this many thread ranks of this process
    #[arg(long, value_parser = at_least(1))]
    threads: Option<usize>,
}

/// Whole seconds, at least one.
fn turn_timeout(s: &str) -> std::result::Result<Duration, String> {
    match s.trim().parse::<u64>() {
        Ok(secs) if secs >= 1 => Ok(Duration::from_secs(secs)),
        _ => Err(format!("expected a whole number of seconds, at least 1, got {s:?}")),
    }
}

impl Options {
    /// Checks what the parser cannot: a size range that is not empty.
    fn settle(self) -> std::result::Result<Options, String> {
        if self.min_bytes == 0 {
            return Err("-b must be at least 1 byte".into());
        }
        if self.min_bytes > self.max_bytes {
            return Err(format!("-b ({}) is larger than -e ({})", self.min_bytes, self.max_bytes));
        }
        Ok(self)
    }

    /// The sizes of the sweep.
    fn sizes(&self) -> Vec<usize> {
        sweep_sizes(self.min_bytes as u64, self.max_bytes as u64, self.factor).into_iter().map(|s| s as usize).collect()
    }
}

fn main() {
    weave_tests::worker::install_subscriber();
    let opts = match Options::parse().settle() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bench-worker: {e}");
            std::process::exit(2);
        }
    };
    if let Err((rank, e)) = run(&opts) {
        eprintln!("bench-worker rank {rank}: {e}");
        std::process::exit(1);
    }
}

/// The median of `v` (mean of the middle two for an even length); 0 for an empty slice.
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Input element `i` of rank `rank`: a hash of both, reduced to a small integer so sums and
/// products are exact in every type (`[-4, 11]`, or `[0, 15]` for unsigned types; for `prod`
/// one of 1, 2, -1 (1 for unsigned), 1). Same formula as `mpi_bench.c`.
fn input_value(prod: bool, unsigned: bool, rank: usize, i: usize) -> f64 {
    let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add((rank as u32).wrapping_mul(40_503)) >> 28;
    if prod {
        match h & 3 {
            1 => 2.0,
            2 if !unsigned => -1.0,
            _ => 1.0,
        }
    } else if unsigned {
        h as f64
    } else {
        h as f64 - 4.0
    }
}

/// Everything one size needs: the element type's view of the options.
struct Case<'a> {
    comm: &'a Communicator,
    o: &'a Options,
    me: usize,
    n: usize,
    /// Elements per rank (per block for the block collectives), as nccl-tests prints it.
    count: usize,
}

impl Case<'_> {
    fn value(&self, rank: usize, i: usize) -> f64 {
        let unsigned = matches!(self.o.dtype, DataType::U8 | DataType::U32 | DataType::U64);
        let prod = self.reduces() && self.o.redop == ReduceOp::Prod;
        input_value(prod, unsigned, rank, i)
    }

    fn reduces(&self) -> bool {
        matches!(self.o.op, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce)
    }

    /// The reduction over every rank of input element `i`, in `T`'s arithmetic.
    fn reduced<T: Element>(&self, i: usize) -> T {
        let vals = (0..self.n).map(|r| self.value(r, i));
        let exact = match self.o.redop {
            ReduceOp::Sum | ReduceOp::Avg => vals.sum(),
            ReduceOp::Prod => vals.product(),
            ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        };
        if self.o.redop != ReduceOp::Avg {
            return T::from_f64(exact);
        }
        if T::DTYPE.is_float() {
            T::from_f64(exact / self.n as f64)
        } else {
            T::from_f64((T::from_f64(exact).to_f64() / self.n as f64).trunc())
        }
    }

    /// Lengths of the first buffer (send, or the in-place buffer) and the receive buffer.
    fn lengths(&self) -> (usize, usize) {
        let (c, nc, root) = (self.count, self.n * self.count, self.me == ROOT);
        match (self.o.op, self.o.inplace) {
            (Collective::AllReduce, false) => (c, c),
            (Collective::AllGather, false) => (c, nc),
            (Collective::ReduceScatter, false) => (nc, c),
            (Collective::Broadcast, false) => (if root { c } else { 0 }, c),
            (Collective::Reduce, false) => (c, if root { c } else { 0 }),
            (Collective::AllToAll | Collective::AllToAllv | Collective::SendRecv, false) => (nc, nc),
            (Collective::AllReduce | Collective::Broadcast | Collective::Reduce, true) => (c, 0),
            (_, true) => (nc, 0),
        }
    }

    /// The initial content of the first buffer.
    fn initial<T: Element>(&self, len: usize) -> Result<Vec<T>> {
        let sentinel = T::from_f64(SENTINEL);
        let mut v = alloc::<T>(len)?;
        let (me, c) = (self.me, self.count);
        v.extend((0..len).map(|i| match (self.o.op, self.o.inplace) {
            (Collective::AllGather, true) if i / c.max(1) != me => sentinel,
            (Collective::AllGather, true) => T::from_f64(self.value(me, i - me * c)),
            (Collective::Broadcast, _) if me != ROOT => sentinel,
            (Collective::Broadcast, _) => T::from_f64(self.value(ROOT, i)),
            _ => T::from_f64(self.value(me, i)),
        }));
        Ok(v)
    }

    /// Where the result lies (offset into the in-place buffer, or 0 for the receive buffer)
    /// and its expected content; `None` where this rank gets no result (reduce off the root).
    fn expected<T: Element>(&self) -> Result<Option<(usize, Vec<T>)>> {
        let (me, n, c) = (self.me, self.n, self.count);
        let len = match self.o.op {
            Collective::Reduce if me != ROOT => return Ok(None),
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::ReduceScatter => c,
            Collective::AllGather | Collective::AllToAll | Collective::AllToAllv | Collective::SendRecv => n * c,
        };
        let mut v = alloc::<T>(len)?;
        v.extend((0..len).map(|j| match self.o.op {
            Collective::AllReduce | Collective::Reduce => self.reduced(j),
            Collective::ReduceScatter => self.reduced(me * c + j),
            Collective::Broadcast => T::from_f64(self.value(ROOT, j)),
            Collective::AllGather => T::from_f64(self.value(j / c, j % c)),
            Collective::AllToAll | Collective::AllToAllv | Collective::SendRecv => {
                T::from_f64(self.value(j / c, me * c + j % c))
            }
        }));
        let offset = if self.o.inplace && self.o.op == Collective::ReduceScatter { me * c } else { 0 };
        Ok(Some((offset, v)))
    }

    /// One call of the collective.
    fn call<T: Element>(&self, a: &mut [T], b: &mut [T]) -> Result<()> {
        let (comm, op) = (self.comm, self.o.redop);
        match (self.o.op, self.o.inplace) {
            (Collective::AllReduce, false) => comm.all_reduce(a, b, op),
            (Collective::AllReduce, true) => comm.all_reduce_in_place(a, op),
            (Collective::AllGather, false) => comm.all_gather(a, b),
            (Collective::AllGather, true) => comm.all_gather_in_place(a),
            (Collective::ReduceScatter, false) => comm.reduce_scatter(a, b, op),
            (Collective::ReduceScatter, true) => comm.reduce_scatter_in_place(a, op),
            (Collective::Broadcast, false) => comm.broadcast(a, b, ROOT),
            (Collective::Broadcast, true) => comm.broadcast_in_place(a, ROOT),
            (Collective::Reduce, false) => comm.reduce(a, b, op, ROOT),
            (Collective::Reduce, true) => comm.reduce_in_place(a, op, ROOT),
            (Collective::AllToAll, false) => comm.all_to_all(a, b),
            (Collective::AllToAll, true) => comm.all_to_all_in_place(a),
            (c @ (Collective::AllToAllv | Collective::SendRecv), _) => {
                Err(Error::Unsupported(format!("the benchmark does not run {c}")))
            }
        }
    }

    /// Runs one size; returns the per-call times in microseconds (this rank's) and the number
    /// of wrong elements this rank saw.
    fn run<T: Element>(&self, turns: &mut RankTurns) -> Result<(Vec<f64>, u64)> {
        let (len_a, len_b) = self.lengths();
        let init = self.initial::<T>(len_a)?;
        let mut a = init.clone();
        let mut b = alloc::<T>(len_b)?;
        b.resize(len_b, T::from_f64(SENTINEL));
        let expected = if self.o.check { self.expected::<T>()? } else { None };
        let avg_float = self.o.redop == ReduceOp::Avg && self.reduces() && T::DTYPE.is_float();
        let tol = tolerance(T::DTYPE);
        let mut times = Vec::with_capacity(self.o.iters * self.o.rounds);
        let mut wrong = 0u64;
        for round in 0..self.o.rounds {
            if round > 0 {
                // The other job runs its batch of this size between two of ours.
                turns.done()?;
                turns.wait()?;
            }
            for it in 0..self.o.warmup + self.o.iters {
                if self.o.check {
                    if self.o.inplace {
                        a.copy_from_slice(&init);
                    } else {
                        b.fill(T::from_f64(SENTINEL));
                    }
                }
                let t0 = Instant::now();
                self.call(&mut a, &mut b)?;
                let us = t0.elapsed().as_secs_f64() * 1e6;
                if it >= self.o.warmup {
                    times.push(us);
                }
                if let Some((offset, want)) = &expected {
                    let got = if self.o.inplace { &a[*offset..*offset + want.len()] } else { &b[..want.len()] };
                    wrong += count_wrong(got, want, avg_float.then_some(tol));
                }
            }
        }
        Ok((times, wrong))
    }
}

/// The number of elements of `got` that differ from `want` (exactly, or beyond the relative
/// tolerance `tol`).
fn count_wrong<T: Element>(got: &[T], want: &[T], tol: Option<f64>) -> u64 {
    match tol {
        None => got.iter().zip(want).filter(|(g, w)| g != w).count() as u64,
        Some(tol) => got
            .iter()
            .zip(want)
            .filter(|(g, w)| {
                let (g, w) = (g.to_f64(), w.to_f64());
                (g - w).abs() > tol * w.abs().max(1.0)
            })
            .count() as u64,
    }
}

/// An empty vector with room for `len` elements, or an error naming the size.
fn alloc<T>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::invalid(format!("cannot allocate a buffer of {len} elements of {} bytes", std::mem::size_of::<T>()))
    })?;
    Ok(v)
}

/// One line of results.
struct Line {
    bytes: usize,
    count: usize,
    time_us: f64,
    wrong: Option<u64>,
    algorithm: String,
    shared_cpu: bool,
}

/// Runs the job (this process's rank, or every thread rank); on failure, the rank that failed
/// (as it should be named in the message) and its error.
fn run(o: &Options) -> std::result::Result<(), (String, Error)> {
    let start = Instant::now();
    match o.threads {
        Some(n) => run_threads(o, n, start),
        None => Communicator::from_env()
            .and_then(|comm| bench(&comm, o, start))
            .map_err(|e| (std::env::var("RANK").unwrap_or_else(|_| "?".into()), e)),
    }
}

/// The whole job as `n` thread ranks of this process over the loopback bootstrap and
/// transport; the lowest failing rank's error, if any, is the job's (a rank whose peer failed
/// fails within the timeout too).
fn run_threads(o: &Options, n: usize, start: Instant) -> std::result::Result<(), (String, Error)> {
    let config = Config::from_env().map_err(|e| ("(all threads)".to_string(), e))?;
    let group = LoopbackBootstrap::group(n, config.timeout);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(rank, b)| {
                let config = config.clone();
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .stack_size(RANK_STACK_BYTES)
                    .spawn_scoped(s, move || {
                        let comm =
                            Communicator::builder(b).with_transport(LoopbackTransport).with_config(config).build()?;
                        bench(&comm, o, start)
                    })
                    .map_err(|e| Error::invalid(format!("cannot start the thread of rank {rank} of {n}: {e}")))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(Error::protocol("its thread panicked"))),
                Err(e) => Err(e),
            })
            .collect()
    });
    match results.into_iter().enumerate().find_map(|(rank, r)| r.err().map(|e| (rank, e))) {
        Some((rank, e)) => Err((format!("{rank} of {n} (thread)"), e)),
        None => Ok(()),
    }
}

/// The stack of a rank thread: the bench's buffers live on the heap.
const RANK_STACK_BYTES: usize = 1 << 20;

/// Runs every size on `comm` (one rank's part of the job); `start` is when this job began
/// building its communicator(s).
fn bench(comm: &Communicator, o: &Options, start: Instant) -> Result<()> {
    let mut create_s = [0.0f64];
    comm.all_reduce(&[start.elapsed().as_secs_f64()], &mut create_s, ReduceOp::Max)?;
    let mut turns = RankTurns::connect(o.turns.as_deref(), o.turn_timeout, comm.rank())?;
    for size in o.sizes() {
        turns.wait()?;
        let line = o.dtype.run(SizeRun { comm, o, size, turns: &mut turns })?;
        if comm.rank() == 0 {
            // Rust's stdout is line-buffered: the line is out before the turn ends.
            println!("{}", result_line(o, comm.world_size(), &line, create_s[0]));
        }
        turns.done()?;
    }
    Ok(())
}

/// Elements per rank (per block) for `size` bytes, as nccl-tests computes it.
fn count_for(op: Collective, size: usize, elt: usize, n: usize) -> usize {
    let count = size / elt;
    match op {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => count,
        _ => (count / n) & !(16 / elt).saturating_sub(1),
    }
}

/// One size of the benchmark, for the element type of `--dtype` (see [`run_size`]).
struct SizeRun<'a> {
    comm: &'a Communicator,
    o: &'a Options,
    size: usize,
    turns: &'a mut RankTurns,
}

impl ForEachElement for SizeRun<'_> {
    type Output = Result<Line>;
    fn run<T: Element>(self) -> Result<Line> {
        run_size::<T>(self.comm, self.o, self.size, self.turns)
    }
}

fn run_size<T: Element>(comm: &Communicator, o: &Options, size: usize, turns: &mut RankTurns) -> Result<Line> {
    let (me, n) = (comm.rank(), comm.world_size());
    let elt = std::mem::size_of::<T>();
    let count = count_for(o.op, size, elt, n);
    let case = Case { comm, o, me, n, count };
    let (times, wrong) = case.run::<T>(turns)?;
    // Outside the timed region: the slowest rank's time of every call, and the total of wrong
    // elements.
    let mut max_times = vec![0.0f64; times.len()];
    comm.all_reduce(&times, &mut max_times, ReduceOp::Max)?;
    let wrong = if o.check {
        let mut total = [0u64];
        comm.all_reduce(&[wrong], &mut total, ReduceOp::Sum)?;
        Some(total[0])
    } else {
        None
    };
    let bytes = match o.op {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => count,
        _ => n * count,
    } * elt;
    let algorithm = comm.algorithm_for(o.op, bytes).map(|a| a.name().to_string()).unwrap_or_else(|e| format!("{e}"));
    // Where the ranks ran at the end: two on one CPU means their waits went through the
    // scheduler, which dominates small-size times.
    let mut cpus = vec![0u32; n];
    comm.all_gather(&[current_cpu().unwrap_or(u32::MAX)], &mut cpus)?;
    let shared_cpu = shares_a_cpu(&cpus);
    Ok(Line { bytes, count, time_us: median(&max_times), wrong, algorithm, shared_cpu })
}

/// The CPU this thread last ran on (field 39 of `/proc/thread-self/stat`), if readable.
fn current_cpu() -> Option<u32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces and parentheses) start at field 3.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(39 - 3)?.parse().ok()
}

/// Whether two ranks reported the same CPU (`u32::MAX`: unknown).
fn shares_a_cpu(cpus: &[u32]) -> bool {
    let mut known: Vec<u32> = cpus.iter().copied().filter(|&c| c != u32::MAX).collect();
    known.sort_unstable();
    known.windows(2).any(|w| w[0] == w[1])
}

/// The result line of one size.
fn result_line(o: &Options, n: usize, l: &Line, create_s: f64) -> String {
    let mut r = SizeResult::new(o.op, l.bytes as u64, l.count as u64, n as u64, l.time_us);
    r.dtype = o.dtype.name().into();
    r.redop = if reduces(o.op) { o.redop.name() } else { "none" }.into();
    r.inplace = o.inplace;
    r.wrong = l.wrong;
    r.algorithm = l.algorithm.clone();
    r.shared_cpu = l.shared_cpu;
    r.create_s = Some(create_s);
    r.to_line()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[&str]) -> std::result::Result<Options, String> {
        Options::try_parse_from(std::iter::once("bench-worker").chain(line.iter().copied()))
            .map_err(|e| e.to_string())?
            .settle()
    }

    #[test]
    fn sizes_and_arguments_parse() {
        // The size syntax itself is tested with `weave_launch::parse_size`.
        for bad in ["", "K", "-8", "1.5M", "8X", "99999999999999999999G"] {
            assert!(parse(&["-b", bad]).is_err(), "{bad}");
        }
        let o =
            parse(&["--op", "all_gather", "-b", "1K", "--maxbytes=4K", "-f", "4", "--dtype=bf16", "--check"]).unwrap();
        assert_eq!(
            (o.op, o.min_bytes, o.max_bytes, o.factor, o.dtype),
            (Collective::AllGather, 1024, 4096, 4, DataType::Bf16)
        );
        assert!(o.check && !o.inplace);
        assert_eq!(o.sizes(), [1024, 4096]);
        assert_eq!(parse(&[]).unwrap().sizes().len(), 24);
        assert!(parse(&["-f", "1"]).is_err());
        assert!(parse(&["--iters", "0"]).is_err());
        assert!(parse(&["-b", "8M", "-e", "1K"]).is_err());
        assert!(parse(&["--op", "all_to_allv"]).is_err());
        assert!(parse(&["--check=yes"]).is_err());
        assert_eq!(parse(&["--threads", "1024"]).unwrap().threads, Some(1024));
        assert!(parse(&["--threads", "0"]).is_err());
        assert!(parse(&["--threads", "4", "--turns", "/tmp/s"]).is_err());
        assert!(parse(&["--turn-timeout", "0"]).is_err());
    }

    #[test]
    fn result_lines_read_back() {
        let o = parse(&["--op", "broadcast"]).unwrap();
        let l =
            Line { bytes: 64, count: 16, time_us: 2.0, wrong: Some(0), algorithm: "direct".into(), shared_cpu: true };
        let r = SizeResult::parse(&result_line(&o, 4, &l, 0.125)).unwrap();
        assert_eq!((r.op, r.bytes, r.count, r.ranks, r.redop.as_str()), (Collective::Broadcast, 64, 16, 4, "none"));
        assert_eq!((r.dtype.as_str(), r.wrong, r.shared_cpu, r.create_s), ("float", Some(0), true, Some(0.125)));
    }

    #[test]
    fn sweep_counts_and_statistics() {
        assert_eq!(count_for(Collective::AllReduce, 8, 4, 2), 2);
        assert_eq!(count_for(Collective::AllGather, 8, 4, 2), 0);
        assert_eq!(count_for(Collective::AllGather, 1 << 20, 4, 2), 1 << 17);
        assert_eq!(count_for(Collective::AllToAll, 100, 1, 3), 32);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(shares_a_cpu(&[0, 1, 0]) && !shares_a_cpu(&[0, 1, u32::MAX, u32::MAX]));
        assert!(current_cpu().is_some());
    }

    #[test]
    fn inputs_are_small_integers() {
        for i in 0..1000 {
            let v = input_value(false, false, i % 5, i);
            assert!((-4.0..=11.0).contains(&v) && v.fract() == 0.0);
            assert!((0.0..=15.0).contains(&input_value(false, true, 3, i)));
            assert!([1.0, 2.0, -1.0].contains(&input_value(true, false, 1, i)));
        }
    }
}
