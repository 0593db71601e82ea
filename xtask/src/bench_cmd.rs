//! `cargo xtask bench` and `cargo xtask scale-model`: the benchmark crate's binary,
//! `weave-bench` (weave-bench/), built in release and run with the arguments given, its exit
//! status passed on. Its options and method: `cargo xtask help bench`.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitCode};

/// The arguments `cargo xtask bench` and `scale-model` pass on to `weave-bench`, as given.
#[derive(Debug, clap::Args)]
pub(crate) struct Passed {
    /// weave-bench's options (`cargo xtask help bench`)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) args: Vec<OsString>,
}

/// Builds `weave-bench` in release (unless `--no-build` is among `args` and it is built) and
/// runs it with `command` and `args`.
pub(crate) fn forward(command: &[&str], args: Vec<OsString>) -> ExitCode {
    let root = match crate::gpu_bundle_cmd::workspace_root() {
        Ok(root) => root,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root.join(d),
        _ => root.join("target"),
    };
    let binary = target.join("release").join("weave-bench");
    let no_build = command.is_empty() && args.iter().any(|a| a == "--no-build");
    if !(no_build && binary.is_file())
        && let Err(e) = build(&root)
    {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    match Command::new(&binary).args(command).args(&args).status() {
        Ok(status) => ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: cannot run {}: {e}", binary.display());
            ExitCode::FAILURE
        }
    }
}

/// `cargo build --release -p weave-bench --bin weave-bench` in `root`.
fn build(root: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["build", "--release", "--quiet", "-p", "weave-bench", "--bin", "weave-bench"])
        .status()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !status.success() {
        return Err(format!("building weave-bench failed ({status})"));
    }
    Ok(())
}
