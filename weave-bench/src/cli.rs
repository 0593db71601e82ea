//! The command line of `weave-bench` (and of `cargo xtask bench`, which passes its arguments
//! on): the benchmark's options, [`BenchArgs`], and the tool's other commands, [`Command`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use collectives::{Collective, DataType, ReduceOp};
use weave_launch::{MAX_NAMESPACE_NODES, Rate, parse_seconds, parse_size};

use crate::node_exec::NodeExecArgs;
use crate::record::{benched_collective, reduces, sweep_sizes};
use crate::scale_model::ScaleModelArgs;

/// What the top of `weave-bench --help` says.
const ABOUT: &str = "\
Runs one weave collective on N ranks of this host (shared memory) over a range of sizes and
prints the nccl-tests table: size, count, type, redop, time, algbw, busbw, #wrong, plus the
algorithm weave picked. With --vs-mpi, Open MPI runs the same collective, sizes, data and
timing method on the same number of ranks in the same run, and the table adds its time and
busbw and the ratios; the two jobs take turns per size (see method). With no options it is
the main job: all_reduce, 2 ranks, float sum, 8 B .. 64 MiB ×2 (24 sizes), checked — about
5 s on 2 cores (30 s with --vs-mpi); on a host with two or more GPUs it runs on the GPUs
instead (see --gpu).";

/// What the end of `weave-bench --help` says: the method, runs across nodes, exit status.
const METHOD: &str = "\
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
daemon on every other node through `weave-bench node-exec` as its ssh (--mca plm_rsh_agent),
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
missing for --vs-mpi, or any #wrong (weave or MPI) is above 0; 2 on a usage error.";

/// `weave-bench`: the benchmark (the options), or one of its other commands.
#[derive(Debug, Parser)]
#[command(
    name = "weave-bench",
    version,
    about = "nccl-tests-style benchmark of weave's collectives, with Open MPI or NCCL in the same run",
    long_about = ABOUT,
    after_long_help = METHOD,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// Another command instead of the benchmark.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The benchmark's options.
    #[command(flatten)]
    pub bench: BenchArgs,
}

/// The commands beside the benchmark.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The alpha-beta model of weave's plans, fitted to measured points (docs/SCALE.md).
    ScaleModel(ScaleModelArgs),
    /// Runs a command in a bench node: mpirun's ssh agent for --nodes (needs root).
    NodeExec(NodeExecArgs),
}

/// World sizes of `--ranks-sweep`, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldSizes(pub Vec<usize>);

/// The benchmark's options, as given; [`BenchArgs::settle`] checks them together.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct BenchArgs {
    /// all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all (broadcast and
    /// reduce use root 0)
    #[arg(short = 'o', long, value_name = "OP", default_value = "all_reduce", value_parser = benched_collective)]
    pub op: Collective,
    /// Number of ranks [default: 2: the smallest multi-rank job, one rank per core on a 2-core
    /// machine; ranks beyond the cores make both libraries wait for the scheduler]; with
    /// --nodes, ranks per node
    #[arg(short = 'n', long = "ranks", value_name = "N", value_parser = at_least(1))]
    pub ranks: Option<u64>,
    /// Run at each world size of LIST (such as 2,8,32,64,128) on this host, Open MPI too
    /// (--vs-mpi is implied), sizes 8 B only unless -b or -e says otherwise; after the per-size
    /// tables, one table of every world size: communicator creation time (the slowest rank's;
    /// MPI_Init's for Open MPI), time per size, the algorithm weave picked, and the ratio
    #[arg(long, value_name = "LIST", value_parser = parse_ranks_list)]
    pub ranks_sweep: Option<WorldSizes>,
    /// Run on NODES simulated nodes of this host, -n ranks each (1 to 250; see across nodes
    /// below; needs root)
    #[arg(short = 'N', long, value_name = "NODES", value_parser = nodes_count)]
    pub nodes: Option<u64>,
    /// With --nodes: shape each node's link to RATE in each direction, for weave and Open MPI
    /// alike (tc units: 10gbit, 100mbit, 1gbps = 8gbit)
    #[arg(long, value_name = "RATE", value_parser = |s: &str| s.parse::<Rate>().map_err(|e| e.to_string()))]
    pub rate: Option<Rate>,
    /// Smallest size [default: 8]
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", value_parser = size)]
    pub min_bytes: Option<u64>,
    /// Largest size [default: 64M]; sizes are bytes with an optional K, M or G suffix (powers
    /// of 1024): 8, 64K, 64M, 1G
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", value_parser = size)]
    pub max_bytes: Option<u64>,
    /// Multiply the size by F (at least 2) from one line to the next; like nccl-tests, the
    /// sweep stops at the last size <= MAX
    #[arg(short = 'f', long = "stepfactor", value_name = "F", default_value = "2", value_parser = at_least(2))]
    pub factor: u64,
    /// float, double, half, bfloat16, int8, uint8, int32, uint32, int64, uint64 (or f32, f64,
    /// f16, bf16, i8, ...)
    #[arg(short = 'd', long, value_name = "T", default_value = "float", value_parser = data_type)]
    pub dtype: DataType,
    /// sum, prod, min, max, avg (reducing collectives only)
    #[arg(short = 'r', long, value_name = "OP", default_value = "sum", value_parser = reduce_op)]
    pub redop: ReduceOp,
    /// Timed calls per batch (at least 1)
    #[arg(long, value_name = "N", default_value = "20", value_parser = at_least(1))]
    pub iters: u64,
    /// Untimed calls per batch before them
    #[arg(short = 'w', long, value_name = "N", default_value = "5", value_parser = at_least(0))]
    pub warmup: u64,
    /// Batches per size and library (at least 1)
    #[arg(short = 'k', long, value_name = "K", default_value = "5", value_parser = at_least(1))]
    pub rounds: u64,
    /// Verify every call's result (the default)
    #[arg(short = 'c', long, overrides_with = "no_check")]
    pub check: bool,
    /// Do not verify (#wrong prints N/A)
    #[arg(long, overrides_with = "check")]
    pub no_check: bool,
    /// In place (nccl-tests' conventions: all_gather's input is this rank's block of the
    /// output; reduce_scatter's result lands in this rank's block with weave, at the start of
    /// the buffer with MPI, as MPI defines it)
    #[arg(long)]
    pub inplace: bool,
    /// Also write one JSON object per size to FILE: op, bytes, count, dtype, redop, inplace,
    /// ranks, time_us, algbw, busbw, wrong, algorithm, shared_cpu, and with --vs-mpi
    /// mpi_time_us, mpi_algbw, mpi_busbw, mpi_wrong, mpi_shared_cpu
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Run the Open MPI baseline too (needs mpicc and mpirun on PATH, or set MPICC / MPIRUN;
    /// Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev)
    #[arg(long)]
    pub vs_mpi: bool,
    /// Extra mpirun options, split at spaces, after the defaults: for Open MPI
    /// --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader
    /// (self,sm from Open MPI 5); for another MPI none
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub mpi_args: Option<String>,
    /// Do not build the bench workers first (use target/release/bench-worker or gpu-bench)
    #[arg(long)]
    pub no_build: bool,
    /// Benchmark device buffers on this host's GPUs (one rank per GPU unless -n), float sum;
    /// builds and runs gpu-bench. The default when nvidia-smi shows two or more GPUs
    #[arg(long, overrides_with = "cpu")]
    pub gpu: bool,
    /// Benchmark host memory even where GPUs are present
    #[arg(long, overrides_with = "gpu")]
    pub cpu: bool,
    /// With --gpu: NCCL on the same ranks, buffers and timing, same run, with the ratio per
    /// size (NCCL_NVLS_ENABLE=0 is forced)
    #[arg(long)]
    pub vs_nccl: bool,
    /// With --gpu: time CUDA-graph replays instead of eager launches
    #[arg(short = 'G', long)]
    pub graph: bool,
    /// Also draw busbw against size for weave and the baseline
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// With --plot: run nothing, draw the --op table (out of place, eager) of a saved gpu-bench
    /// output (rank prefixes like `[rank 0] ` are fine)
    #[arg(long, value_name = "LOG")]
    pub plot_from: Option<PathBuf>,
    /// Pin each rank to its own CPU, weave and Open MPI alike (default: bind when the ranks fit
    /// the CPUs, as mpirun does)
    #[arg(long, overrides_with = "no_bind")]
    pub bind: bool,
    /// Never pin the ranks
    #[arg(long, overrides_with = "bind")]
    pub no_bind: bool,
    /// Kill a run (weave or MPI) still going after SECS
    #[arg(short = 't', long, value_name = "SECS", default_value = "600", value_parser = parse_seconds)]
    pub timeout: Duration,
}

/// A whole number of at least `min`.
fn at_least(min: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let n: u64 = s.trim().parse().map_err(|_| format!("expected a whole number, got {s:?}"))?;
        if n < min {
            return Err(format!("must be at least {min}, got {n}"));
        }
        Ok(n)
    }
}

/// `--nodes`: 1 to [`MAX_NAMESPACE_NODES`].
fn nodes_count(s: &str) -> Result<u64, String> {
    let n = at_least(1)(s)?;
    if n > MAX_NAMESPACE_NODES as u64 {
        return Err(format!("must be at most {MAX_NAMESPACE_NODES}, got {n}"));
    }
    Ok(n)
}

/// A size in bytes (`8`, `64K`, `1G`).
fn size(s: &str) -> Result<u64, String> {
    parse_size(s).ok_or_else(|| format!("expected a size in bytes such as 8, 64K, 64M or 1G, got {s:?}"))
}

fn data_type(s: &str) -> Result<DataType, String> {
    DataType::parse(s).ok_or_else(|| {
        let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
        format!("unknown data type {s:?}; expected one of {}", names.join(", "))
    })
}

fn reduce_op(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::parse(s).ok_or_else(|| {
        let names: Vec<&str> = ReduceOp::ALL.iter().map(|o| o.name()).collect();
        format!("unknown reduction operator {s:?}; expected one of {}", names.join(", "))
    })
}

/// Parses `2,8,32`: world sizes of at least 1, each at most once, in the order given.
fn parse_ranks_list(list: &str) -> Result<WorldSizes, String> {
    let mut v = Vec::new();
    for part in list.split(',') {
        let n: usize = part
            .trim()
            .parse()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("expected world sizes such as 2,8,32, got {part:?}"))?;
        if v.contains(&n) {
            return Err(format!("names {n} twice"));
        }
        v.push(n);
    }
    Ok(WorldSizes(v))
}

impl BenchArgs {
    /// Checks the options together and fills in what one implies (`--ranks-sweep`: Open MPI,
    /// host memory, 8 B); an error says which options clash.
    pub fn settle(mut self) -> Result<BenchArgs, String> {
        if self.ranks_sweep.is_some() {
            if self.ranks.is_some() || self.nodes.is_some() || self.gpu || self.plot.is_some() || self.json.is_some() {
                return Err("--ranks-sweep runs host memory on this host at the sizes it lists; drop -n, --nodes, \
                            --gpu, --plot and --json"
                    .into());
            }
            self.vs_mpi = true;
            // A CPU run even where GPUs are: the sweep compares with Open MPI on host memory.
            self.cpu = true;
            if self.min_bytes.is_none() && self.max_bytes.is_none() {
                (self.min_bytes, self.max_bytes) = (Some(8), Some(8));
            }
        }
        if self.plot_from.is_some() && self.plot.is_none() {
            return Err("--plot-from needs --plot FILE.svg".into());
        }
        if self.min_bytes() == 0 {
            return Err("-b must be at least 1 byte".into());
        }
        if self.min_bytes() > self.max_bytes() {
            return Err(format!("-b ({}) is larger than -e ({})", self.min_bytes(), self.max_bytes()));
        }
        if self.rate.is_some() && self.nodes.is_none() {
            return Err("--rate shapes the links between nodes; give --nodes too".into());
        }
        if let Some(nodes) = self.nodes {
            if self.gpu && self.vs_mpi {
                return Err(
                    "--nodes --gpu compares with NCCL (--vs-nccl); Open MPI (--vs-mpi) is the host-memory baseline"
                        .into(),
                );
            }
            if (self.vs_nccl || self.graph) && !self.gpu {
                return Err("--vs-nccl and --graph benchmark device buffers; give --gpu too".into());
            }
            if self.bind {
                return Err("--bind cannot be used with --nodes: each node's Open MPI daemon would bind its ranks \
                            as if it had the host alone"
                    .into());
            }
            if nodes.checked_mul(self.ranks()).is_none_or(|n| n > 1 << 20) {
                return Err(format!("{nodes} nodes x {} ranks is too many ranks", self.ranks()));
            }
        }
        if self.iters > i32::MAX as u64 {
            return Err(format!("--iters must be at most {}", i32::MAX));
        }
        if self.iters.saturating_mul(self.rounds) > i32::MAX as u64 {
            return Err(format!("--iters × --rounds must be at most {}", i32::MAX));
        }
        Ok(self)
    }

    /// Ranks (per node with `--nodes`): `-n`, or 2.
    pub fn ranks(&self) -> u64 {
        self.ranks.unwrap_or(2)
    }

    /// The smallest size: `-b`, or 8.
    pub fn min_bytes(&self) -> u64 {
        self.min_bytes.unwrap_or(8)
    }

    /// The largest size: `-e`, or 64 MiB.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes.unwrap_or(64 << 20)
    }

    /// Whether every call's result is checked.
    pub fn check(&self) -> bool {
        !self.no_check
    }

    /// The world sizes of `--ranks-sweep` (empty: one run at [`BenchArgs::ranks`]).
    pub fn world_sizes(&self) -> &[usize] {
        self.ranks_sweep.as_ref().map_or(&[], |w| &w.0)
    }

    /// `--mpi-args`, split at spaces.
    pub fn mpi_args(&self) -> Vec<String> {
        self.mpi_args.as_deref().unwrap_or_default().split_whitespace().map(String::from).collect()
    }

    /// Whether ranks are pinned one per CPU (weave through the launcher, Open MPI with
    /// `--bind-to core`): by default when they fit the CPUs this process may use.
    /// Never across nodes: each node's Open MPI daemon would bind as if it had the host alone.
    pub fn bind(&self) -> bool {
        let fit = || self.ranks() <= std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        self.nodes.is_none() && !self.no_bind && (self.bind || fit())
    }

    /// Ranks of the job: [`BenchArgs::ranks`], times `nodes` across nodes.
    pub fn total_ranks(&self) -> usize {
        (self.ranks() * self.nodes.unwrap_or(1)) as usize
    }

    /// The arguments both bench programs (`bench-worker` and `mpi_bench`) take.
    pub fn program_args(&self) -> Vec<String> {
        let flags = [
            ("--op", self.op.name().to_string()),
            ("-b", self.min_bytes().to_string()),
            ("-e", self.max_bytes().to_string()),
            ("-f", self.factor.to_string()),
            ("--dtype", self.dtype.name().to_string()),
            ("--redop", self.redop.name().to_string()),
            ("--iters", self.iters.to_string()),
            ("--warmup", self.warmup.to_string()),
            ("--rounds", self.rounds.to_string()),
            ("--turn-timeout", self.timeout.as_secs().max(1).to_string()),
        ];
        let mut v: Vec<String> = flags.into_iter().flat_map(|(flag, value)| [flag.to_string(), value]).collect();
        if self.check() {
            v.push("--check".into());
        }
        if self.inplace {
            v.push("--inplace".into());
        }
        v
    }

    /// The sizes of the sweep.
    pub fn sizes(&self) -> Vec<u64> {
        sweep_sizes(self.min_bytes(), self.max_bytes(), self.factor)
    }

    /// The run's header line: the collective, where it runs, its element type and operator.
    pub fn describe(&self, placement: &str) -> String {
        format!(
            "{} on {placement}, {}{}, {}{}",
            self.op.name(),
            self.dtype.name(),
            if reduces(self.op) { format!(" {}", self.redop.name()) } else { String::new() },
            if self.inplace { "in place" } else { "out of place" },
            if matches!(self.op, Collective::Broadcast | Collective::Reduce) { ", root 0" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[&str]) -> Result<BenchArgs, String> {
        let cli = Cli::try_parse_from(std::iter::once("weave-bench").chain(line.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.bench.settle()
    }

    #[test]
    fn defaults_and_options() {
        let d = parse(&[]).unwrap();
        assert_eq!(d.sizes().len(), 24); // 8 B, 16 B, ..., 64 MiB
        assert_eq!((d.ranks(), d.factor, d.check()), (2, 2, true));
        assert_eq!(
            (d.op, d.dtype, d.redop, d.iters, d.warmup, d.rounds),
            (Collective::AllReduce, DataType::F32, ReduceOp::Sum, 20, 5, 5)
        );
        assert_eq!(d.timeout, Duration::from_secs(600));
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
        let a = parse(&line).unwrap();
        assert_eq!(a.op, Collective::AllGather);
        assert_eq!((a.ranks(), a.min_bytes(), a.max_bytes(), a.factor), (3, 1024, 1 << 20, 2));
        assert_eq!((a.dtype, a.redop, a.iters, a.warmup, a.rounds), (DataType::Bf16, ReduceOp::Max, 7, 0, 3));
        assert!(!a.check() && a.inplace && a.vs_mpi && a.no_build);
        assert_eq!(a.json, Some(PathBuf::from("out.json")));
        assert_eq!(a.mpi_args(), ["--mca", "btl", "self,tcp"]);
        assert_eq!(a.timeout, Duration::from_secs(30));
        assert_eq!(a.sizes().len(), 11);
        let args = a.program_args();
        assert_eq!(args[..4], ["--op", "all_gather", "-b", "1024"]);
        assert!(args.contains(&"bfloat16".to_string()));
        assert!(args.contains(&"--inplace".to_string()) && !args.contains(&"--check".to_string()));
        // The last of a pair of opposite flags wins.
        assert!(parse(&["--no-check", "--check"]).unwrap().check());
        assert!(!parse(&["--bind", "--no-bind"]).unwrap().bind());
        let gpu = parse(&["--cpu", "--gpu"]).unwrap();
        assert!(gpu.gpu && !gpu.cpu);
    }

    #[test]
    fn ranks_sweep() {
        let a = parse(&["--ranks-sweep", "2,8,32"]).unwrap();
        assert_eq!(a.world_sizes(), [2, 8, 32]);
        assert!(a.vs_mpi && a.cpu);
        assert_eq!((a.min_bytes(), a.max_bytes()), (8, 8));
        let a = parse(&["--ranks-sweep=4", "-e", "1K"]).unwrap();
        assert_eq!((a.min_bytes(), a.max_bytes()), (8, 1024));
        assert!(parse(&["--ranks-sweep", "2", "-n", "4"]).unwrap_err().contains("drop -n"));
        assert!(parse(&["--ranks-sweep", "2", "-N", "2"]).unwrap_err().contains("--nodes"));
        assert!(parse(&["--ranks-sweep", "0"]).unwrap_err().contains("world sizes"));
        assert!(parse(&["--ranks-sweep", "8,8"]).unwrap_err().contains("twice"));
        assert!(parse(&["--ranks-sweep", "2,,8"]).is_err());
    }

    #[test]
    fn nodes_and_rate() {
        let a = parse(&["--nodes", "2", "-n", "3", "--rate=10gbit", "--vs-mpi"]).unwrap();
        assert_eq!((a.nodes, a.ranks(), a.total_ranks()), (Some(2), 3, 6));
        assert_eq!(a.rate.map(Rate::bytes_per_sec), Some(1_250_000_000));
        assert!(!a.bind(), "never bound across nodes");
        let a = parse(&["-N1", "--no-bind"]).unwrap();
        assert_eq!((a.nodes, a.total_ranks(), a.rate), (Some(1), 2, None));
        let d = parse(&["-n", "3"]).unwrap();
        assert_eq!((d.nodes, d.total_ranks()), (None, 3));
        let err = |line: &[&str]| parse(line).unwrap_err();
        assert!(err(&["--rate", "1gbit"]).contains("give --nodes too"));
        assert!(err(&["-N", "2", "--rate", "fast"]).contains("--rate"));
        assert!(err(&["-N", "0"]).contains("at least 1"));
        assert!(err(&["-N", "251"]).contains("at most 250"));
        assert!(err(&["-N", "2", "--bind"]).contains("--bind cannot be used with --nodes"));
        assert!(err(&["-N", "2", "--gpu", "--vs-mpi"]).contains("compares with NCCL"));
        assert!(err(&["-N", "2", "--vs-nccl"]).contains("give --gpu too"));
        let g = parse(&["-N", "2", "-n", "1", "--gpu", "--vs-nccl", "--rate", "10gbit"]).unwrap();
        assert_eq!((g.nodes, g.total_ranks(), g.gpu, g.vs_nccl), (Some(2), 2, true, true));
        assert!(err(&["-N", "200", "-n", "10000"]).contains("too many ranks"));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        let err = |line: &[&str]| parse(line).unwrap_err();
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
        assert!(err(&["--check=1"]).contains("--check"));
        assert!(err(&["--frobnicate"]).contains("--frobnicate"));
        assert!(err(&["extra"]).contains("extra"));
        assert!(err(&["-e"]).contains("a value is required for '--maxbytes"));
        assert!(err(&["--plot-from", "x.log"]).contains("needs --plot"));
    }

    #[test]
    fn the_other_commands_take_their_own_options() {
        let cli = Cli::try_parse_from(["weave-bench", "scale-model", "--measured", "shm:x.json"]).unwrap();
        assert!(matches!(cli.command, Some(Command::ScaleModel(_))));
        let cli = Cli::try_parse_from(["weave-bench", "node-exec", "--node", "a=1", "--", "a", "true"]).unwrap();
        assert!(matches!(cli.command, Some(Command::NodeExec(_))));
        assert!(Cli::try_parse_from(["weave-bench", "-n", "2", "scale-model"]).is_err());
    }
}
