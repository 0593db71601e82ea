//! `cargo xtask loom`: the model-checked concurrency of the lock-free core — comm-core's loom
//! models (`comm_core::loom_models`, built with `--cfg loom`), each over every schedule within
//! its bound of preemptions.

use std::process::{Command, ExitCode};

use crate::args::{Arg, Args, UsageError};
use crate::gpu_bundle_cmd::workspace_root;

/// One line for the command list of `cargo xtask help`.
pub(crate) const SUMMARY: &str = "model-check the lock-free core with loom (FIFO, doorbell, semaphore, credits)";

/// The help text of `cargo xtask loom`.
pub(crate) const USAGE: &str = "\
usage: cargo xtask loom [MODEL...]

Builds comm-core with `--cfg loom` (the stable toolchain; into target/loom, so the ordinary
build is untouched) and runs its loom models (all, or those whose names contain a MODEL): the
trigger FIFO (two producers committing out of order; a ring of one slot over three laps; a
producer that waits until its trigger is processed), the doorbell (no lost wake-up with its
fence; without it loom must find the lost one), the semaphore (signals from two threads in
order; every signal taken once by a wait and a poll), and a link's slot credits (one and two
slots, credits one by one and in batches). Each explores every schedule with at most a few
preemptions, loads returning any value the memory model allows; a failed check, a data race or
a deadlock fails the command. About a minute after the build. `cargo xtask test` runs them.

options:
  -h, --help   print this help
";

/// Runs the command.
pub(crate) fn run(args: Args) -> ExitCode {
    let mut chosen = Vec::new();
    let read = crate::read_args(args, "loom", USAGE, |arg, _| {
        match arg {
            Arg::Flag(f) => return Err(UsageError(format!("unknown option {f:?}"))),
            Arg::Positional(p) => chosen.push(p.to_string_lossy().into_owned()),
            Arg::Separator => {}
        }
        Ok(())
    });
    if let Some(exit) = read {
        return exit;
    }
    match models(&chosen) {
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
