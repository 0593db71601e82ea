//! `cargo xtask sanitize`: the multi-process host matrix under AddressSanitizer — every rank a
//! `collectives-worker` built on the nightly toolchain with `-Zsanitizer=address` (heap, stack
//! and global overflows, use after free, leaks) — for each world size asked for, with both
//! algorithm families (the table's, then the channel family over links). A rank that the
//! sanitizer stops, or whose output holds a sanitizer report, fails the command.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use weave_launch::{LaunchSpec, RankExit};

use crate::gpu_bundle_cmd::workspace_root;

/// Runs the multi-process host matrix under AddressSanitizer (nightly).
///
/// Builds collectives-worker with AddressSanitizer (the nightly toolchain,
/// -Zsanitizer=address, into target/sanitize-address; the toolchain is installed with rustup
/// when missing), then runs the host correctness matrix as processes over shared memory for
/// each world size, once with the algorithm table's choices and once with the channel family. A
/// rank that fails, or that prints a sanitizer report (an overflow, a use after free, a leak),
/// fails the command; the report is printed. The build takes several minutes on two cores.
/// `cargo xtask test` runs it with 2 ranks (about 4 minutes).
#[derive(Debug, clap::Args)]
pub(crate) struct SanitizeArgs {
    /// World sizes, separated by commas
    #[arg(long, value_name = "N,...", default_value = "2,4", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    ranks: Vec<u32>,
}

/// The target triple the sanitized build names, so that build scripts and procedural macros
/// (built for the host without `--target`'s flags) are not instrumented.
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Runs `cargo xtask sanitize`.
pub(crate) fn run(a: &SanitizeArgs) -> ExitCode {
    let ranks: Vec<usize> = a.ranks.iter().map(|&n| n as usize).collect();
    match sanitize(&ranks) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("cargo xtask sanitize: {e}");
            ExitCode::from(1)
        }
    }
}

/// Builds the sanitized worker and runs the matrix for every world size; `Ok(false)` when a run
/// failed or the sanitizer reported something.
pub(crate) fn sanitize(ranks: &[usize]) -> Result<bool, String> {
    crate::fuzz_cmd::ensure_nightly()?;
    let root = workspace_root()?;
    let target_dir = root.join("target/sanitize-address");
    let status = Command::new("cargo")
        .args([
            "+nightly",
            "build",
            "--release",
            "-p",
            "weave-tests",
            "--bin",
            "collectives-worker",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTFLAGS", "-Zsanitizer=address")
        .current_dir(&root)
        .status()
        .map_err(|e| format!("run the sanitized build: {e}"))?;
    if !status.success() {
        return Err(format!("the sanitized build failed ({status})"));
    }
    let worker = target_dir.join(TARGET).join("release/collectives-worker");
    let mut clean = true;
    for &n in ranks {
        for family in ["table", "channel"] {
            clean &= run_matrix(&worker, n, family)?;
        }
    }
    Ok(clean)
}

/// One matrix job of `n` sanitized ranks; whether every rank passed without a report.
fn run_matrix(worker: &Path, n: usize, family: &str) -> Result<bool, String> {
    let spec = LaunchSpec::new(n, PathBuf::from(worker))
        .arg("matrix")
        .arg(family)
        .env("WEAVE_TIMEOUT", "120")
        // Sanitizer reports go to stderr, which the launcher captures; exit code 86 tells a
        // report apart from a failed check.
        .env("ASAN_OPTIONS", "detect_leaks=1:exitcode=86:abort_on_error=0")
        .timeout(Duration::from_secs(1800))
        .capture(true);
    let report = weave_launch::launch(&spec).map_err(|e| format!("launch the sanitized matrix: {e}"))?;
    let mut clean = true;
    for r in &report.ranks {
        let reported =
            r.stderr.iter().any(|l| l.contains("ERROR: AddressSanitizer") || l.contains("ERROR: LeakSanitizer"));
        if r.exit != RankExit::Code(0) || reported {
            clean = false;
            println!(
                "{n} ranks, {family}: rank {} ended {:?}{}",
                r.rank,
                r.exit,
                if reported { " with a sanitizer report" } else { "" }
            );
            for line in r.stderr.iter().take(60) {
                println!("    {line}");
            }
        }
    }
    if clean {
        let line = report.ranks.first().and_then(|r| r.stdout.iter().find(|l| l.starts_with("OK"))).cloned();
        println!("{n} ranks, {family}: clean under AddressSanitizer: {}", line.unwrap_or_default());
    }
    Ok(clean)
}
