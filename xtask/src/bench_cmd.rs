//! `cargo xtask bench`: the nccl-tests table for weave's host collectives, with Open MPI on the
//! same ranks in the same run (`--vs-mpi`).
//!
//! The ranks run `bench-worker` (tests/src/bin/bench-worker.rs) through
//! [`weave_launch`]; the baseline is `mpi_bench.c` (embedded here), built with `mpicc`
//! and run with `mpirun`. Both jobs run at the same time and take turns per size through
//! [`crate::bench_turns`] (a batch of weave, a batch of Open MPI, K times), so a noisy host
//! hurts both alike. Both print one JSON line per size; this command joins them into one
//! table.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weave_launch::{
    CancelToken, LaunchSpec, MAX_NAMESPACE_NODES, NodeFabric, OUTPUT_GRACE, Rate, forward_signals_to, launch,
    launch_on, parse_size,
};

use crate::plot::{Series, busbw_svg};

use crate::args::{Arg, Args, UsageError};
use crate::bench_nodes::BenchNodes;
use crate::bench_sweep;
use crate::bench_table::{DTYPES, Op, REDOPS, Row, Table, dtype_name};
use crate::bench_turns::{Job, Turns};

/// One line for the command list of `cargo xtask help`.
pub(crate) const SUMMARY: &str = "nccl-tests-style benchmark of the host collectives (--vs-mpi: Open MPI too)";

/// The help text of `cargo xtask bench`.
pub(crate) const USAGE: &str = "\
usage: cargo xtask bench [--op OP] [-n RANKS] [-b MIN] [-e MAX] [-f FACTOR] [--dtype T]
                         [--redop OP] [--iters N] [--warmup N] [--rounds K] [--check | --no-check]
                         [--inplace] [--json FILE] [--vs-mpi] [--mpi-args ARGS] [--no-build] [--[no-]bind]
                         [--timeout SECS] [-N NODES [--rate RATE]] [--ranks-sweep LIST]

Runs one weave collective on N ranks of this host (shared memory) over a range of sizes and
prints the nccl-tests table: size, count, type, redop, time, algbw, busbw, #wrong, plus the
algorithm weave picked. With --vs-mpi, Open MPI runs the same collective, sizes, data and
timing method on the same number of ranks in the same run, and the table adds its time and
busbw and the ratios; the two jobs take turns per size (see method). With no options it is
the main job: all_reduce, 2 ranks, float sum, 8 B .. 64 MiB ×2 (24 sizes), checked — about
5 s on 2 cores (30 s with --vs-mpi); on a host with two or more GPUs it runs on the GPUs
instead (see --gpu).

options:
  -o, --op OP          all_reduce (default), all_gather, reduce_scatter, broadcast, reduce,
                       all_to_all (broadcast and reduce use root 0)
  -n, --ranks N        number of ranks (default 2: the smallest multi-rank job, one rank
                       per core on a 2-core machine; ranks beyond the cores make both
                       libraries wait for the scheduler); with --nodes, ranks per node
      --ranks-sweep LIST  run at each world size of LIST (such as 2,8,32,64,128) on this
                       host, Open MPI too (--vs-mpi is implied), sizes 8 B only unless -b or
                       -e says otherwise; after the per-size tables, one table of every world
                       size: communicator creation time (the slowest rank's; MPI_Init's for
                       Open MPI), time per size, the algorithm weave picked, and the ratio
  -N, --nodes NODES    run on NODES simulated nodes of this host, -n ranks each (1 to 250;
                       see across nodes below; needs root)
      --rate RATE      with --nodes: shape each node's link to RATE in each direction, for
                       weave and Open MPI alike (tc units: 10gbit, 100mbit, 1gbps = 8gbit)
  -b, --minbytes SIZE  smallest size (default 8)
  -e, --maxbytes SIZE  largest size (default 64M); sizes are bytes with an optional K, M or G
                       suffix (powers of 1024): 8, 64K, 64M, 1G
  -f, --stepfactor F   multiply the size by F (at least 2) from one line to the next
                       (default 2); like nccl-tests, the sweep stops at the last size <= MAX
  -d, --dtype T        float (default), double, half, bfloat16, int8, uint8, int32, uint32,
                       int64, uint64 (or f32, f64, f16, bf16, i8, ...)
  -r, --redop OP       sum (default), prod, min, max, avg (reducing collectives only)
      --iters N        timed calls per batch (default 20, at least 1)
  -w, --warmup N       untimed calls per batch before them (default 5)
  -k, --rounds K       batches per size and library (default 5, at least 1)
  -c, --check          verify every call's result (the default)
      --no-check       do not verify (#wrong prints N/A)
      --inplace        in place (nccl-tests' conventions: all_gather's input is this rank's
                       block of the output; reduce_scatter's result lands in this rank's block
                       with weave, at the start of the buffer with MPI, as MPI defines it)
      --json FILE      also write one JSON object per size to FILE: op, bytes, count, dtype,
                       redop, inplace, ranks, time_us, algbw, busbw, wrong, algorithm,
                       shared_cpu, and with --vs-mpi mpi_time_us, mpi_algbw, mpi_busbw,
                       mpi_wrong, mpi_shared_cpu
      --vs-mpi         run the Open MPI baseline too (needs mpicc and mpirun on PATH, or set
                       MPICC / MPIRUN; Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev)
      --mpi-args ARGS  extra mpirun options, split at spaces, after the defaults: for Open MPI
                       --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1
                       --mca btl self,vader (self,sm from Open MPI 5); for another MPI none
      --no-build       do not build bench-worker first (use target/release/bench-worker)
      --gpu            benchmark device buffers on this host's GPUs (one rank per GPU unless
                       -n), float sum; builds and runs gpu-bench. The default when nvidia-smi
                       shows two or more GPUs
      --cpu            benchmark host memory even where GPUs are present
      --vs-nccl        with --gpu: NCCL on the same ranks, buffers and timing, same run, with
                       the ratio per size (NCCL_NVLS_ENABLE=0 is forced)
  -G, --graph          with --gpu: time CUDA-graph replays instead of eager launches
      --plot FILE.svg  also draw busbw against size for weave and the baseline
      --plot-from LOG  with --plot: run nothing, draw the --op table (out of place, eager) of a
                       saved gpu-bench output (rank prefixes like `[rank 0] ` are fine)
      --bind / --no-bind  pin each rank to its own CPU, weave and Open MPI alike (default:
                       bind when the ranks fit the CPUs, as mpirun does)
  -t, --timeout SECS   kill a run (weave or MPI) still going after SECS (default 600)
  -h, --help           print this help

method (identical in both programs): per size, K batches; a batch is WARMUP untimed calls,
then ITERS calls each timed alone with a monotonic clock (no barrier between calls). With
--vs-mpi both jobs start together and take turns, driven by this command through a Unix
socket: for each size, a batch of weave, then a batch of Open MPI, K times; the job whose
turn it is not waits in a blocking read (no spinning), so whatever else loads the host in a
given moment falls on both libraries' batches of that size alike. After its last batch of a
size, each job all-reduces the per-call times of its K batches with MAX across ranks outside
the timed region (weave through its own communicator, MPI through MPI_Allreduce), and the
median of those K x ITERS maxima is the time.
size = bytes of the largest buffer (all_gather: the receive buffer; reduce_scatter: the send
buffer); all_gather, reduce_scatter and all_to_all round the per-rank count down to 16 bytes,
as nccl-tests does, so tiny sizes can show 0 bytes. count = elements per rank (per block).
algbw = size / time, busbw = algbw × factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter,
all_to_all (n-1)/n; broadcast, reduce 1), GB/s = 1e9 bytes/s. With checking, the input is
restored (in place) or the output poisoned before every call, and every result element is
compared with its exact value after it (both untimed; inputs are small integers, so results
are exact; only a floating-point avg has a tolerance); #wrong sums wrong elements over ranks
and calls. A time marked * had two ranks on one CPU at the end of its size (another process
held the other cores, or more ranks than cores): it then measures the scheduler as much as the
library. Ratios are from one run on the same machine: time ratio mpi/weave and busbw ratio
weave/mpi, both above 1 when weave is faster. MPI's avg is MPI_SUM then a division (timed);
its half/bfloat16 reductions use user-defined operators; its out-of-place broadcast adds a
memcpy on the root.

across nodes (--nodes): the nodes are network namespaces, as `cargo xtask multinode` makes
them (own eth0 10.57.0.<node+1>/24 on a bridge, hostname, /dev/shm), made once for both
libraries. weave's ranks run on them as multinode runs them (shared memory in a node, TCP
across). Open MPI's mpirun runs in node 0 with a hostfile of the node addresses and starts its
daemon on every other node through `cargo xtask node-exec` as its ssh (--mca plm_rsh_agent),
with --mca btl self,vader,tcp (self,sm,tcp from Open MPI 5), btl_tcp_if_include and
oob_tcp_if_include eth0, --bind-to none (so no --bind: each node's daemon would bind as if it
had the host alone), and --mca mpi_yield_when_idle 1 when the ranks of all nodes outnumber
this host's CPUs (as mpirun does by itself on one host); --mpi-args come after these.
Consecutive ranks share a node in both jobs. With --gpu (and --vs-nccl), gpu-bench runs on the
nodes instead, one rank per node unless -n, rank r on GPU r % GPUs: weave as across any nodes
(CUDA IPC in a node, TCP staged through pinned host memory across), NCCL over its socket
transport (NCCL_SOCKET_IFNAME=eth0, NCCL_IB_DISABLE=1; shared memory and P2P in a node).
Without root the command fails: on posed nodes Open MPI would see one host and use shared
memory throughout, so it would not compare like with like (`cargo xtask multinode --posed`
runs weave alone that way). Whatever the outcome, the nodes and every process in them are gone
when the command ends.

exit status: 0 when every run finished with no wrong element; 1 when a run failed, MPI is
missing for --vs-mpi, or any #wrong (weave or MPI) is above 0; 2 on a usage error.
";

/// Default mpirun options for Open MPI: run as root in containers, allow more ranks than
/// cores, bound to cores exactly when the weave ranks are, and Open MPI's shared-memory
/// transport (`vader` up to 4.x, `sm` from 5.0).
fn mpirun_defaults(open_mpi_major: Option<u32>, bind: bool) -> Vec<&'static str> {
    match open_mpi_major {
        Some(major) => {
            let shm = if major >= 5 { "self,sm" } else { "self,vader" };
            vec![
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                if bind { "core" } else { "none" },
                "--mca",
                "pml",
                "ob1",
                "--mca",
                "btl",
                shm,
            ]
        }
        // Another MPI (MPICH, Intel MPI): only -np, plus what --mpi-args adds.
        None => Vec::new(),
    }
}

/// The major version of Open MPI behind `mpirun`, from `mpirun --version` (`mpirun (Open MPI)
/// 4.1.4`); `None` for another MPI or an unreadable answer.
fn open_mpi_major(version_text: &str) -> Option<u32> {
    let rest = &version_text[version_text.find("(Open MPI)")? + "(Open MPI)".len()..];
    rest.split_whitespace().next()?.split('.').next()?.parse().ok()
}

/// The baseline's source, written next to the build outputs and compiled with `mpicc`.
const MPI_BENCH_SOURCE: &str = include_str!("mpi_bench.c");

/// A parsed `bench` command line.
#[derive(Debug, Clone, PartialEq)]
struct BenchArgs {
    op: Op,
    ranks: usize,
    min_bytes: u64,
    max_bytes: u64,
    factor: u64,
    dtype: &'static str,
    redop: &'static str,
    iters: u64,
    warmup: u64,
    /// Batches per size and library, alternating between the libraries.
    rounds: u64,
    check: bool,
    inplace: bool,
    json: Option<PathBuf>,
    vs_mpi: bool,
    mpi_args: Vec<String>,
    build: bool,
    /// `Some(false)` from --no-bind, `Some(true)` from --bind, `None`: bind when the ranks fit
    /// the CPUs.
    bind: Option<bool>,
    /// Run on GPUs (device buffers) instead of host memory.
    gpu: bool,
    /// `--gpu` or `--cpu` was given; otherwise GPUs are used when the host has two or more.
    device_chosen: bool,
    /// With `gpu`: run NCCL on the same ranks and buffers and print the ratio.
    vs_nccl: bool,
    /// With `gpu`: time CUDA-graph replays instead of eager launches.
    graph: bool,
    /// Write a busbw-against-size SVG plot here.
    plot: Option<PathBuf>,
    /// `--nodes`: run on this many namespace nodes of `ranks` ranks each.
    nodes: Option<usize>,
    /// `--rate`: shape the nodes' links (with `nodes` only).
    rate: Option<Rate>,
    /// Draw the plot from this saved gpu-bench output instead of running.
    plot_from: Option<PathBuf>,
    timeout: Duration,
    /// `--ranks-sweep`: run at each of these world sizes (empty: once, at `ranks`).
    ranks_sweep: Vec<usize>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            op: Op::AllReduce,
            ranks: 2,
            min_bytes: 8,
            max_bytes: 64 << 20,
            factor: 2,
            dtype: "float",
            redop: "sum",
            iters: 20,
            warmup: 5,
            rounds: 5,
            check: true,
            inplace: false,
            json: None,
            vs_mpi: false,
            mpi_args: Vec::new(),
            build: true,
            bind: None,
            gpu: false,
            device_chosen: false,
            plot: None,
            plot_from: None,
            nodes: None,
            rate: None,
            vs_nccl: false,
            graph: false,
            timeout: Duration::from_secs(600),
            ranks_sweep: Vec::new(),
        }
    }
}

impl BenchArgs {
    /// Whether ranks are pinned one per CPU (weave through the launcher, Open MPI with
    /// `--bind-to core`): by default when they fit the CPUs this process may use.
    /// Never across nodes: each node's Open MPI daemon would bind as if it had the host alone.
    fn bind(&self) -> bool {
        self.nodes.is_none()
            && self.bind.unwrap_or_else(|| self.ranks <= std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Ranks of the job: `ranks`, times `nodes` across nodes.
    fn total_ranks(&self) -> usize {
        self.ranks * self.nodes.unwrap_or(1)
    }

    /// The arguments both bench programs take.
    fn program_args(&self) -> Vec<String> {
        let flags = [
            ("--op", self.op.name().to_string()),
            ("-b", self.min_bytes.to_string()),
            ("-e", self.max_bytes.to_string()),
            ("-f", self.factor.to_string()),
            ("--dtype", self.dtype.to_string()),
            ("--redop", self.redop.to_string()),
            ("--iters", self.iters.to_string()),
            ("--warmup", self.warmup.to_string()),
            ("--rounds", self.rounds.to_string()),
            ("--turn-timeout", self.timeout.as_secs().max(1).to_string()),
        ];
        let mut v: Vec<String> = flags.into_iter().flat_map(|(flag, value)| [flag.to_string(), value]).collect();
        if self.check {
            v.push("--check".into());
        }
        if self.inplace {
            v.push("--inplace".into());
        }
        v
    }

    /// The sizes of the sweep.
    fn sizes(&self) -> Vec<u64> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            v.push(s);
            match s.checked_mul(self.factor) {
                Some(next) => s = next,
                None => break,
            }
        }
        v
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Parsed {
    Help,
    Run(Box<BenchArgs>),
}

fn text_value(args: &mut Args, flag: &str) -> Result<String, UsageError> {
    args.value(flag)?.into_string().map_err(|v| UsageError(format!("{flag} must be UTF-8, got {v:?}")))
}

fn parse(args: &mut Args) -> Result<Parsed, UsageError> {
    let mut a = BenchArgs::default();
    let (mut sizes_given, mut ranks_given) = (false, false);
    while let Some(arg) = args.next()? {
        let f = match arg {
            Arg::Flag(f) => f,
            Arg::Positional(p) => return Err(UsageError(format!("unexpected argument {p:?} for `bench`"))),
            Arg::Separator => return Err(UsageError("`bench` takes no arguments after --".into())),
        };
        let count = |args: &mut Args, min: u64| -> Result<u64, UsageError> {
            let n: u64 = args.parse(&f, "a whole number")?;
            if n < min {
                return Err(UsageError(format!("{f} must be at least {min}, got {n}")));
            }
            Ok(n)
        };
        let size = |args: &mut Args| -> Result<u64, UsageError> {
            let v = text_value(args, &f)?;
            parse_size(&v)
                .ok_or_else(|| UsageError(format!("{f} expects a size in bytes such as 8, 64K, 64M or 1G, got {v:?}")))
        };
        match f.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "-o" | "--op" => {
                let v = text_value(args, &f)?;
                a.op = Op::parse(&v).ok_or_else(|| {
                    UsageError(format!(
                        "unknown collective {v:?}; expected one of {}",
                        Op::ALL.map(|o| o.name()).join(", ")
                    ))
                })?;
            }
            "-n" | "--ranks" => {
                ranks_given = true;
                a.ranks = usize::try_from(count(args, 1)?).map_err(|_| UsageError(format!("{f}: too many ranks")))?;
            }
            "-b" | "--minbytes" => {
                sizes_given = true;
                a.min_bytes = size(args)?;
            }
            "-e" | "--maxbytes" => {
                sizes_given = true;
                a.max_bytes = size(args)?;
            }
            "--ranks-sweep" => {
                a.ranks_sweep = bench_sweep::parse_ranks_list(&text_value(args, &f)?).map_err(UsageError)?
            }
            "-f" | "--stepfactor" => a.factor = count(args, 2)?,
            "-d" | "--dtype" => {
                let v = text_value(args, &f)?;
                a.dtype = dtype_name(&v).ok_or_else(|| {
                    UsageError(format!("unknown data type {v:?}; expected one of {}", DTYPES.map(|d| d.0).join(", ")))
                })?;
            }
            "-r" | "--redop" => {
                let v = text_value(args, &f)?.to_ascii_lowercase();
                a.redop = REDOPS.into_iter().find(|r| *r == v).ok_or_else(|| {
                    UsageError(format!("unknown reduction operator {v:?}; expected one of {}", REDOPS.join(", ")))
                })?;
            }
            "--iters" => a.iters = count(args, 1)?,
            "-w" | "--warmup" => a.warmup = count(args, 0)?,
            "-k" | "--rounds" => a.rounds = count(args, 1)?,
            "-c" | "--check" => a.check = true,
            "--no-check" => a.check = false,
            "--inplace" => a.inplace = true,
            "--json" => a.json = Some(PathBuf::from(args.value(&f)?)),
            "--vs-mpi" => a.vs_mpi = true,
            "--mpi-args" => a.mpi_args = text_value(args, &f)?.split_whitespace().map(String::from).collect(),
            "--no-build" => a.build = false,
            "--gpu" => {
                a.gpu = true;
                a.device_chosen = true;
            }
            "--cpu" => {
                a.gpu = false;
                a.device_chosen = true;
            }
            "--vs-nccl" => a.vs_nccl = true,
            "--plot" => a.plot = Some(PathBuf::from(args.value(&f)?)),
            "--plot-from" => a.plot_from = Some(PathBuf::from(args.value(&f)?)),
            "-G" | "--graph" => a.graph = true,
            "-N" | "--nodes" => {
                let n = count(args, 1)?;
                if n > MAX_NAMESPACE_NODES as u64 {
                    return Err(UsageError(format!("{f} must be at most {MAX_NAMESPACE_NODES}, got {n}")));
                }
                a.nodes = Some(n as usize);
            }
            "--rate" => {
                let v = text_value(args, &f)?;
                a.rate = Some(v.parse::<Rate>().map_err(|e| UsageError(format!("{f}: {e}")))?);
            }
            "--bind" => a.bind = Some(true),
            "--no-bind" => a.bind = Some(false),
            "-t" | "--timeout" => {
                let secs: f64 = args.parse(&f, "a number of seconds")?;
                a.timeout = Duration::try_from_secs_f64(secs)
                    .ok()
                    .filter(|t| !t.is_zero())
                    .ok_or_else(|| UsageError(format!("{f} must be a positive number of seconds, got {secs}")))?;
            }
            _ => return Err(UsageError(format!("unknown option {f} for `bench`"))),
        }
    }
    if !a.ranks_sweep.is_empty() {
        if ranks_given || a.nodes.is_some() || a.gpu || a.plot.is_some() || a.json.is_some() {
            return Err(UsageError(
                "--ranks-sweep runs host memory on this host at the sizes it lists; drop -n, --nodes, --gpu, --plot \
                 and --json"
                    .into(),
            ));
        }
        a.vs_mpi = true;
        // A CPU run even where GPUs are: the sweep compares with Open MPI on host memory.
        a.device_chosen = true;
        if !sizes_given {
            (a.min_bytes, a.max_bytes) = (8, 8);
        }
    }
    if a.plot_from.is_some() && a.plot.is_none() {
        return Err(UsageError("--plot-from needs --plot FILE.svg".into()));
    }
    if a.min_bytes == 0 {
        return Err(UsageError("-b must be at least 1 byte".into()));
    }
    if a.min_bytes > a.max_bytes {
        return Err(UsageError(format!("-b ({}) is larger than -e ({})", a.min_bytes, a.max_bytes)));
    }
    if a.rate.is_some() && a.nodes.is_none() {
        return Err(UsageError("--rate shapes the links between nodes; give --nodes too".into()));
    }
    if let Some(nodes) = a.nodes {
        if a.gpu && a.vs_mpi {
            return Err(UsageError(
                "--nodes --gpu compares with NCCL (--vs-nccl); Open MPI (--vs-mpi) is the host-memory baseline".into(),
            ));
        }
        if (a.vs_nccl || a.graph) && !a.gpu {
            return Err(UsageError("--vs-nccl and --graph benchmark device buffers; give --gpu too".into()));
        }
        if a.bind == Some(true) {
            return Err(UsageError(
                "--bind cannot be used with --nodes: each node's Open MPI daemon would bind its ranks as if it had \
                 the host alone"
                    .into(),
            ));
        }
        if nodes.checked_mul(a.ranks).is_none_or(|n| n > 1 << 20) {
            return Err(UsageError(format!("{nodes} nodes x {} ranks is too many ranks", a.ranks)));
        }
    }
    if a.iters > i32::MAX as u64 {
        return Err(UsageError(format!("--iters must be at most {}", i32::MAX)));
    }
    if a.iters.saturating_mul(a.rounds) > i32::MAX as u64 {
        return Err(UsageError(format!("--iters × --rounds must be at most {}", i32::MAX)));
    }
    Ok(Parsed::Run(Box::new(a)))
}

/// Runs `cargo xtask bench` with the arguments after the subcommand name.
pub(crate) fn run(mut args: Args) -> ExitCode {
    let parsed = match parse(&mut args) {
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(parsed)) => parsed,
        Err(e) => return crate::usage_error(&e, "bench"),
    };
    if let (Some(log), Some(svg)) = (&parsed.plot_from, &parsed.plot) {
        return match plot_saved(log, svg, parsed.op.name()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let token = CancelToken::new();
    // Before any thread starts (the launcher's readers inherit the blocked signals).
    if let Err(e) = forward_signals_to(&token) {
        eprintln!("warning: {e}; Ctrl-C will stop only this command, not the ranks");
    }
    match bench(&parsed, &token) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the SVG plot of `series` to `path`.
fn write_plot(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    std::fs::write(path, busbw_svg(title, series)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!("bench: wrote the plot to {}", path.display());
    Ok(())
}

/// `--plot-from`: the `op` table (out of place, eager launches) of a saved gpu-bench output.
fn plot_saved(log: &Path, svg: &Path, op: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("cannot read {}: {e}", log.display()))?;
    let (title, lines) = saved_table(&text, op)
        .ok_or_else(|| format!("{} holds no gpu-bench table for {op} (out of place, eager launches)", log.display()))?;
    write_plot(svg, &title, &gpu_series(&lines))
}

/// The title ("OP on N GPUs") and lines of the first out-of-place, eager `op` table in `text`.
fn saved_table(text: &str, op: &str) -> Option<(String, Vec<String>)> {
    let rank0 = text.lines().filter_map(|l| match l.strip_prefix("[rank ") {
        Some(rest) => rest.strip_prefix("0] "),
        None => Some(l),
    });
    let mut lines = Vec::new();
    let mut title = None;
    for l in rank0 {
        if let Some(header) = l.strip_prefix("# gpu-bench: ") {
            if title.is_some() {
                break;
            }
            let wanted =
                header.starts_with(&format!("{op} on ")) && header.contains("eager") && header.contains("out of place");
            if wanted {
                title = header.split(',').next().map(str::to_string);
            }
        } else if title.is_some() {
            lines.push(l.to_string());
        }
    }
    title.map(|t| (t, lines))
}

/// Parses gpu-bench's table lines (rank 0's stdout) into weave and NCCL series.
fn gpu_series(lines: &[String]) -> Vec<Series> {
    let mut weave = Series { name: "weave".into(), points: Vec::new() };
    let mut nccl = Series { name: "NCCL".into(), points: Vec::new() };
    for l in lines.iter().filter(|l| !l.trim_start().starts_with('#')) {
        let f: Vec<f64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if f.len() >= 6 {
            weave.points.push((f[0], f[4]));
        }
        if f.len() >= 10 {
            nccl.points.push((f[0], f[7]));
        }
    }
    if nccl.points.is_empty() { vec![weave] } else { vec![weave, nccl] }
}

/// GPUs visible to `nvidia-smi`, if it runs.
fn gpu_count() -> Option<usize> {
    let out = Command::new("nvidia-smi").arg("-L").output().ok()?;
    let n = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("GPU ")).count();
    (n > 0).then_some(n)
}

/// `--gpu`: builds `gpu-bench` (with NCCL for `--vs-nccl`), launches one rank per GPU (or
/// `-n`), and passes rank 0's table through.
fn bench_gpu(a: &BenchArgs, root: &Path, target: &Path, token: &CancelToken) -> Result<ExitCode, String> {
    if a.op == Op::Reduce || a.dtype != "float" || a.redop != "sum" {
        return Err(
            "--gpu benchmarks all_reduce, all_gather, reduce_scatter, broadcast and all_to_all on float sum".into()
        );
    }
    if a.build {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(root).args(["build", "--release", "-p", "weave-tests", "--bin", "gpu-bench"]);
        if a.vs_nccl {
            cmd.args(["--features", "nccl"]);
        }
        let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!("building gpu-bench failed ({status})"));
        }
    }
    let worker = target.join("release").join("gpu-bench");
    if !worker.is_file() {
        return Err(format!("{} does not exist; run without --no-build to build it", worker.display()));
    }
    let explicit = std::env::args().any(|x| x == "-n" || x == "--ranks");
    let ranks = match a.nodes {
        // One rank per node unless -n says how many per node.
        Some(nodes) => nodes * if explicit { a.ranks } else { 1 },
        None if explicit => a.ranks,
        None => gpu_count().ok_or("no GPU found by nvidia-smi; pass -n RANKS")?,
    };
    let mut args: Vec<String> = vec![
        "--op".into(),
        a.op.name().into(),
        "-b".into(),
        a.min_bytes.to_string(),
        "-e".into(),
        a.max_bytes.to_string(),
        "-f".into(),
        a.factor.to_string(),
        "--iters".into(),
        a.iters.to_string(),
        "--warmup".into(),
        a.warmup.to_string(),
        if a.check { "--check" } else { "--no-check" }.into(),
    ];
    if a.graph {
        args.push("--graph".into());
    }
    if a.inplace {
        args.push("--inplace".into());
    }
    if a.vs_nccl {
        args.push("--nccl".into());
    }
    let spec = LaunchSpec::new(ranks, &worker)
        .args(args)
        .env("NCCL_NVLS_ENABLE", "0")
        .echo(true)
        .capture(a.plot.is_some())
        .timeout(a.timeout)
        .cancel_token(token.clone());
    let report = match a.nodes {
        None => launch(&spec).map_err(|e| format!("cannot start the GPU bench ranks: {e}"))?,
        Some(n) => {
            let per_node = ranks / n;
            let nodes = BenchNodes::make(n, per_node, a.rate, &target.join("weave-bench"))?;
            println!(
                "# across {}; NCCL over its socket transport on eth0 (NCCL_SOCKET_IFNAME=eth0, \
                 NCCL_IB_DISABLE=1), shared memory and peer access in a node; rank r on GPU r % GPUs",
                nodes.describe()
            );
            // NCCL finds the nodes' interface and stays off InfiniBand; weave reads the same eth0.
            let spec = spec.env("NCCL_SOCKET_IFNAME", "eth0").env("NCCL_IB_DISABLE", "1");
            let report = launch_on(&spec, nodes.fabric()).map_err(|e| format!("cannot start the GPU bench ranks: {e}"));
            let left = nodes.finish();
            let report = report?;
            left?;
            report
        }
    };
    if !report.success() {
        return Err(format!("the GPU benchmark failed:\n{}", report.summary()));
    }
    if let Some(path) = &a.plot {
        let lines = report.ranks.first().map(|r| r.stdout.clone()).unwrap_or_default();
        write_plot(path, &format!("{} on {ranks} GPUs", a.op.name()), &gpu_series(&lines))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The workspace root (xtask lives one level below it).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the workspace root) or `target`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root.join(d),
        _ => root.join("target"),
    }
}

/// `name` looked up in `PATH` (or taken as is when it has a slash), if it is a file.
fn find_program(name: &OsString) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(p)).find(|c| c.is_file())
}

/// The MPI tools: `MPICC` / `MPIRUN` or `mpicc` / `mpirun` on `PATH`.
fn mpi_tools() -> Result<(PathBuf, PathBuf), String> {
    let tool = |var: &str, default: &str| {
        let name = std::env::var_os(var).filter(|v| !v.is_empty()).unwrap_or_else(|| default.into());
        find_program(&name).ok_or(name)
    };
    match (tool("MPICC", "mpicc"), tool("MPIRUN", "mpirun")) {
        (Ok(cc), Ok(run)) => Ok((cc, run)),
        (cc, run) => {
            let missing: Vec<String> =
                [cc.err(), run.err()].into_iter().flatten().map(|n| n.to_string_lossy().into_owned()).collect();
            Err(format!(
                "--vs-mpi needs Open MPI, but {} {} not found.\n\
                 Install it (Debian/Ubuntu: `apt-get install openmpi-bin libopenmpi-dev`; Fedora: \
                 `dnf install openmpi-devel` and load the mpi module), or point MPICC and MPIRUN at \
                 the tools, or leave out --vs-mpi.",
                missing.join(" and "),
                if missing.len() == 1 { "was" } else { "were" }
            ))
        }
    }
}

/// Writes the baseline's source under `dir` and compiles it when the source changed or the
/// binary is missing; returns the binary.
fn build_mpi_bench(mpicc: &Path, dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let src = dir.join("mpi_bench.c");
    let bin = dir.join("mpi_bench");
    let unchanged = std::fs::read_to_string(&src).is_ok_and(|s| s == MPI_BENCH_SOURCE);
    if !unchanged {
        std::fs::write(&src, MPI_BENCH_SOURCE).map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    }
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if unchanged && matches!((mtime(&src), mtime(&bin)), (Some(s), Some(b)) if b >= s) {
        return Ok(bin);
    }
    let tmp = dir.join("mpi_bench.tmp");
    eprintln!("bench: compiling {} with {}", src.display(), mpicc.display());
    let out = Command::new(mpicc)
        .arg("-O2")
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .arg("-lm")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", mpicc.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed to compile {} ({}):\n{}",
            mpicc.display(),
            src.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::rename(&tmp, &bin).map_err(|e| format!("cannot move {} to {}: {e}", tmp.display(), bin.display()))?;
    Ok(bin)
}

/// Builds the bench worker in release mode.
fn build_worker(root: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "weave-tests", "--bin", "bench-worker"])
        .status()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !status.success() {
        return Err(format!("building bench-worker failed ({status})"));
    }
    Ok(())
}

/// Parses the JSON lines among a program's stdout lines (the others are ignored).
fn parse_rows<'a>(who: &str, lines: impl IntoIterator<Item = &'a str>) -> Result<Vec<Row>, String> {
    lines
        .into_iter()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| Row::from_json(l).map_err(|e| format!("{who} printed an unreadable result line ({e}): {l}")))
        .collect()
}

/// Runs the Open MPI baseline (taking turns through `turns`), passing its result lines to
/// `live` as they come; returns its rows.
fn run_mpi(
    a: &BenchArgs,
    mpirun: &Path,
    bin: &Path,
    turns: &Path,
    live: Arc<Mutex<LiveTable>>,
    token: &CancelToken,
    nodes: Option<&BenchNodes>,
) -> Result<Vec<Row>, String> {
    let version = Command::new(mpirun)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
        .unwrap_or_default();
    let major = open_mpi_major(&version);
    if major.is_none() {
        eprintln!("bench: {} is not Open MPI; running it with -np and --mpi-args only", mpirun.display());
    }
    let mut cmd = match (nodes, major) {
        (Some(nodes), Some(major)) => {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            nodes.mpirun(mpirun, major, a.total_ranks() > cpus)?
        }
        (Some(_), None) => {
            return Err(format!(
                "bench --nodes places Open MPI on the nodes with its own options, and {} is not Open MPI",
                mpirun.display()
            ));
        }
        (None, _) => {
            let mut cmd = Command::new(mpirun);
            cmd.args(mpirun_defaults(major, a.bind()));
            cmd
        }
    };
    cmd.arg("-np").arg(a.total_ranks().to_string()).args(&a.mpi_args).arg(bin);
    cmd.args(a.program_args()).arg("--turns").arg(turns);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    eprintln!("bench: running the Open MPI baseline: {}", describe(&cmd));
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", mpirun.display()))?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("mpirun's output could not be read".into());
    };
    // Not joined but waited for at most OUTPUT_GRACE after mpirun ends: a daemon it started
    // on another node could hold the pipe open after it.
    let (done, all_lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(row) = Row::from_json(line.trim()) {
                live.lock().unwrap_or_else(|p| p.into_inner()).mpi_row(row);
            }
            lines.push(line);
        }
        let _ = done.send(lines);
    });
    let status = wait_bounded(&mut child, a.timeout, token, "the Open MPI baseline")?;
    let lines = all_lines.recv_timeout(OUTPUT_GRACE).map_err(|_| {
        format!("mpirun ended ({status}), but its output was still open {OUTPUT_GRACE:?} later or its reader failed")
    })?;
    if !status.success() {
        return Err(format!("the Open MPI baseline failed ({status})"));
    }
    let rows = parse_rows("mpi_bench", lines.iter().map(String::as_str))?;
    if rows.len() != a.sizes().len() {
        return Err(format!("mpi_bench reported {} sizes, expected {}", rows.len(), a.sizes().len()));
    }
    if let Some(nodes) = nodes {
        check_mpi_placement(&rows, nodes.count())?;
    }
    Ok(rows)
}

/// Checks that Open MPI ran its ranks on `nodes` distinct hosts, as it was asked to: ranks it
/// packed onto fewer nodes would talk through shared memory where weave's cross a network, and
/// its times would be no baseline for a run across nodes.
fn check_mpi_placement(rows: &[Row], nodes: usize) -> Result<(), String> {
    match rows.iter().find(|r| r.nodes != Some(nodes as u64)) {
        None => Ok(()),
        Some(r) => Err(format!(
            "Open MPI ran its ranks on {} host(s), not on the {nodes} nodes of this run: it placed \
             them against the hostfile's slots, so its times would not cross the network as weave's do \
             (look at mpirun's mapping options in xtask/src/bench_nodes.rs)",
            r.nodes.map_or("an unreported number of".to_string(), |n| n.to_string())
        )),
    }
}

/// Waits for `child` (`what`, in errors) to exit, killing it after `timeout` or once `token`
/// is cancelled.
fn wait_bounded(
    child: &mut std::process::Child,
    timeout: Duration,
    token: &CancelToken,
    what: &str,
) -> Result<std::process::ExitStatus, String> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for {what}: {e}")),
        }
        let stop = if start.elapsed() > timeout {
            Some(format!("{what} timed out after {timeout:.0?}"))
        } else {
            token.requested().map(|s| format!("{what} was cancelled with {}", s.as_str()))
        };
        if let Some(why) = stop {
            let _ = child.kill();
            let _ = child.wait();
            return Err(why);
        }
        // Short: the whole-job timing includes this wait's last period.
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Receives both jobs' result lines while they run and prints each size's table line as soon as
/// every library has reported it (rank 0's other lines of weave go to stderr).
struct LiveTable {
    table: Table,
    weave: Vec<Row>,
    mpi: Vec<Row>,
    shown: usize,
    partial: Vec<u8>,
}

impl LiveTable {
    fn new(table: Table) -> LiveTable {
        LiveTable { table, weave: Vec::new(), mpi: Vec::new(), shown: 0, partial: Vec::new() }
    }

    /// Prints the lines every library has reported and that are not printed yet.
    fn show(&mut self) {
        while let Some(row) = self.weave.get(self.shown) {
            let mpi = self.mpi.get(self.shown).filter(|m| m.bytes == row.bytes);
            if self.table.vs_mpi && mpi.is_none() {
                break;
            }
            println!("{}", self.table.line(row, mpi));
            self.shown += 1;
        }
    }

    /// One result of the Open MPI job.
    fn mpi_row(&mut self, row: Row) {
        self.mpi.push(row);
        self.show();
    }

    fn line(&mut self, line: &str) {
        let result = split_rank_prefix(line).filter(|(rank, text)| *rank == 0 && text.starts_with('{'));
        let Some((_, text)) = result else {
            eprintln!("{line}");
            return;
        };
        match Row::from_json(text) {
            Ok(row) => {
                self.weave.push(row);
                self.show();
            }
            // Reported again, as an error, after the run.
            Err(e) => eprintln!("bench: unreadable result line from rank 0 ({e}): {text}"),
        }
    }
}

impl Write for LiveTable {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.partial.extend_from_slice(buf);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            self.line(&String::from_utf8_lossy(&line[..end]));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Splits the launcher's `[rank R] ` prefix off an echoed line.
fn split_rank_prefix(line: &str) -> Option<(usize, &str)> {
    let rest = line.strip_prefix("[rank ")?;
    let (rank, text) = rest.split_once("] ")?;
    Some((rank.parse().ok()?, text))
}

/// Runs the weave ranks (taking turns through `turns`), printing table lines as results
/// arrive; returns the rows.
fn run_weave(
    a: &BenchArgs,
    worker: &Path,
    turns: &Path,
    live: Arc<Mutex<LiveTable>>,
    token: &CancelToken,
    nodes: Option<&NodeFabric>,
) -> Result<Vec<Row>, String> {
    let spec = LaunchSpec::new(a.total_ranks(), worker)
        .args(a.program_args())
        .arg("--turns")
        .arg(turns)
        .bind_cores(a.bind())
        .capture(true)
        .echo_to(live)
        .timeout(a.timeout)
        .cancel_token(token.clone());
    let report = match nodes {
        Some(fabric) => launch_on(&spec, fabric),
        None => launch(&spec),
    }
    .map_err(|e| format!("cannot start the bench ranks: {e}"))?;
    if !report.success() {
        return Err(format!("the weave benchmark failed:\n{}", report.summary()));
    }
    let stdout = report.ranks.first().map(|r| r.stdout.as_slice()).unwrap_or_default();
    let rows = parse_rows("bench-worker", stdout.iter().map(String::as_str))?;
    if rows.len() != a.sizes().len() {
        return Err(format!("bench-worker reported {} sizes, expected {}", rows.len(), a.sizes().len()));
    }
    Ok(rows)
}

fn bench(a: &BenchArgs, token: &CancelToken) -> Result<ExitCode, String> {
    let root = workspace_root();
    let target = target_dir(&root);
    if a.gpu || (!a.device_chosen && a.nodes.is_none() && gpu_count().is_some_and(|n| n >= 2)) {
        return bench_gpu(a, &root, &target, token);
    }
    // First, so that a host without namespaces fails before any build; on the main thread,
    // which the nodes' holder processes die with.
    if !a.ranks_sweep.is_empty() {
        return sweep(a, &root, &target, token);
    }
    let nodes = match a.nodes {
        Some(n) => Some(BenchNodes::make(n, a.ranks, a.rate, &target.join("weave-bench"))?),
        None => None,
    };
    let code = bench_on(a, &root, &target, token, nodes.as_ref()).map(|(code, _)| code);
    match (code, nodes.map(BenchNodes::finish).transpose()) {
        (Ok(code), Ok(_)) => Ok(code),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        (Err(e), Err(left)) => Err(format!("{e}\nerror: {left}")),
    }
}

/// `--ranks-sweep`: [`bench_on`] at each world size (building once), then the sweep's table.
fn sweep(a: &BenchArgs, root: &Path, target: &Path, token: &CancelToken) -> Result<ExitCode, String> {
    let mut runs = Vec::new();
    let mut code = ExitCode::SUCCESS;
    for (i, &ranks) in a.ranks_sweep.iter().enumerate() {
        let run = BenchArgs { ranks, build: a.build && i == 0, ranks_sweep: Vec::new(), ..a.clone() };
        let (c, rows) = bench_on(&run, root, target, token, None)?;
        if c != ExitCode::SUCCESS {
            code = c;
        }
        let walls = job_walls(&run, target, token)?;
        runs.push((ranks, rows, walls));
        println!();
    }
    println!(
        "# ranks sweep: {} on this host, weave and Open MPI in the same run per world size; create = the slowest \
         rank's communicator creation (Open MPI: MPI_Init), both jobs starting together; job = wall time of a \
         whole job (start the ranks, create, {} calls of {} B, exit), weave's then Open MPI's, each alone, with \
         its creation (init) in brackets",
        a.op.name(),
        bench_sweep::JOB_CALLS,
        a.min_bytes
    );
    println!("{}", bench_sweep::table(&runs));
    Ok(code)
}

/// The whole job at `a.ranks` ranks, weave's and then (with `--vs-mpi`) Open MPI's, each
/// alone: start the ranks, create the communicator, make [`bench_sweep::JOB_CALLS`] calls of
/// the smallest size without turns or checks, exit; each timed from start to the last exit.
fn job_walls(a: &BenchArgs, target: &Path, token: &CancelToken) -> Result<bench_sweep::JobWalls, String> {
    let job = BenchArgs {
        max_bytes: a.min_bytes,
        iters: bench_sweep::JOB_CALLS,
        warmup: 0,
        rounds: 1,
        check: false,
        ..a.clone()
    };
    let worker = target.join("release").join("bench-worker");
    let spec = LaunchSpec::new(job.total_ranks(), &worker)
        .args(job.program_args())
        .bind_cores(job.bind())
        .capture(true)
        .timeout(job.timeout)
        .cancel_token(token.clone());
    let start = Instant::now();
    let report = launch(&spec).map_err(|e| format!("cannot start the whole weave job: {e}"))?;
    let weave = start.elapsed().as_secs_f64();
    if !report.success() {
        return Err(format!("the whole weave job failed:\n{}", report.summary()));
    }
    let stdout = report.ranks.first().map(|r| r.stdout.as_slice()).unwrap_or_default();
    let weave_create = parse_rows("bench-worker", stdout.iter().map(String::as_str))?.first().and_then(|r| r.create_s);
    let mpi = match a.vs_mpi {
        false => None,
        true => {
            let (mpicc, mpirun) = mpi_tools()?;
            let bin = build_mpi_bench(&mpicc, &target.join("weave-bench"))?;
            let version = Command::new(&mpirun).arg("--version").output().map_or_else(
                |_| String::new(),
                |o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
            );
            let mut cmd = Command::new(&mpirun);
            cmd.args(mpirun_defaults(open_mpi_major(&version), job.bind()))
                .arg("-np")
                .arg(job.total_ranks().to_string())
                .args(&job.mpi_args)
                .arg(&bin)
                .args(job.program_args())
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            let start = Instant::now();
            let mut child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", mpirun.display()))?;
            // One result line: it fits the pipe, so the job never waits for this reader.
            let status = wait_bounded(&mut child, job.timeout, token, "the whole Open MPI job")?;
            let wall = start.elapsed().as_secs_f64();
            if !status.success() {
                return Err(format!("the whole Open MPI job failed ({status}): {}", describe(&cmd)));
            }
            let mut out = String::new();
            if let Some(mut pipe) = child.stdout.take() {
                std::io::Read::read_to_string(&mut pipe, &mut out)
                    .map_err(|e| format!("cannot read the whole Open MPI job's output: {e}"))?;
            }
            let init = parse_rows("mpi_bench", out.lines())?.first().and_then(|r| r.create_s);
            Some((wall, init))
        }
    };
    Ok(bench_sweep::JobWalls { weave, weave_create, mpi: mpi.map(|m| m.0), mpi_init: mpi.and_then(|m| m.1) })
}

/// [`bench()`] for host memory, on `nodes` when given; returns the exit status and the rows
/// (weave's, with Open MPI's beside them when it ran).
fn bench_on(
    a: &BenchArgs,
    root: &Path,
    target: &Path,
    token: &CancelToken,
    nodes: Option<&BenchNodes>,
) -> Result<(ExitCode, bench_sweep::Joined), String> {
    // Find MPI before spending time on a build.
    let mpi_tools = if a.vs_mpi { Some(mpi_tools()?) } else { None };
    if a.build {
        build_worker(root)?;
    }
    let worker = target.join("release").join("bench-worker");
    if !worker.is_file() {
        return Err(format!("{} does not exist; run without --no-build to build it", worker.display()));
    }
    let mpi_bin = match &mpi_tools {
        Some((mpicc, _)) => Some(build_mpi_bench(mpicc, &target.join("weave-bench"))?),
        None => None,
    };

    let table = Table { vs_mpi: a.vs_mpi };
    let placement = match nodes {
        Some(n) => n.describe(),
        None => format!("{} ranks (shared memory)", a.ranks),
    };
    println!(
        "# weave bench: {} on {placement}, {}{}, {}{}",
        a.op.name(),
        a.dtype,
        if a.op.reduces() { format!(" {}", a.redop) } else { String::new() },
        if a.inplace { "in place" } else { "out of place" },
        if matches!(a.op, Op::Broadcast | Op::Reduce) { ", root 0" } else { "" }
    );
    println!(
        "# {} batches of {} warm-up + {} timed calls per size{}; time = median over timed calls of the slowest rank; check: {}",
        a.rounds,
        a.warmup,
        a.iters,
        if a.vs_mpi { ", alternating weave and Open MPI batch by batch" } else { "" },
        if a.check { "every call" } else { "off" },
    );
    println!("#");
    println!("{}", table.header());
    let live = Arc::new(Mutex::new(LiveTable::new(table)));

    // Both jobs start now and wait for their turns.
    let weave_ended = Arc::new(AtomicBool::new(false));
    let mpi_ended = Arc::new(AtomicBool::new(false));
    let mut jobs = vec![Job::new("weave", a.total_ranks(), weave_ended.clone())];
    if mpi_bin.is_some() {
        jobs.push(Job::new("mpi", a.total_ranks(), mpi_ended.clone()));
    }
    let mut turns = Turns::listen(&target.join("weave-bench"), jobs, a.timeout, token.clone())?;
    let socket = turns.path().to_path_buf();
    let (rows, mpi_rows, driven) = std::thread::scope(|scope| {
        let weave = scope.spawn(|| {
            let r = run_weave(a, &worker, &socket, live.clone(), token, nodes.map(BenchNodes::fabric));
            weave_ended.store(true, Ordering::Release);
            r
        });
        let mpi = mpi_tools.as_ref().zip(mpi_bin.as_ref()).map(|((_, mpirun), bin)| {
            let (socket, live) = (&socket, live.clone());
            scope.spawn(move || {
                let r = run_mpi(a, mpirun, bin, socket, live, token, nodes);
                mpi_ended.store(true, Ordering::Release);
                r
            })
        });
        let njobs = if mpi.is_some() { 2 } else { 1 };
        let driven = (|| {
            turns.accept_all()?;
            for _ in a.sizes() {
                for _ in 0..a.rounds {
                    for j in 0..njobs {
                        turns.turn(j)?;
                    }
                }
            }
            Ok::<(), String>(())
        })();
        // On failure, closed sockets end the ranks still waiting for a turn.
        turns.close();
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<Vec<Row>, String>>| {
            h.join().unwrap_or_else(|_| Err("a bench thread panicked".into()))
        };
        (joined(weave), mpi.map(joined), driven)
    });
    // Every failure, the turn driver's first: it names the job that ended first, whose own
    // error is the cause and the other job's the consequence.
    let (rows, mpi_rows) = match (rows, mpi_rows.transpose(), driven) {
        (Ok(rows), Ok(mpi_rows), Ok(())) => (rows, mpi_rows.unwrap_or_default()),
        (rows, mpi_rows, driven) => {
            let errors = [driven.err(), mpi_rows.err(), rows.err()];
            return Err(errors.into_iter().flatten().collect::<Vec<_>>().join("\nerror: "));
        }
    };

    let joined: bench_sweep::Joined = rows
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let m = mpi_rows.get(i).filter(|m| m.bytes == r.bytes).cloned();
            (r, m)
        })
        .collect();
    println!("{}", table.footer(&joined));
    if let Some(path) = &a.plot {
        let weave =
            Series { name: "weave".into(), points: joined.iter().map(|(r, _)| (r.bytes as f64, r.busbw())).collect() };
        let mut series = vec![weave];
        if a.vs_mpi {
            let points = joined.iter().filter_map(|(_, m)| m.as_ref().map(|m| (m.bytes as f64, m.busbw()))).collect();
            series.push(Series { name: "Open MPI".into(), points });
        }
        let title = match a.nodes {
            Some(n) => format!("{} on {n} nodes x {} ranks (host memory)", a.op.name(), a.ranks),
            None => format!("{} on {} ranks (host memory)", a.op.name(), a.ranks),
        };
        write_plot(path, &title, &series)?;
    }
    if let Some(path) = &a.json {
        let mut text = String::new();
        for (r, m) in &joined {
            text.push_str(&r.to_json(m.as_ref()).to_string());
            text.push('\n');
        }
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("bench: wrote {} results to {}", joined.len(), path.display());
    }
    let weave_wrong: u64 = joined.iter().filter_map(|(r, _)| r.wrong).sum();
    let mpi_wrong: u64 = joined.iter().filter_map(|(_, m)| m.as_ref().and_then(|m| m.wrong)).sum();
    if weave_wrong > 0 || mpi_wrong > 0 {
        let mpi = if a.vs_mpi { format!(", {mpi_wrong} from Open MPI") } else { String::new() };
        eprintln!("bench: wrong results: {weave_wrong} elements from weave{mpi}");
        return Ok((ExitCode::FAILURE, joined));
    }
    Ok((ExitCode::SUCCESS, joined))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_mpi_packed_onto_fewer_nodes_is_an_error() {
        let row = |nodes: &str| {
            Row::from_json(&format!(
                r#"{{"op":"all_reduce","bytes":8,"count":2,"dtype":"float","redop":"sum","inplace":false,"ranks":2,"time_us":2,"algbw":0.004,"busbw":0.004,"wrong":0,"algorithm":"mpi"{nodes}}}"#
            ))
            .unwrap()
        };
        assert!(check_mpi_placement(&[row(r#","nodes":2"#), row(r#","nodes":2"#)], 2).is_ok());
        let packed = check_mpi_placement(&[row(r#","nodes":2"#), row(r#","nodes":1"#)], 2).unwrap_err();
        assert!(packed.contains("on 1 host(s), not on the 2 nodes"), "{packed}");
        assert!(check_mpi_placement(&[row("")], 2).unwrap_err().contains("unreported"));
    }

    #[test]
    fn a_saved_log_yields_the_eager_out_of_place_table_of_the_op() {
        let log = "\
[rank 0] # gpu-bench: all_reduce on 4 GPUs, float sum, median of 5 batches, eager launches, out of place
[rank 0]             8            2       5.26      0.00      0.00       0       8.40      0.00       0      1.60
[rank 1] noise from another rank
[rank 0] # gpu-bench: all_gather on 4 GPUs, float sum, median of 5 batches, eager launches, out of place
[rank 0]           16            1       6.60      0.00      0.00       0       6.91      0.00       0      1.05
[rank 0] # gpu-bench: all_reduce on 4 GPUs, float sum, median of 5 batches, CUDA graph replay, out of place
[rank 0]             8            2       4.14      0.00      0.00       0       7.86      0.00       0      1.90
";
        let (title, lines) = saved_table(log, "all_gather").unwrap();
        assert_eq!(title, "all_gather on 4 GPUs");
        assert_eq!(gpu_series(&lines)[0].points, vec![(16.0, 0.0)]);
        let (_, lines) = saved_table(log, "all_reduce").unwrap();
        assert_eq!(lines.len(), 1, "the table ends at the next header and other ranks are skipped: {lines:?}");
        assert!(saved_table(log, "broadcast").is_none());
    }

    #[test]
    fn gpu_table_lines_become_weave_and_nccl_series() {
        let lines: Vec<String> = [
            "# gpu-bench: all_reduce on 4 GPUs",
            "#     size(B)        count   time(us)     algbw     busbw  #wrong   nccl(us)     busbw  #wrong nccl/weave",
            "            8            2       5.88      0.00      0.00       0      12.19      0.00       0      2.07",
            "      1048576       262144      32.31     32.45     48.68       0      18.12     86.82       0      0.56",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = gpu_series(&lines);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].points, vec![(8.0, 0.0), (1048576.0, 48.68)]);
        assert_eq!(s[1].points[1], (1048576.0, 86.82));
        let weave_only = gpu_series(
            &lines[..1].iter().chain(std::iter::once(&"  8 2 5.88 0.0 0.0 0".to_string())).cloned().collect::<Vec<_>>(),
        );
        assert_eq!(weave_only.len(), 1);
    }

    fn parse_line(line: &[&str]) -> Result<Parsed, UsageError> {
        parse(&mut Args::new(line.iter().copied()))
    }

    #[test]
    fn defaults_and_options() {
        let Parsed::Run(d) = parse_line(&[]).unwrap() else { panic!() };
        assert_eq!(*d, BenchArgs::default());
        assert_eq!(d.sizes().len(), 24); // 8 B, 16 B, ..., 64 MiB
        assert_eq!((d.ranks, d.factor, d.check), (2, 2, true));
        let line = [
            "--op=all-gather",
            "-n",
            "3",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f2",
            "--dtype",
            "bf16",
            "--redop",
            "MAX",
            "--iters",
            "7",
            "-w",
            "0",
            "-k",
            "3",
            "--no-check",
            "--inplace",
            "--json",
            "out.json",
            "--vs-mpi",
            "--mpi-args",
            "--mca btl self,tcp",
            "--no-build",
            "-t",
            "30",
        ];
        let Parsed::Run(a) = parse_line(&line).unwrap() else { panic!() };
        assert_eq!(a.op, Op::AllGather);
        assert_eq!((a.ranks, a.min_bytes, a.max_bytes, a.factor), (3, 1024, 1 << 20, 2));
        assert_eq!((a.dtype, a.redop, a.iters, a.warmup, a.rounds), ("bfloat16", "max", 7, 0, 3));
        assert!(!a.check && a.inplace && a.vs_mpi && !a.build);
        assert_eq!(a.json, Some(PathBuf::from("out.json")));
        assert_eq!(a.mpi_args, ["--mca", "btl", "self,tcp"]);
        assert_eq!(a.timeout, Duration::from_secs(30));
        assert_eq!(a.sizes().len(), 11);
        let args = a.program_args();
        assert_eq!(args[..4], ["--op", "all_gather", "-b", "1024"]);
        assert!(args.contains(&"--inplace".to_string()) && !args.contains(&"--check".to_string()));
        assert_eq!(parse_line(&["--op", "reduce", "--help"]).unwrap(), Parsed::Help);
    }

    #[test]
    fn ranks_sweep() {
        let Parsed::Run(a) = parse_line(&["--ranks-sweep", "2,8,32"]).unwrap() else { panic!() };
        assert_eq!(a.ranks_sweep, [2, 8, 32]);
        assert!(a.vs_mpi && a.device_chosen);
        assert_eq!((a.min_bytes, a.max_bytes), (8, 8));
        let Parsed::Run(a) = parse_line(&["--ranks-sweep=4", "-e", "1K"]).unwrap() else { panic!() };
        assert_eq!((a.min_bytes, a.max_bytes), (8, 1024));
        let err = |line: &[&str]| parse_line(line).unwrap_err().0;
        assert!(err(&["--ranks-sweep", "2", "-n", "4"]).contains("drop -n"));
        assert!(err(&["--ranks-sweep", "2", "-N", "2"]).contains("--nodes"));
        assert!(err(&["--ranks-sweep", "0"]).contains("world sizes"));
    }

    #[test]
    fn nodes_and_rate() {
        let Parsed::Run(a) = parse_line(&["--nodes", "2", "-n", "3", "--rate=10gbit", "--vs-mpi"]).unwrap() else {
            panic!()
        };
        assert_eq!((a.nodes, a.ranks, a.total_ranks()), (Some(2), 3, 6));
        assert_eq!(a.rate.map(Rate::bytes_per_sec), Some(1_250_000_000));
        assert!(!a.bind(), "never bound across nodes");
        let Parsed::Run(a) = parse_line(&["-N1", "--no-bind"]).unwrap() else { panic!() };
        assert_eq!((a.nodes, a.total_ranks(), a.rate), (Some(1), 2, None));
        let Parsed::Run(d) = parse_line(&["-n", "3"]).unwrap() else { panic!() };
        assert_eq!((d.nodes, d.total_ranks()), (None, 3));
        let err = |line: &[&str]| parse_line(line).unwrap_err().0;
        assert!(err(&["--rate", "1gbit"]).contains("give --nodes too"));
        assert!(err(&["-N", "2", "--rate", "fast"]).contains("--rate"));
        assert!(err(&["-N", "0"]).contains("at least 1"));
        assert!(err(&["-N", "251"]).contains("at most 250"));
        assert!(err(&["-N", "2", "--bind"]).contains("--bind cannot be used with --nodes"));
        assert!(err(&["-N", "2", "--gpu", "--vs-mpi"]).contains("compares with NCCL"));
        assert!(err(&["-N", "2", "--vs-nccl"]).contains("give --gpu too"));
        let Parsed::Run(g) = parse_line(&["-N", "2", "-n", "1", "--gpu", "--vs-nccl", "--rate", "10gbit"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((g.nodes, g.total_ranks(), g.gpu, g.vs_nccl), (Some(2), 2, true, true));
        assert!(err(&["-N", "200", "-n", "10000"]).contains("too many ranks"));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        let err = |line: &[&str]| parse_line(line).unwrap_err().0;
        assert!(err(&["--op", "gather"]).contains("unknown collective"));
        assert!(err(&["-n", "0"]).contains("at least 1"));
        assert!(err(&["-n", "two"]).contains("whole number"));
        assert!(err(&["-b", "1.5M"]).contains("size in bytes"));
        assert!(err(&["-b", "0"]).contains("at least 1 byte"));
        assert!(err(&["-b", "1M", "-e", "1K"]).contains("larger than"));
        assert!(err(&["-f", "1"]).contains("at least 2"));
        assert!(err(&["--dtype", "complex"]).contains("unknown data type"));
        assert!(err(&["--redop", "xor"]).contains("unknown reduction"));
        assert!(err(&["--iters", "0"]).contains("at least 1"));
        assert!(err(&["--iters", "9999999999"]).contains("at most"));
        assert!(err(&["--rounds", "0"]).contains("at least 1"));
        assert!(err(&["--iters", "100000", "-k", "100000"]).contains("at most"));
        assert!(err(&["--timeout", "0"]).contains("positive"));
        assert!(err(&["--check=1"]).contains("takes no value"));
        assert!(err(&["--frobnicate"]).contains("unknown option --frobnicate"));
        assert!(err(&["extra"]).contains("unexpected argument"));
        assert!(err(&["-e"]).contains("needs a value"));
    }

    #[test]
    fn result_lines_and_rank_prefixes() {
        assert_eq!(split_rank_prefix("[rank 0] {\"a\":1}"), Some((0, "{\"a\":1}")));
        assert_eq!(split_rank_prefix("[rank 12] hello"), Some((12, "hello")));
        assert_eq!(split_rank_prefix("[rank x] hello"), None);
        assert_eq!(split_rank_prefix("plain"), None);
        let good = r#"{"op":"broadcast","bytes":8,"count":2,"dtype":"float","redop":"none","inplace":true,"ranks":2,"time_us":2,"algbw":0.004,"busbw":0.004,"wrong":0,"algorithm":"direct"}"#;
        let rows = parse_rows("w", ["# a comment", good, "   ", good]).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].op, Op::Broadcast);
        assert!(parse_rows("w", ["{broken"]).unwrap_err().contains("unreadable result line"));
        // The embedded baseline is the file next to this module.
        assert!(MPI_BENCH_SOURCE.contains("MPI_Reduce_scatter_block"));
    }

    #[test]
    fn mpirun_flags_follow_the_open_mpi_version() {
        assert_eq!(open_mpi_major("mpirun (Open MPI) 4.1.4\n\nReport bugs to ..."), Some(4));
        assert_eq!(open_mpi_major("mpirun (Open MPI) 5.0.3"), Some(5));
        assert_eq!(open_mpi_major("HYDRA build details:\n    Version: 4.1"), None);
        assert_eq!(open_mpi_major(""), None);
        assert!(mpirun_defaults(Some(4), false).contains(&"self,vader"));
        assert!(mpirun_defaults(Some(4), true).contains(&"core"));
        assert!(mpirun_defaults(Some(5), true).contains(&"self,sm"));
        assert!(mpirun_defaults(None, true).is_empty());
    }

    #[test]
    fn missing_programs_are_not_found() {
        assert_eq!(find_program(&OsString::from("/nonexistent/mpicc")), None);
        assert_eq!(find_program(&OsString::from("surely-not-a-program-weave")), None);
        assert!(find_program(&OsString::from("sh")).is_some());
    }
}
