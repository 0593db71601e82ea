//! `cargo xtask loom`: the model-checked concurrency of the lock-free core — comm-core's loom
//! models (`comm_core::loom_models`, built with `--cfg loom`), each over every schedule within
//! its bound of preemptions.

use std::process::{Command, ExitCode};

use crate::gpu_bundle_cmd::workspace_root;

/// Model-checks the lock-free core with loom (FIFO, doorbell, semaphore, credits).
///
/// Builds comm-core with `--cfg loom` (the stable toolchain; into target/loom, so the ordinary
/// build is untouched) and runs its loom models (all, or those whose names contain a MODEL):
/// the trigger FIFO (two producers committing out of order; a ring of one slot over three laps;
/// a producer that waits until its trigger is processed), the doorbell (no lost wake-up with
/// its fence; without it loom must find the lost one), the semaphore (signals from two threads
/// in order; every signal taken once by a wait and a poll), and a link's slot credits (one and
/// two slots, credits one by one and in batches). Each explores every schedule with at most a
/// few preemptions, loads returning any value the memory model allows; a failed check, a data
/// race or a deadlock fails the command. About a minute after the build. `cargo xtask test`
/// runs them.
#[derive(Debug, clap::Args)]
pub(crate) struct LoomArgs {
    /// Run only the models whose names contain one of these
    #[arg(value_name = "MODEL")]
    models: Vec<String>,
}

/// Runs `cargo xtask loom`.
pub(crate) fn run(a: &LoomArgs) -> ExitCode {
    match models(&a.models) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cargo xtask loom: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs the loom models whose names contain one of `chosen` (all when empty).
pub(crate) fn models(chosen: &[String]) -> Result<(), String> {
    let root = workspace_root()?;
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["test", "--release", "-p", "comm-core", "--lib", "--target-dir"])
        .arg(root.join("target/loom"))
        .arg("--")
        .args(["--test-threads", "1"])
        .current_dir(&root)
        .env("RUSTFLAGS", "--cfg loom")
        // The models set their own bounds; a bound from the caller's environment would change
        // what they explore.
        .env_remove("LOOM_MAX_PREEMPTIONS")
        .env_remove("LOOM_MAX_BRANCHES");
    if chosen.is_empty() {
        cmd.arg("loom_models::");
    } else {
        cmd.args(chosen.iter().map(|m| format!("loom_models::{m}")));
    }
    let status = cmd.status().map_err(|e| format!("could not run cargo: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("a loom model failed ({status})")) }
}
