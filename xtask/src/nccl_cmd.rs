//! `cargo xtask nccl`: builds weave's `libnccl.so.2` (crate `weave-nccl`) in release into
//! `<target>/nccl/`, and with `--check` verifies its exports, SONAME and C header.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Builds weave's libnccl.so.2 into target/nccl/ (--check: exports, SONAME, C smoke test).
///
/// Builds the weave-nccl crate in release and copies its cdylib to `<target>/nccl/libnccl.so.2`
/// (`<target>` is CARGO_TARGET_DIR or target/), with the link libnccl.so next to it and the
/// header in `<target>/nccl/include/nccl.h`. Use it with `LD_PRELOAD=<target>/nccl/libnccl.so.2`
/// (PyTorch) or `LD_LIBRARY_PATH=<target>/nccl` (programs linked against libnccl.so.2).
#[derive(Debug, clap::Args)]
pub(crate) struct NcclArgs {
    /// Also check that `nm -D --defined-only` lists every NCCL symbol PyTorch 2.11 and
    /// nccl-tests 2.19 import, that `readelf -d` shows SONAME libnccl.so.2, and compile (gcc)
    /// and run nccl/tests/c_smoke.c against it (no GPU needed)
    #[arg(long)]
    check: bool,
}

/// Every symbol PyTorch 2.11's libtorch_cuda.so imports (issue 16) plus those nccl-tests 2.19
/// calls when built against NCCL 2.28.
pub(crate) const REQUIRED_SYMBOLS: &[&str] = &[
    "ncclAllGather",
    "ncclAllReduce",
    "ncclAlltoAll",
    "ncclBcast",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommDeregister",
    "ncclCommDestroy",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommInitAll",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommRegister",
    "ncclCommShrink",
    "ncclCommSplit",
    "ncclCommUserRank",
    "ncclCommWindowDeregister",
    "ncclCommWindowRegister",
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclGather",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclGroupStart",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclScatter",
    "ncclSend",
];

fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root.join(d),
        _ => root.join("target"),
    }
}

/// Builds the library (with `env` added to cargo's environment) and copies it; returns
/// `<target>/nccl/libnccl.so.2`.
pub(crate) fn build(env: &[(&str, &str)]) -> Result<PathBuf, String> {
    let root = crate::gpu_bundle_cmd::workspace_root()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", "weave-nccl", "--lib"])
        .envs(env.iter().copied())
        .current_dir(&root)
        .status()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("`cargo build --release -p weave-nccl` failed ({status})"));
    }
    let target = target_dir(&root);
    let built = target.join("release").join("libnccl.so");
    let dir = target.join("nccl");
    fs::create_dir_all(dir.join("include")).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let lib = dir.join("libnccl.so.2");
    let _ = fs::remove_file(&lib);
    fs::copy(&built, &lib).map_err(|e| format!("copying {} to {}: {e}", built.display(), lib.display()))?;
    let link = dir.join("libnccl.so");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink("libnccl.so.2", &link).map_err(|e| format!("linking {}: {e}", link.display()))?;
    let header = root.join("nccl").join("include").join("nccl.h");
    fs::copy(&header, dir.join("include").join("nccl.h")).map_err(|e| format!("copying {}: {e}", header.display()))?;
    println!("nccl: {}", lib.display());
    Ok(lib)
}

fn output(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("could not run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The checks of `--check`; returns the failures.
fn check(lib: &Path) -> Result<Vec<String>, String> {
    let mut failures = Vec::new();
    let nm = output(Command::new("nm").args(["-D", "--defined-only"]).arg(lib), "nm -D --defined-only")?;
    let defined: Vec<&str> = nm.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    let missing: Vec<&&str> = REQUIRED_SYMBOLS.iter().filter(|s| !defined.contains(s)).collect();
    if missing.is_empty() {
        println!("nccl --check: pass: all {} required symbols exported", REQUIRED_SYMBOLS.len());
    } else {
        failures.push(format!("symbols not exported: {missing:?}"));
    }
    let readelf = output(Command::new("readelf").arg("-d").arg(lib), "readelf -d")?;
    if readelf.lines().any(|l| l.contains("(SONAME)") && l.contains("[libnccl.so.2]")) {
        println!("nccl --check: pass: SONAME libnccl.so.2");
    } else {
        failures.push("readelf -d shows no SONAME libnccl.so.2".into());
    }
    let root = crate::gpu_bundle_cmd::workspace_root()?;
    let dir = lib.parent().ok_or("library has no directory")?;
    let exe = dir.join("c_smoke");
    let compiled = Command::new("gcc")
        .args(["-Wall", "-Werror", "-std=c11", "-o"])
        .arg(&exe)
        .arg(root.join("nccl/tests/c_smoke.c"))
        .arg("-I")
        .arg(dir.join("include"))
        .arg("-L")
        .arg(dir)
        .arg("-lnccl")
        .status()
        .map_err(|e| format!("could not run gcc: {e}"))?;
    if !compiled.success() {
        failures.push(format!("gcc could not build nccl/tests/c_smoke.c against nccl.h ({compiled})"));
        return Ok(failures);
    }
    let ran = Command::new(&exe)
        .env("LD_LIBRARY_PATH", dir)
        .env("NCCL_DEBUG", "WARN")
        .env_remove("WEAVE_NCCL_ALLOW_CPU")
        .status()
        .map_err(|e| format!("could not run {}: {e}", exe.display()))?;
    if ran.success() {
        println!("nccl --check: pass: C smoke test (gcc, nccl.h, libnccl.so.2)");
    } else {
        failures.push(format!("the C smoke test failed ({ran})"));
    }
    Ok(failures)
}

/// Runs `cargo xtask nccl`.
pub(crate) fn run(a: &NcclArgs) -> ExitCode {
    let result = build(&[]).and_then(|lib| if a.check { check(&lib) } else { Ok(Vec::new()) });
    match result {
        Ok(f) if f.is_empty() => ExitCode::SUCCESS,
        Ok(f) => {
            for x in f {
                eprintln!("nccl --check: FAIL: {x}");
            }
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("cargo xtask nccl: {e}");
            ExitCode::from(1)
        }
    }
}
