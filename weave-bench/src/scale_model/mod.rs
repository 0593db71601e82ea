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

use serde::Deserialize;

mod model;

use model::*;

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
}
