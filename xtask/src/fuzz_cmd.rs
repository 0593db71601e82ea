//! `cargo xtask fuzz`: runs the fuzz targets of `fuzz/` (cargo-fuzz, libFuzzer) for a while
//! each, from the seeds and corpora kept in the tree, and prints one line per target:
//! executions, coverage and the corpus size libFuzzer reported, or where the crashing input lies.
//!
//! libFuzzer needs the nightly toolchain (`-Zsanitizer=address`); the command installs it (with
//! rustup, minimal profile) and `cargo-fuzz` where they are missing.

use std::path::Path;
use std::process::{Command, ExitCode};

use crate::gpu_bundle_cmd::workspace_root;

/// Runs every fuzz target (cargo-fuzz, libFuzzer, nightly) for a while.
///
/// Checks that the seeds kept in fuzz/seeds are current, then runs each fuzz target of fuzz/
/// (all, or those named) for SECONDS with libFuzzer, from its seeds and its corpus
/// fuzz/corpus/TARGET (new inputs go there), with at most 256 MiB per allocation and 2 GiB in
/// all. Prints per target the executions, the coverage (edges and features) and the corpus
/// size; a target that crashes leaves its input in fuzz/artifacts/TARGET and fails the command.
/// Needs the nightly toolchain and cargo-fuzz; installs them (rustup, cargo install) when they
/// are missing. `cargo xtask test` runs every target for a few seconds.
#[derive(Debug, clap::Args)]
pub(crate) struct FuzzArgs {
    /// How long each target runs, in seconds
    #[arg(long = "time", value_name = "SECONDS", default_value = "60", value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// The targets to run (default: all)
    #[arg(value_name = "TARGET")]
    targets: Vec<String>,
}

/// Runs `cargo xtask fuzz`.
pub(crate) fn run(a: &FuzzArgs) -> ExitCode {
    match fuzz(a.seconds, &a.targets, true) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("cargo xtask fuzz: {e}");
            ExitCode::from(1)
        }
    }
}

/// The crates whose fuzz seeds (`fuzz/seeds/`) a unit test checks are current: each has a test
/// with `fuzz` in its name (`comm_core::testing::check_fuzz_seeds`).
const SEEDED: [&str; 7] =
    ["comm-core", "transport-tcp", "transport-ib", "transport-shm", "transport-cudaipc", "collectives", "weave-nccl"];

/// Runs the targets; `Ok(false)` when one of them found something. New inputs go into the
/// tree's corpora when `keep` holds, else into `target/fuzz-scratch` (a test run leaves the
/// tree as it was).
pub(crate) fn fuzz(seconds: u64, chosen: &[String], keep: bool) -> Result<bool, String> {
    let root = workspace_root()?;
    let dir = root.join("fuzz");
    ensure_tools()?;
    // The seeds kept in the corpora must be what the code makes now.
    let packages: Vec<&str> = SEEDED.iter().flat_map(|p| ["-p", p]).collect();
    let seeds = Command::new("cargo")
        .args(["test", "-q"])
        .args(&packages)
        .args(["--lib", "fuzz"])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("run the seed check: {e}"))?;
    if !seeds.success() {
        return Err(format!(
            "the seeds in fuzz/seeds are stale (cargo test {} --lib fuzz; WEAVE_BLESS=1 rewrites them)",
            packages.join(" ")
        ));
    }
    let listed = output(Command::new("cargo").args(["+nightly", "fuzz", "list"]).current_dir(&dir))?;
    let all: Vec<String> = listed.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    if let Some(unknown) = chosen.iter().find(|c| !all.contains(c)) {
        return Err(format!("no fuzz target {unknown:?}; the targets are {}", all.join(", ")));
    }
    let targets: Vec<&String> = all.iter().filter(|t| chosen.is_empty() || chosen.contains(t)).collect();
    let mut clean = true;
    for target in targets {
        let corpus = dir.join("corpus").join(target);
        let seeds = dir.join("seeds").join(target);
        let new_inputs = if keep { corpus.clone() } else { root.join("target/fuzz-scratch").join(target) };
        if !keep {
            let _ = std::fs::remove_dir_all(&new_inputs);
        }
        std::fs::create_dir_all(&new_inputs).map_err(|e| format!("create {}: {e}", new_inputs.display()))?;
        // libFuzzer reads every directory given and writes new inputs into the first.
        let mut read_too = vec![seeds];
        if !keep {
            read_too.insert(0, corpus);
        }
        let run = Command::new("cargo")
            .args(["+nightly", "fuzz", "run", "-O", target])
            .arg(&new_inputs)
            .args(read_too.iter().filter(|d| d.is_dir()))
            .args(["--", &format!("-max_total_time={seconds}"), "-rss_limit_mb=2048", "-malloc_limit_mb=256"])
            .current_dir(&dir)
            .output()
            .map_err(|e| format!("run cargo fuzz run {target}: {e}"))?;
        let log = String::from_utf8_lossy(&run.stderr);
        match (run.status.success(), final_stats(&log)) {
            (true, Some(stats)) => println!("{target}: no finding in {seconds} s; {stats}"),
            (true, None) => println!("{target}: ran, but libFuzzer printed no final statistics"),
            (false, _) => {
                clean = false;
                let tail: Vec<&str> = log.lines().rev().take(25).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                println!("{target}: FOUND SOMETHING (input in {}):\n{}", artifacts(&dir, target), tail.join("\n"));
            }
        }
    }
    Ok(clean)
}

/// libFuzzer's last status line (`#N DONE cov: … ft: … corp: … exec/s: …`), shortened.
fn final_stats(log: &str) -> Option<String> {
    let line = log.lines().rev().find(|l| l.starts_with('#') && l.contains("DONE"))?;
    let field = |name: &str| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == name).and_then(|_| words.next()).map(str::to_string)
    };
    let runs = line.split_whitespace().next()?.trim_start_matches('#').to_string();
    Some(format!(
        "{runs} executions ({} per second), coverage {} edges and {} features, corpus {}",
        field("exec/s:").unwrap_or_default(),
        field("cov:").unwrap_or_default(),
        field("ft:").unwrap_or_default(),
        field("corp:").unwrap_or_default()
    ))
}

/// Where cargo-fuzz leaves the crashing inputs of `target`.
fn artifacts(dir: &Path, target: &str) -> String {
    dir.join("artifacts").join(target).display().to_string()
}

/// The nightly toolchain (what the sanitizers need), installed with rustup when missing.
pub(crate) fn ensure_nightly() -> Result<(), String> {
    if output(Command::new("cargo").args(["+nightly", "--version"])).is_ok() {
        return Ok(());
    }
    eprintln!("cargo xtask: installing the nightly toolchain (rustup toolchain install nightly)");
    let status = Command::new("rustup")
        .args(["toolchain", "install", "nightly", "--profile", "minimal"])
        .status()
        .map_err(|e| format!("the sanitizers need the nightly toolchain, and rustup could not be run: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("rustup toolchain install nightly failed ({status})")) }
}

/// The nightly toolchain and cargo-fuzz, each installed when missing.
fn ensure_tools() -> Result<(), String> {
    ensure_nightly()?;
    if output(Command::new("cargo").args(["fuzz", "--version"])).is_ok() {
        return Ok(());
    }
    eprintln!("cargo xtask fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)");
    let status = Command::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .map_err(|e| format!("run cargo install cargo-fuzz: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo install cargo-fuzz failed ({status})")) }
}

/// The standard output of `command`, which must succeed.
fn output(command: &mut Command) -> Result<String, String> {
    let out = command.output().map_err(|e| format!("run {command:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{command:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
