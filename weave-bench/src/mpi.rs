//! The Open MPI baseline: `mpi_bench.c` (embedded here, compiled with `mpicc` under the target
//! directory) run with `mpirun` on the same ranks as weave's job, taking turns with it per
//! batch (see [`crate::turns`]), with the options that make it comparable: bound to cores
//! exactly when weave's ranks are, Open MPI's shared-memory transport on one host, and across
//! nodes the placement [`crate::nodes`] gives it.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use weave_launch::{CancelToken, OUTPUT_GRACE};

use crate::cli::BenchArgs;
use crate::host_run::{LiveTable, describe, parse_results, wait_bounded};
use crate::nodes::BenchNodes;
use crate::record::SizeResult;

/// Default mpirun options for Open MPI: run as root in containers, allow more ranks than
/// cores, bound to cores exactly when the weave ranks are, and Open MPI's shared-memory
/// transport (`vader` up to 4.x, `sm` from 5.0).
pub(crate) fn mpirun_defaults(open_mpi_major: Option<u32>, bind: bool) -> Vec<&'static str> {
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
pub(crate) fn open_mpi_major(version_text: &str) -> Option<u32> {
    let rest = &version_text[version_text.find("(Open MPI)")? + "(Open MPI)".len()..];
    rest.split_whitespace().next()?.split('.').next()?.parse().ok()
}

/// The baseline's source, written next to the build outputs and compiled with `mpicc`.
const MPI_BENCH_SOURCE: &str = include_str!("mpi_bench.c");

/// `name` looked up in `PATH` (or taken as is when it has a slash), if it is a file.
fn find_program(name: &OsString) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(p)).find(|c| c.is_file())
}

/// The MPI tools: `MPICC` / `MPIRUN` or `mpicc` / `mpirun` on `PATH`.
pub(crate) fn mpi_tools() -> Result<(PathBuf, PathBuf), String> {
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
pub(crate) fn build_mpi_bench(mpicc: &Path, dir: &Path) -> Result<PathBuf, String> {
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

/// Runs the Open MPI baseline (taking turns through `turns`), passing its result lines to
/// `live` as they come; returns its rows.
pub(crate) fn run_mpi(
    a: &BenchArgs,
    mpirun: &Path,
    bin: &Path,
    turns: &Path,
    live: Arc<Mutex<LiveTable>>,
    token: &CancelToken,
    nodes: Option<&BenchNodes>,
) -> Result<Vec<SizeResult>, String> {
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
    cmd.arg("-np").arg(a.total_ranks().to_string()).args(a.mpi_args()).arg(bin);
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
            if let Ok(row) = SizeResult::parse(line.trim()) {
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
    let rows = parse_results("mpi_bench", lines.iter().map(String::as_str))?;
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
fn check_mpi_placement(rows: &[SizeResult], nodes: usize) -> Result<(), String> {
    match rows.iter().find(|r| r.nodes != Some(nodes as u64)) {
        None => Ok(()),
        Some(r) => Err(format!(
            "Open MPI ran its ranks on {} host(s), not on the {nodes} nodes of this run: it placed \
             them against the hostfile's slots, so its times would not cross the network as weave's do \
             (look at mpirun's mapping options in weave-bench/src/nodes.rs)",
            r.nodes.map_or("an unreported number of".to_string(), |n| n.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_mpi_packed_onto_fewer_nodes_is_an_error() {
        let row = |nodes: &str| {
            SizeResult::parse(&format!(
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

    #[test]
    fn the_embedded_baseline_is_the_file_next_to_this_module() {
        assert!(MPI_BENCH_SOURCE.contains("MPI_Reduce_scatter_block"));
    }
}
