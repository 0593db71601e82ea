//! The benchmark on host memory: weave's ranks (`bench-worker`, launched through
//! [`weave_launch`]) and, with `--vs-mpi`, the Open MPI baseline ([`crate::mpi`]) start
//! together and take turns per size through [`crate::turns`] (a batch of weave, a batch of Open
//! MPI, K times), so a noisy host hurts both alike. Both print one JSON line per size
//! ([`crate::record`]); [`LiveTable`] joins them into the table as they come. Also the world-size
//! sweep (`--ranks-sweep`, [`crate::sweep`]) and runs across namespace nodes
//! ([`crate::nodes`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use weave_launch::{CancelToken, LaunchSpec, NodeFabric, launch, launch_on};

use crate::cli::BenchArgs;
use crate::mpi::{build_mpi_bench, mpi_tools, mpirun_defaults, open_mpi_major, run_mpi};
use crate::nodes::BenchNodes;
use crate::plot::{Series, busbw_svg};
use crate::record::SizeResult;
use crate::sweep;
use crate::table::Table;
use crate::turns::{Job, Turns};

/// Writes the SVG plot of `series` to `path`.
pub(crate) fn write_plot(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    std::fs::write(path, busbw_svg(title, series)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!("bench: wrote the plot to {}", path.display());
    Ok(())
}

/// The workspace root (weave-bench lives one level below it).
pub(crate) fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the workspace root) or `target`.
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root.join(d),
        _ => root.join("target"),
    }
}

/// Builds `worker` (a binary of this package) in release mode, with `features`.
pub(crate) fn build_worker(root: &Path, worker: &str, features: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root).args(["build", "--release", "-p", "weave-bench", "--bin", worker]);
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    let status = cmd.status().map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !status.success() {
        return Err(format!("building {worker} failed ({status})"));
    }
    Ok(())
}

/// Parses the JSON lines among a program's stdout lines (the others are ignored).
pub(crate) fn parse_results<'a>(
    who: &str,
    lines: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<SizeResult>, String> {
    lines
        .into_iter()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| SizeResult::parse(l).map_err(|e| format!("{who} printed an unreadable result line ({e}): {l}")))
        .collect()
}

/// Waits for `child` (`what`, in errors) to exit, killing it after `timeout` or once `token`
/// is cancelled.
pub(crate) fn wait_bounded(
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

/// `cmd` as a shell line, for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Receives both jobs' result lines while they run and prints each size's table line as soon as
/// every library has reported it (rank 0's other lines of weave go to stderr).
pub(crate) struct LiveTable {
    table: Table,
    weave: Vec<SizeResult>,
    mpi: Vec<SizeResult>,
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
    pub(crate) fn mpi_row(&mut self, row: SizeResult) {
        self.mpi.push(row);
        self.show();
    }

    fn line(&mut self, line: &str) {
        let result = split_rank_prefix(line).filter(|(rank, text)| *rank == 0 && text.starts_with('{'));
        let Some((_, text)) = result else {
            eprintln!("{line}");
            return;
        };
        match SizeResult::parse(text) {
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
) -> Result<Vec<SizeResult>, String> {
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
    let rows = parse_results("bench-worker", stdout.iter().map(String::as_str))?;
    if rows.len() != a.sizes().len() {
        return Err(format!("bench-worker reported {} sizes, expected {}", rows.len(), a.sizes().len()));
    }
    Ok(rows)
}

/// The benchmark on host memory: one run (on namespace nodes with `--nodes`), or the world-size
/// sweep.
pub(crate) fn bench(a: &BenchArgs, root: &Path, target: &Path, token: &CancelToken) -> Result<ExitCode, String> {
    // First, so that a host without namespaces fails before any build; on the main thread,
    // which the nodes' holder processes die with.
    if !a.world_sizes().is_empty() {
        return sweep(a, root, target, token);
    }
    let nodes = match a.nodes {
        Some(n) => Some(BenchNodes::make(n as usize, a.ranks() as usize, a.rate, &target.join("weave-bench"))?),
        None => None,
    };
    let code = bench_on(a, root, target, token, nodes.as_ref()).map(|(code, _)| code);
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
    for (i, &ranks) in a.world_sizes().iter().enumerate() {
        let run =
            BenchArgs { ranks: Some(ranks as u64), no_build: a.no_build || i > 0, ranks_sweep: None, ..a.clone() };
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
        sweep::JOB_CALLS,
        a.min_bytes()
    );
    println!("{}", sweep::table(&runs));
    Ok(code)
}

/// The whole job at `a.ranks` ranks, weave's and then (with `--vs-mpi`) Open MPI's, each
/// alone: start the ranks, create the communicator, make [`sweep::JOB_CALLS`] calls of
/// the smallest size without turns or checks, exit; each timed from start to the last exit.
fn job_walls(a: &BenchArgs, target: &Path, token: &CancelToken) -> Result<sweep::JobWalls, String> {
    let job = BenchArgs {
        max_bytes: Some(a.min_bytes()),
        iters: sweep::JOB_CALLS,
        warmup: 0,
        rounds: 1,
        check: false,
        no_check: true,
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
    let weave_create =
        parse_results("bench-worker", stdout.iter().map(String::as_str))?.first().and_then(|r| r.create_s);
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
                .args(job.mpi_args())
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
            let init = parse_results("mpi_bench", out.lines())?.first().and_then(|r| r.create_s);
            Some((wall, init))
        }
    };
    Ok(sweep::JobWalls { weave, weave_create, mpi: mpi.map(|m| m.0), mpi_init: mpi.and_then(|m| m.1) })
}

/// [`bench()`] for host memory, on `nodes` when given; returns the exit status and the rows
/// (weave's, with Open MPI's beside them when it ran).
fn bench_on(
    a: &BenchArgs,
    root: &Path,
    target: &Path,
    token: &CancelToken,
    nodes: Option<&BenchNodes>,
) -> Result<(ExitCode, sweep::Joined), String> {
    // Find MPI before spending time on a build.
    let mpi_tools = if a.vs_mpi { Some(mpi_tools()?) } else { None };
    if !a.no_build {
        build_worker(root, "bench-worker", &[])?;
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
        None => format!("{} ranks (shared memory)", a.ranks()),
    };
    println!("# weave bench: {}", a.describe(&placement));
    println!(
        "# {} batches of {} warm-up + {} timed calls per size{}; time = median over timed calls of the slowest rank; check: {}",
        a.rounds,
        a.warmup,
        a.iters,
        if a.vs_mpi { ", alternating weave and Open MPI batch by batch" } else { "" },
        if a.check() { "every call" } else { "off" },
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
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<Vec<SizeResult>, String>>| {
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

    let joined: sweep::Joined = rows
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
            Series { name: "weave".into(), points: joined.iter().map(|(r, _)| (r.bytes as f64, r.busbw)).collect() };
        let mut series = vec![weave];
        if a.vs_mpi {
            let points = joined.iter().filter_map(|(_, m)| m.as_ref().map(|m| (m.bytes as f64, m.busbw))).collect();
            series.push(Series { name: "Open MPI".into(), points });
        }
        let title = match a.nodes {
            Some(n) => format!("{} on {n} nodes x {} ranks (host memory)", a.op.name(), a.ranks()),
            None => format!("{} on {} ranks (host memory)", a.op.name(), a.ranks()),
        };
        write_plot(path, &title, &series)?;
    }
    if let Some(path) = &a.json {
        let text: String = joined.iter().map(|(r, m)| format!("{}\n", joined_line(r, m.as_ref()))).collect();
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

/// One line of `--json`: weave's result of a size, and Open MPI's beside it.
#[derive(Serialize)]
struct JoinedLine<'a> {
    #[serde(flatten)]
    weave: &'a SizeResult,
    #[serde(flatten)]
    mpi: Option<MpiColumns>,
}

/// Open MPI's result of a size in a [`JoinedLine`].
#[derive(Serialize)]
struct MpiColumns {
    mpi_time_us: f64,
    mpi_algbw: f64,
    mpi_busbw: f64,
    mpi_wrong: Option<u64>,
    mpi_shared_cpu: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    mpi_create_s: Option<f64>,
}

/// The `--json` line of weave's result `r` and Open MPI's `mpi` of the same size.
fn joined_line(r: &SizeResult, mpi: Option<&SizeResult>) -> String {
    let mpi = mpi.map(|m| MpiColumns {
        mpi_time_us: m.time_us,
        mpi_algbw: m.algbw,
        mpi_busbw: m.busbw,
        mpi_wrong: m.wrong,
        mpi_shared_cpu: m.shared_cpu,
        mpi_create_s: m.create_s,
    });
    serde_json::to_string(&JoinedLine { weave: r, mpi }).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use collectives::Collective;

    use super::*;

    #[test]
    fn result_lines_and_rank_prefixes() {
        assert_eq!(split_rank_prefix("[rank 0] {\"a\":1}"), Some((0, "{\"a\":1}")));
        assert_eq!(split_rank_prefix("[rank 12] hello"), Some((12, "hello")));
        assert_eq!(split_rank_prefix("[rank x] hello"), None);
        assert_eq!(split_rank_prefix("plain"), None);
        let good = r#"{"op":"broadcast","bytes":8,"count":2,"dtype":"float","redop":"none","inplace":true,"ranks":2,"time_us":2,"algbw":0.004,"busbw":0.004,"wrong":0,"algorithm":"direct"}"#;
        let rows = parse_results("w", ["# a comment", good, "   ", good]).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].op, Collective::Broadcast);
        assert!(parse_results("w", ["{broken"]).unwrap_err().contains("unreadable result line"));
    }

    #[test]
    fn json_lines_carry_both_libraries() {
        let mut weave = SizeResult::new(Collective::AllReduce, 1024, 256, 2, 4.0);
        weave.wrong = Some(0);
        let mut mpi = SizeResult::new(Collective::AllReduce, 1024, 256, 2, 8.0);
        mpi.create_s = Some(0.5);
        let both: serde_json::Value = serde_json::from_str(&joined_line(&weave, Some(&mpi))).unwrap();
        assert_eq!(both["time_us"], 4.0);
        assert_eq!(both["mpi_time_us"], 8.0);
        assert_eq!(both["mpi_busbw"], mpi.busbw);
        assert_eq!(both["mpi_wrong"], serde_json::Value::Null);
        assert_eq!(both["mpi_create_s"], 0.5);
        assert!(both.get("create_s").is_none());
        let alone = joined_line(&weave, None);
        assert!(!alone.contains("mpi_") && alone.contains(r#""wrong":0"#), "{alone}");
    }
}
