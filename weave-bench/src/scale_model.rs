//! `weave-bench scale-model` (`cargo xtask scale-model`): the alpha-beta model of weave's plans (docs/SCALE.md).
//!
//! A plan's time is `steps × α + bytes × β + reduced × γ`: `steps` sequential messages on the
//! critical path, `bytes` each rank sends on it, `reduced` bytes it combines — per fabric, with
//! α the time of one step (latency and software), β the time per byte (inverse bandwidth) and
//! γ the time per reduced byte. The counts come from the algorithms' shapes (below); the
//! constants of every fabric with measured points (`--measured FABRIC:FILE`: processes on
//! shared memory, thread ranks over loopback, TCP between namespace nodes, SoftRoCE) are
//! fitted to them (least squares over the plans that ran), the others are taken from the
//! figures docs/perf-log/ records.
//!
//! The command prints, as markdown: the constants, every measured point next to the model's
//! prediction for the plan that ran (and the error, per fabric; also that of the constants the
//! fabric would otherwise take), and the predicted all-reduce and all-gather times from 8 B to
//! 1 GiB at 8 to 65,536 ranks (8 per node) for the plan weave's tables choose next to a flat
//! ring, with the crossovers between the plans.

use std::path::PathBuf;
use std::process::ExitCode;

use collectives::{AlgorithmTable, Collective, Family, MemorySpace};
use serde::Deserialize;

/// The command line of `weave-bench scale-model`: prints docs/SCALE.md's tables (the model's
/// constants, its error against every measured point, and predicted all_reduce / all_gather
/// times for 8 B .. 1 GiB at 8 .. 65,536 ranks, 8 per node, weave's plans next to a flat ring).
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleModelArgs {
    /// JSON lines as bench-worker prints them (op, bytes, ranks, time_us, algorithm), measured
    /// on FABRIC, whose constants are fitted to them: `shm` (processes of this host over shared
    /// memory), `threads` (ranks as threads of one process: bench-worker --threads N),
    /// `tcp` (namespace nodes of this host over TCP, one rank each: weave-bench --nodes N -n 1
    /// --json FILE), `softroce` (point-to-point messages: op "send"; algorithm "message", one
    /// message's latency, or "stream", the time per message of a bandwidth test). Repeatable;
    /// at least 3 points per fabric.
    #[arg(long = "measured", value_name = "FABRIC:FILE", value_parser = measured, required = true)]
    pub measured: Vec<Measured>,
}

/// One `--measured FABRIC:FILE`.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The fabric's key (`shm`, `threads`, `tcp`, `softroce`).
    pub fabric: &'static str,
    /// The file of JSON lines.
    pub file: PathBuf,
}

/// Parses `FABRIC:FILE` against the known fabrics.
fn measured(text: &str) -> Result<Measured, String> {
    let (fabric, file) = text.split_once(':').ok_or_else(|| format!("expected FABRIC:FILE, got {text:?}"))?;
    let source = SOURCES.iter().find(|s| s.key == fabric).ok_or_else(|| {
        let keys: Vec<&str> = SOURCES.iter().map(|s| s.key).collect();
        format!("unknown fabric {fabric:?} (one of {})", keys.join(", "))
    })?;
    Ok(Measured { fabric: source.key, file: file.into() })
}

/// One fabric's constants (µs per step, per byte, per reduced byte).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fabric {
    pub(crate) name: &'static str,
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
    pub(crate) gamma: f64,
    /// Where ranks share cores (one host with more ranks than CPUs): the CPUs, and the time
    /// of a step then per rank queued on a core, when a message waits for the scheduler to
    /// run its receiver. 0: ranks never share.
    pub(crate) cores: usize,
    pub(crate) alpha_shared: f64,
}

impl Fabric {
    /// A fabric whose ranks never share cores.
    const fn network(name: &'static str, alpha: f64, beta: f64) -> Fabric {
        Fabric { name, alpha, beta, gamma: 0.0, cores: 0, alpha_shared: alpha }
    }
}

/// The network between nodes in the predictions: 100 Gbit/s, 5 µs a step (a conservative
/// InfiniBand / RoCE figure; the measured fabrics here are slower).
const NETWORK: Fabric = Fabric::network("network (100 Gbit/s, 5 µs)", 5.0, 8.0 / 100e3);
/// TCP between namespace nodes at 10 Gbit/s (docs/perf-log/nodes.md, "Across nodes: faults, hierarchical plans, device buffers" and "Across nodes: weave vs Open MPI on 2 namespace nodes × 2 ranks": 8 B all-reduce
/// over 2 nodes ≈ 26 µs, 64 MiB at 50 % of the link).
const TCP_10G: Fabric = Fabric::network("tcp (perf-log figure)", 26.0, 8.0 / 5e3);
/// SoftRoCE in a QEMU guest (docs/perf-log/infiniband.md: 25.6 µs a message, ≈ 40 MB/s).
const SOFTROCE: Fabric = Fabric::network("softroce (perf-log figures)", 25.6, 1.0 / 40.0);
/// H200 NVLink (docs/perf-log/gpu.md: small all-reduce ≈ 5 µs between 2 GPUs, ≈ 360 GB/s busbw).
const NVLINK: Fabric = Fabric::network("nvlink (H200)", 2.5, 1.0 / 360e3);

/// A collective the model covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    AllReduce,
    AllGather,
    /// One message of `m` bytes from one rank to another (the point-to-point benches).
    Send,
}

/// The shapes of the plans: what each costs in steps, bytes sent and bytes reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Every rank reads every peer's data in one step (the direct family on one host).
    OneShot,
    /// Reduce-scatter then all-gather through shared scratch (the direct family's two phases).
    TwoPhase,
    /// Neighbour ring: `n - 1` steps each way.
    Ring,
    /// Recursive doubling (all-reduce): `log2 p` swaps of the whole buffer, two more steps for
    /// ranks outside the power of two `p`.
    Doubling,
    /// Recursive halving then doubling (Rabenseifner).
    Halving,
    /// Bruck's all-gather: `ceil(log2 n)` steps.
    Bruck,
    /// One hop to every peer, in lockstep (channel direct); for a send, the one message.
    OneHop,
    /// Messages back to back, as a bandwidth test sends them: the time per message, whose
    /// latency overlaps the others' (bytes only, no step).
    Stream,
}

/// Steps, bytes sent and bytes reduced on the critical path of `shape` for `op` with `n` ranks
/// and a call of `m` bytes (all-gather: the output buffer).
pub(crate) fn counts(op: Op, shape: Shape, n: usize, m: f64) -> (f64, f64, f64) {
    let nf = n as f64;
    if n <= 1 {
        return (0.0, 0.0, 0.0);
    }
    let p = 1usize << n.ilog2();
    let (pf, lg) = (p as f64, f64::from(p.ilog2()));
    let extra = if p == n { 0.0 } else { 2.0 };
    match (op, shape) {
        (Op::Send, Shape::Stream) => (0.0, m, 0.0),
        (Op::Send, _) => (1.0, m, 0.0),
        (Op::AllReduce | Op::AllGather, Shape::Stream) => {
            let (_, b, r) = counts(op, Shape::OneHop, n, m);
            (0.0, b, r)
        }
        (Op::AllReduce, Shape::OneShot) => (2.0, (nf - 1.0) * m, (nf - 1.0) * m),
        (Op::AllReduce, Shape::TwoPhase) => (3.0, 2.0 * (nf - 1.0) / nf * m, (nf - 1.0) / nf * m),
        (Op::AllReduce, Shape::Ring) => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf * m, (nf - 1.0) / nf * m),
        (Op::AllReduce, Shape::Doubling) => (lg + extra, (lg + extra) * m, (lg + extra / 2.0) * m),
        (Op::AllReduce, Shape::Halving) => {
            (2.0 * lg + extra, 2.0 * (pf - 1.0) / pf * m + extra * m, (pf - 1.0) / pf * m + extra / 2.0 * m)
        }
        // Channel direct: the whole buffer to every peer in one hop, each rank reduces all.
        (Op::AllReduce, Shape::OneHop) => (1.0, (nf - 1.0) * m, (nf - 1.0) * m),
        (Op::AllReduce, Shape::Bruck) => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf * m, (nf - 1.0) / nf * m),
        (Op::AllGather, Shape::Bruck | Shape::Doubling | Shape::Halving) => {
            (f64::from(n.next_power_of_two().ilog2()), (nf - 1.0) / nf * m, 0.0)
        }
        (Op::AllGather, Shape::OneShot | Shape::TwoPhase | Shape::OneHop) => (1.0, (nf - 1.0) / nf * m, 0.0),
        (Op::AllGather, Shape::Ring) => (nf - 1.0, (nf - 1.0) / nf * m, 0.0),
    }
}

/// The model's features of `shape` for `n` ranks and `m` bytes on a fabric with `cores` CPUs
/// (0: ranks never share): steps alone, steps sharing cores, bytes and reduced bytes — the
/// last three times the ranks per core where they share: a step then waits for every rank
/// queued on a core to run, and a rank gets that share of a CPU for its bytes.
fn features(op: Op, shape: Shape, n: usize, m: f64, cores: usize) -> [f64; 4] {
    let (s, b, r) = counts(op, shape, n, m);
    let shared = cores > 0 && n > cores;
    let per_core = if shared { n as f64 / cores as f64 } else { 1.0 };
    if shared { [0.0, s * per_core, b * per_core, r * per_core] } else { [s, 0.0, b, r] }
}

/// The model's time (µs) of `shape` on `fabric`.
pub(crate) fn time(f: &Fabric, op: Op, shape: Shape, n: usize, m: f64) -> f64 {
    let x = features(op, shape, n, m, f.cores);
    x[0] * f.alpha + x[1] * f.alpha_shared + x[2] * f.beta + x[3] * f.gamma
}

/// The shape of a plan by the algorithm name weave prints (`None`: not modelled).
pub(crate) fn shape_of(algorithm: &str) -> Option<Shape> {
    Some(match algorithm {
        "one_shot" => Shape::OneShot,
        "two_phase" | "two_shot" | "two_shot_ll128" => Shape::TwoPhase,
        "ring" | "channel_ring" => Shape::Ring,
        "channel_doubling" => Shape::Doubling,
        "channel_halving" => Shape::Halving,
        "channel_bruck" => Shape::Bruck,
        "direct" | "channel_direct" | "message" => Shape::OneHop,
        "stream" => Shape::Stream,
        _ => return None,
    })
}

/// The plan weave's algorithm table picks for a call of `m` bytes on `n` ranks, as a shape:
/// `across` a network (one rank per node: the channel family on host memory), or inside an
/// NVLink node (the direct family on an H200's device memory, sm_90). A point-to-point message
/// is one hop.
fn weave_shape(op: Op, n: usize, m: f64, across: bool) -> Shape {
    let collective = match op {
        Op::AllReduce => Collective::AllReduce,
        Op::AllGather => Collective::AllGather,
        Op::Send => return Shape::OneHop,
    };
    let mut table = AlgorithmTable::default();
    let (memory, arch, family) = if across {
        table.for_one_rank_per_node();
        (MemorySpace::Host, None, Family::Channel)
    } else {
        (MemorySpace::Device, Some(90), Family::Direct)
    };
    let algorithm = table.select_among(collective, memory, n, m as usize, arch, &[family]);
    // Every algorithm the table picks for these calls has a shape (a test checks it); a ring
    // is the model's reading of anything else.
    algorithm.ok().and_then(|a| shape_of(a.name())).unwrap_or(Shape::Ring)
}

/// Hierarchical all-reduce / all-gather over `nodes` nodes of `per_node` ranks: the step inside
/// the node on `intra`, the step across nodes (one rank per node and rail, `1 / per_node` of
/// the data) on `inter` with weave's shape for that world, and the closing step inside.
fn hierarchical(op: Op, intra: &Fabric, inter: &Fabric, nodes: usize, per_node: usize, m: f64) -> f64 {
    let shard = m / per_node as f64;
    let across = time(inter, op, weave_shape(op, nodes, shard, true), nodes, shard);
    // All-reduce: reduce-scatter in the node, all-reduce of each shard across, all-gather in
    // the node (the two node steps cost one node all-reduce); all-gather: across, then inside.
    time(intra, op, weave_shape(op, per_node, m, false), per_node, m) + across
}

/// One measured point.
#[derive(Debug, Clone)]
struct Point {
    fabric: &'static str,
    op: Op,
    ranks: usize,
    bytes: f64,
    time_us: f64,
    shape: Shape,
}

/// The keys of a result line the model reads.
#[derive(Deserialize)]
struct PointLine {
    op: String,
    algorithm: String,
    bytes: f64,
    ranks: usize,
    time_us: f64,
}

/// Reads the points of `file` (bench-worker JSON lines) measured on `fabric`; lines of other
/// collectives or unmodelled plans are skipped.
fn read_points(fabric: &'static str, file: &std::path::Path) -> Result<Vec<Point>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| l.trim_start().starts_with('{')) {
        let p: PointLine = serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", file.display(), i + 1))?;
        let op = match p.op.as_str() {
            "all_reduce" => Op::AllReduce,
            "all_gather" => Op::AllGather,
            "send" => Op::Send,
            _ => continue,
        };
        let Some(shape) = shape_of(&p.algorithm) else { continue };
        // A call that moves nothing returns at once: no point to fit.
        if p.bytes == 0.0 {
            continue;
        }
        out.push(Point { fabric, op, ranks: p.ranks, bytes: p.bytes, time_us: p.time_us, shape });
    }
    Ok(out)
}

/// Least-squares α, α shared, β, γ ≥ 0 for `points` on a host of `cores` CPUs (a constant the
/// points say nothing of, or that comes out negative, is dropped and the rest refitted).
pub(crate) fn fit(name: &'static str, cores: usize, points: &[(Op, Shape, usize, f64, f64)]) -> Fabric {
    let rows: Vec<([f64; 4], f64)> =
        points.iter().map(|&(op, shape, n, m, t)| (features(op, shape, n, m, cores), t)).collect();
    let mut used = [0, 1, 2, 3].map(|k| rows.iter().any(|(x, _)| x[k] != 0.0));
    loop {
        let idx: Vec<usize> = (0..4).filter(|&k| used[k]).collect();
        let k = idx.len();
        let mut a = vec![vec![0.0; k + 1]; k];
        // Weighted by 1 / t²: relative errors, so small calls count as much as large ones.
        for (x, t) in &rows {
            let w = 1.0 / (t * t).max(1e-12);
            for (i, &p) in idx.iter().enumerate() {
                for (j, &q) in idx.iter().enumerate() {
                    a[i][j] += w * x[p] * x[q];
                }
                a[i][k] += w * x[p] * t;
            }
        }
        let solved = solve(&mut a);
        let mut c = [0.0; 4];
        if let Some(sol) = &solved {
            for (i, &p) in idx.iter().enumerate() {
                c[p] = sol[i];
            }
        }
        match (0..4).find(|&p| used[p] && (solved.is_none() || c[p] < 0.0)) {
            Some(p) if k > 1 => used[p] = false,
            _ => {
                let [alpha, alpha_shared, beta, gamma] = c.map(|v: f64| v.max(0.0));
                return Fabric { name, alpha, beta, gamma, cores, alpha_shared };
            }
        }
    }
}

/// Solves the augmented system `a` (k rows of k + 1) by Gaussian elimination; `None` if singular.
fn solve(a: &mut [Vec<f64>]) -> Option<Vec<f64>> {
    let k = a.len();
    for col in 0..k {
        let pivot = (col..k).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (row, r) in a.iter_mut().enumerate() {
            if row != col {
                let f = r[col] / pivot_row[col];
                for (x, p) in r[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

/// CPUs online on this host (where the shm points were measured).
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn size_name(b: f64) -> String {
    let b = b as u64;
    match b {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn us(t: f64) -> String {
    if t >= 1e6 {
        format!("{:.2} s", t / 1e6)
    } else if t >= 1e3 {
        format!("{:.1} ms", t / 1e3)
    } else {
        format!("{t:.1} µs")
    }
}

/// Where measured points can come from: the fabric's key in `--measured`, its name in the
/// tables, whether its ranks share this host's CPUs, and the constants its fitted ones are
/// compared with.
struct Source {
    key: &'static str,
    name: &'static str,
    shares_host_cpus: bool,
    yardstick: Yardstick,
}

/// What a fabric's constants would be without its own points.
#[derive(Clone, Copy)]
enum Yardstick {
    /// Nothing else: the points are the only source.
    None,
    /// Another measured fabric's fitted constants (by key).
    Fitted(&'static str),
    /// Constants taken from the figures docs/perf-log/ records.
    Given(&'static Fabric),
}

const SOURCES: &[Source] = &[
    Source { key: "shm", name: "shm (processes, this host)", shares_host_cpus: true, yardstick: Yardstick::None },
    Source {
        key: "threads",
        name: "threads (one process, loopback)",
        shares_host_cpus: true,
        yardstick: Yardstick::Fitted("shm"),
    },
    Source {
        key: "tcp",
        name: "tcp (namespace nodes, 10 Gbit/s)",
        shares_host_cpus: true,
        yardstick: Yardstick::Given(&TCP_10G),
    },
    Source {
        key: "softroce",
        name: "softroce (QEMU guest, 2 ranks)",
        shares_host_cpus: false,
        yardstick: Yardstick::Given(&SOFTROCE),
    },
];

/// The fabrics whose constants come from docs/perf-log/ figures or are assumed, with where from.
const GIVEN: [(&Fabric, &str); 4] = [
    (&TCP_10G, "docs/perf-log/nodes.md: one 2-node figure"),
    (&SOFTROCE, "docs/perf-log/infiniband.md: one latency, one bandwidth"),
    (&NVLINK, "docs/perf-log/gpu.md: H200 figures"),
    (&NETWORK, "assumed"),
];

/// A measured fabric: where its points came from, its fitted constants and its points.
struct Fitted<'a> {
    source: &'static Source,
    fabric: Fabric,
    points: Vec<&'a Point>,
}

/// Runs `weave-bench scale-model`.
pub fn run(args: &ScaleModelArgs) -> ExitCode {
    let files: Vec<(&'static Source, &std::path::Path)> = args
        .measured
        .iter()
        .filter_map(|m| Some((SOURCES.iter().find(|s| s.key == m.fabric)?, m.file.as_path())))
        .collect();
    let mut points = Vec::new();
    for (source, file) in &files {
        match read_points(source.key, file) {
            Ok(p) => points.extend(p),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut fitted = Vec::new();
    for source in SOURCES.iter().filter(|s| files.iter().any(|(f, _)| f.key == s.key)) {
        let mine: Vec<&Point> = points.iter().filter(|p| p.fabric == source.key).collect();
        if mine.len() < 3 {
            eprintln!(
                "error: fitting the {} constants needs at least 3 points of collectives the model covers; the files \
                 give {}",
                source.key,
                mine.len()
            );
            return ExitCode::FAILURE;
        }
        let cores = if source.shares_host_cpus { host_cpus() } else { 0 };
        let rows: Vec<_> = mine.iter().map(|p| (p.op, p.shape, p.ranks, p.bytes, p.time_us)).collect();
        fitted.push(Fitted { source, fabric: fit(source.name, cores, &rows), points: mine });
    }
    print!("{}", report(&fitted));
    ExitCode::SUCCESS
}

/// The model's error over `points` with the constants `f`: the factor it is off by at the
/// median and at worst (`model / measured` or its inverse, whichever is above 1).
fn error(f: &Fabric, points: &[&Point]) -> (f64, f64) {
    let mut e: Vec<f64> =
        points.iter().map(|p| (time(f, p.op, p.shape, p.ranks, p.bytes) / p.time_us).ln().abs()).collect();
    e.sort_by(f64::total_cmp);
    (e.get(e.len() / 2).map_or(f64::NAN, |v| v.exp()), e.last().map_or(f64::NAN, |v| v.exp()))
}

/// The constants `fabric`'s points are compared with besides its own fit, if any.
fn yardstick<'a>(fitted: &'a [Fitted], source: &Source) -> Option<&'a Fabric> {
    match source.yardstick {
        Yardstick::None => None,
        Yardstick::Fitted(key) => fitted.iter().find(|f| f.source.key == key).map(|f| &f.fabric),
        Yardstick::Given(f) => Some(f),
    }
}

/// One row of the constants table.
fn constants_row(f: &Fabric, from: &str) -> String {
    let shared = if f.cores > 0 { format!("{:.3} (over {} cores)", f.alpha_shared, f.cores) } else { "-".to_string() };
    format!("| {} | {from} | {:.3} | {shared} | {:.4} | {:.4} |\n", f.name, f.alpha, f.beta * 1024.0, f.gamma * 1024.0)
}

/// The whole markdown report.
fn report(fitted: &[Fitted]) -> String {
    let mut s = String::new();
    s.push_str("### Constants\n\n");
    s.push_str("| fabric | from | α (µs / step) | α, ranks sharing cores (µs / step / rank per core) | β (µs / KiB) | γ (µs / KiB reduced) |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for f in fitted {
        s.push_str(&constants_row(&f.fabric, &format!("fitted to {} points", f.points.len())));
    }
    for (f, from) in GIVEN {
        s.push_str(&constants_row(f, from));
    }
    s.push_str("\n### The model's error per fabric\n\n");
    s.push_str(
        "| fabric | points | ranks | fitted constants: median | worst | other constants | their median | worst |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|\n");
    for f in fitted {
        let (median, worst) = error(&f.fabric, &f.points);
        let ranks = |pick: fn(usize, usize) -> usize| f.points.iter().map(|p| p.ranks).reduce(pick).unwrap_or(0);
        let other = match yardstick(fitted, f.source) {
            Some(y) => {
                let (m, w) = error(y, &f.points);
                format!("{} | {m:.2} | {w:.2}", y.name)
            }
            None => "- | - | -".to_string(),
        };
        s.push_str(&format!(
            "| {} | {} | {}–{} | {median:.2} | {worst:.2} | {other} |\n",
            f.fabric.name,
            f.points.len(),
            ranks(usize::min),
            ranks(usize::max)
        ));
    }
    for f in fitted {
        let other = yardstick(fitted, f.source);
        s.push_str(&format!("\n### Measured points against the model: {}\n\n", f.fabric.name));
        s.push_str("| op | ranks | bytes | plan | measured | model | model / measured |");
        if let Some(y) = other {
            s.push_str(&format!(" {} / measured |", y.name));
        }
        s.push_str("\n|---|---|---|---|---|---|---|");
        s.push_str(if other.is_some() { "---|\n" } else { "\n" });
        for p in &f.points {
            let t = time(&f.fabric, p.op, p.shape, p.ranks, p.bytes);
            s.push_str(&format!(
                "| {:?} | {} | {} | {:?} | {} | {} | {:.2} |",
                p.op,
                p.ranks,
                size_name(p.bytes),
                p.shape,
                us(p.time_us),
                us(t),
                t / p.time_us
            ));
            if let Some(y) = other {
                s.push_str(&format!(" {:.2} |", time(y, p.op, p.shape, p.ranks, p.bytes) / p.time_us));
            }
            s.push('\n');
        }
        let (median, worst) = error(&f.fabric, &f.points);
        s.push_str(&format!(
            "\n{} points: the model is off by a factor of {median:.2} at the median and {worst:.2} at worst.\n",
            f.points.len()
        ));
    }
    for op in [Op::AllReduce, Op::AllGather] {
        s.push_str(&format!(
            "\n### {:?}: weave's plan / flat ring (8 ranks per node: NVLink inside, {} across)\n\n",
            op, NETWORK.name
        ));
        let ranks = [8usize, 64, 512, 4096, 65536];
        s.push_str("| bytes |");
        for n in ranks {
            s.push_str(&format!(" {n} ranks |"));
        }
        s.push_str("\n|---|");
        s.push_str(&"---|".repeat(ranks.len()));
        s.push('\n');
        for m in [8.0, 1024.0, 65536.0, 1048576.0, 67108864.0, 1073741824.0] {
            s.push_str(&format!("| {} |", size_name(m)));
            for n in ranks {
                let nodes = (n / 8).max(1);
                let weave = if nodes > 1 {
                    hierarchical(op, &NVLINK, &NETWORK, nodes, 8, m)
                } else {
                    time(&NVLINK, op, weave_shape(op, n, m, false), n, m)
                };
                // A flat ring crosses the network on every step once there are several nodes.
                let ring = time(if nodes > 1 { &NETWORK } else { &NVLINK }, op, Shape::Ring, n, m);
                s.push_str(&format!(" {} / {} |", us(weave), us(ring)));
            }
            s.push('\n');
        }
    }
    s.push_str("\n### Crossovers (the size from which the large-message plan is faster)\n\n");
    s.push_str(
        "| fabric | ranks | all_reduce: doubling → halving | all_reduce: halving → ring | all_gather: Bruck → ring |\n",
    );
    s.push_str("|---|---|---|---|---|\n");
    let collective_fabrics = fitted.iter().filter(|f| f.points.iter().any(|p| p.op != Op::Send)).map(|f| &f.fabric);
    for f in collective_fabrics.chain([&NETWORK]) {
        for n in [16usize, 64, 512, 4096, 65536] {
            let cross = |op: Op, small: Shape, large: Shape| {
                (3..=30).map(|k| f64::from(1u32 << k)).find(|&m| time(f, op, large, n, m) < time(f, op, small, n, m))
            };
            let show = |c: Option<f64>| c.map_or("not below 1 GiB".to_string(), size_name);
            s.push_str(&format!(
                "| {} | {n} | {} | {} | {} |\n",
                f.name,
                show(cross(Op::AllReduce, Shape::Doubling, Shape::Halving)),
                show(cross(Op::AllReduce, Shape::Halving, Shape::Ring)),
                show(cross(Op::AllGather, Shape::Bruck, Shape::Ring))
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_textbook_shapes() {
        // Ring all-reduce of 8 ranks: 14 steps, 2·7/8 of the buffer sent.
        assert_eq!(counts(Op::AllReduce, Shape::Ring, 8, 8.0), (14.0, 14.0, 7.0));
        // Doubling: log2 8 = 3 swaps; 9 ranks fold the extra one in and out (+2).
        assert_eq!(counts(Op::AllReduce, Shape::Doubling, 8, 1.0).0, 3.0);
        assert_eq!(counts(Op::AllReduce, Shape::Doubling, 9, 1.0).0, 5.0);
        // Bruck all-gather: ceil(log2 n) steps for any n.
        assert_eq!(counts(Op::AllGather, Shape::Bruck, 5, 5.0).0, 3.0);
        assert_eq!(counts(Op::AllGather, Shape::Bruck, 65536, 1.0).0, 16.0);
        // Channel direct all-reduce: the whole buffer to each of the 3 peers in one hop.
        assert_eq!(counts(Op::AllReduce, Shape::OneHop, 4, 8.0), (1.0, 24.0, 24.0));
        // A message is one step; a stream of them costs bytes only.
        assert_eq!(counts(Op::Send, Shape::OneHop, 2, 64.0), (1.0, 64.0, 0.0));
        assert_eq!(counts(Op::Send, Shape::Stream, 2, 64.0), (0.0, 64.0, 0.0));
    }

    #[test]
    fn the_error_is_the_factor_the_model_is_off_by() {
        let f = Fabric::network("t", 10.0, 0.01);
        let point = |time_us: f64| Point {
            fabric: "tcp",
            op: Op::Send,
            ranks: 2,
            bytes: 1000.0,
            time_us,
            shape: Shape::OneHop,
        };
        // The model says 20 µs: measured 20, 40 (model / measured 0.5) and 5 (4).
        let pts = [point(20.0), point(40.0), point(5.0)];
        let (median, worst) = error(&f, &pts.iter().collect::<Vec<_>>());
        assert!((median - 2.0).abs() < 1e-9 && (worst - 4.0).abs() < 1e-9, "{median} {worst}");
    }

    #[test]
    fn the_fit_recovers_the_constants_that_made_the_points() {
        let truth = Fabric { name: "t", alpha: 0.7, beta: 0.002, gamma: 0.0005, cores: 4, alpha_shared: 9.0 };
        let mut pts = Vec::new();
        for (op, shape) in
            [(Op::AllReduce, Shape::Ring), (Op::AllReduce, Shape::Doubling), (Op::AllGather, Shape::Bruck)]
        {
            for n in [2usize, 3, 8, 64] {
                for m in [8.0, 4096.0, 1048576.0] {
                    pts.push((op, shape, n, m, time(&truth, op, shape, n, m)));
                }
            }
        }
        let f = fit("t", 4, &pts);
        for (got, want) in
            [(f.alpha, truth.alpha), (f.alpha_shared, truth.alpha_shared), (f.beta, truth.beta), (f.gamma, truth.gamma)]
        {
            assert!((got - want).abs() <= 1e-6 * want.max(1e-9), "fitted {got}, made with {want}");
        }
    }

    #[test]
    fn logarithmic_plans_beat_the_ring_for_small_calls_of_large_worlds_only() {
        let small = 8.0;
        assert!(
            time(&NETWORK, Op::AllReduce, Shape::Doubling, 4096, small)
                < time(&NETWORK, Op::AllReduce, Shape::Ring, 4096, small)
        );
        let huge = 1073741824.0;
        assert!(
            time(&NETWORK, Op::AllReduce, Shape::Ring, 4096, huge)
                < time(&NETWORK, Op::AllReduce, Shape::Doubling, 4096, huge)
        );
    }

    #[test]
    fn every_plan_the_table_picks_has_a_shape() {
        let mut across = AlgorithmTable::default();
        across.for_one_rank_per_node();
        let inside = AlgorithmTable::default();
        for c in [Collective::AllReduce, Collective::AllGather] {
            for n in [2usize, 3, 8, 9, 64, 65536] {
                for k in 0..=30 {
                    let m = 1usize << k;
                    let picked = [
                        across.select_among(c, MemorySpace::Host, n, m, None, &[Family::Channel]),
                        inside.select_among(c, MemorySpace::Device, n.min(8), m, Some(90), &[Family::Direct]),
                    ];
                    for a in picked {
                        let a = a.unwrap_or_else(|e| panic!("{c} on {n} ranks, {m} B: {e}"));
                        assert!(
                            shape_of(a.name()).is_some(),
                            "{c} on {n} ranks, {m} B: the model has no shape for {a}"
                        );
                    }
                }
            }
        }
        // The table's small-call plans across nodes are logarithmic from 4 ranks.
        assert_eq!(weave_shape(Op::AllReduce, 64, 8.0, true), Shape::Doubling);
        assert_eq!(weave_shape(Op::AllReduce, 8, 8.0, false), Shape::OneShot);
    }
}
