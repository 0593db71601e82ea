//! `cargo xtask gpu-bundle`: builds the test binaries that need a GPU, in release, and packs
//! them with a runner script into `.gpu-bundle/`, to be carried to a GPU machine and run there.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// Builds the GPU test binaries into .gpu-bundle/ with a run.sh.
///
/// Builds in release every test binary of the packages that hold GPU tests (kernels,
/// transport-cudaipc, weave-tests; those not in the workspace are skipped), plus the binaries
/// named with --bin and the examples named with --example, and copies them into .gpu-bundle/
/// (emptied first) with run.sh, which: runs every test binary with --test-threads=1 (arguments
/// to run.sh are passed on), with LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH;
/// recreates the absolute paths that tests compiled in for their helper binaries
/// (env!("CARGO_BIN_EXE_...")) as links into the bundle, when those paths do not exist; appends
/// all output to $OUT/gpu-bundle.log when OUT is set; with WEAVE_BUNDLE_ONLY="NAME ...", runs
/// only those binaries (a bundle split over calls); on a host with one GPU, sets
/// WEAVE_TEST_SHARE_GPU=1 (the multi-rank GPU tests run with their ranks sharing it) and says
/// so; reads each binary's own closing line (`gpu: N passed, M failed, K skipped`, or libtest's
/// `test result:`) and prints one line per binary and `GPU bundle: N passed, M failed, K
/// skipped, E empty binaries; ... tests`: a binary none of whose tests ran counts as skipped,
/// never as passed (one without any test, as empty); exits non-zero unless every binary with
/// tests passed.
///
/// It also builds weave's libnccl.so.2 (cargo xtask nccl) into nccl/ with run-gpu-checks.sh,
/// torch_check.py and windows_check.py, and copies xtask itself into the bundle (the checks run `xtask multinode`);
/// run nccl/run-gpu-checks.sh there. With `NCCL_TESTS_SRC=<nccl-tests checkout or git dir>`
/// the nccl-tests source goes into nccl/nccl-tests/ and the script builds it.
/// Binaries are stripped of debug info (strip --strip-debug) unless --no-strip; the bundle's
/// total size is printed and must stay under 64 MiB (the device tool's limit).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub(crate) struct GpuBundleArgs {
    /// Also bundle the binary NAME (repeatable)
    #[arg(long = "bin", value_name = "NAME", value_parser = target_name)]
    bins: Vec<String>,
    /// Also bundle the example NAME (repeatable)
    #[arg(long = "example", value_name = "NAME", value_parser = target_name)]
    examples: Vec<String>,
    /// Compile the direct kernels for ARCHS (sm_XY[,sm_XY...]) into the binaries: every build
    /// runs with WEAVE_BUILD_KERNELS=1 and WEAVE_BUILD_KERNEL_ARCHS=ARCHS (NVRTC needed here,
    /// on LD_LIBRARY_PATH), so the GPU host compiles none at a first call; each binary that
    /// links the kernels grows by the CUBINs (12.7 MiB per architecture for sm_90)
    #[arg(long, value_name = "ARCHS", value_parser = architectures)]
    embed_kernels: Option<String>,
    /// Compile every kernel program the GPU tests use (the direct kernels and each channel
    /// kernel, sm_90) here into target/kernel-cache (NVRTC needed here, on LD_LIBRARY_PATH;
    /// kept between bundles) and pack it as kernel-cache.tar.xz beside kernel-cache.sh, which
    /// run.sh and nccl/run-gpu-checks.sh source: it unpacks the archive into
    /// ${TMPDIR:-/tmp}/weave-bundle-kernel-cache and points WEAVE_KERNEL_CACHE there unless it
    /// is set, so the GPU host's warm-up finds every program instead of compiling for minutes
    #[arg(long)]
    kernel_cache: bool,
    /// Keep debug info
    #[arg(long)]
    no_strip: bool,
}

/// A cargo target name: no path.
fn target_name(name: &str) -> Result<String, String> {
    if name.is_empty() || name.contains(['/', '\0']) {
        return Err(format!("expected a target name, got {name:?}"));
    }
    Ok(name.to_string())
}

/// `sm_XY[,sm_XY...]`.
fn architectures(archs: &str) -> Result<String, String> {
    let valid = |a: &str| a.strip_prefix("sm_").is_some_and(|d| d.len() >= 2 && d.bytes().all(|b| b.is_ascii_digit()));
    if !archs.split(',').all(valid) {
        return Err(format!("expected sm_XY[,sm_XY...], got {archs:?}"));
    }
    Ok(archs.to_string())
}

/// Packages whose test binaries go into the bundle.
const GPU_PACKAGES: &[&str] = &["kernels", "transport-cudaipc", "weave-tests"];

/// The bundle must stay below this (what the device tool carries).
const SIZE_LIMIT: u64 = 64 << 20;

/// The bundle directory, relative to the workspace root.
const BUNDLE_DIR: &str = ".gpu-bundle";

/// One executable cargo built, from a `compiler-artifact` JSON line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Artifact {
    /// Target name (`kernels`, `gpu_primitives`, `rank-worker`).
    pub(crate) name: String,
    /// Absolute path of the executable.
    pub(crate) executable: PathBuf,
    /// A test harness (unit or integration tests), as opposed to a plain binary.
    pub(crate) is_test: bool,
}

/// What the bundle reads of one line of `cargo --message-format=json` output.
#[derive(serde::Deserialize)]
struct CargoMessage {
    reason: String,
    target: Option<CargoTarget>,
    profile: Option<CargoProfile>,
    executable: Option<PathBuf>,
}

/// A message's `target`.
#[derive(serde::Deserialize)]
struct CargoTarget {
    name: String,
}

/// A message's `profile`.
#[derive(serde::Deserialize)]
struct CargoProfile {
    test: bool,
}

/// Parses one line of `cargo --message-format=json` output: an executable artifact, if it is one.
fn parse_artifact(line: &str) -> Option<Artifact> {
    let m: CargoMessage = serde_json::from_str(line).ok()?;
    if m.reason != "compiler-artifact" {
        return None;
    }
    Some(Artifact { name: m.target?.name, executable: m.executable?, is_test: m.profile?.test })
}

/// Runs cargo with `args` and JSON messages; returns the executable artifacts.
pub(crate) fn cargo_artifacts(args: &[String]) -> Result<Vec<Artifact>, String> {
    cargo_artifacts_with_env(args, &[])
}

/// [`cargo_artifacts`] with extra environment variables for cargo.
fn cargo_artifacts_with_env(args: &[String], env: &[(&str, &str)]) -> Result<Vec<Artifact>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .arg("--message-format=json")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("`cargo {}` failed ({})", args.join(" "), output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout).lines().filter_map(parse_artifact).collect())
}

/// Names of the workspace's packages.
fn workspace_packages() -> Result<BTreeSet<String>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args(["metadata", "--no-deps", "--format-version=1"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo metadata failed ({})", output.status));
    }
    #[derive(serde::Deserialize)]
    struct Metadata {
        packages: Vec<CargoTarget>,
    }
    let metadata: Metadata =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("cargo metadata printed no metadata: {e}"))?;
    Ok(metadata.packages.into_iter().map(|p| p.name).collect())
}

/// A file name for `a` in the bundle: the target name, made unique.
fn bundle_name(a: &Artifact, taken: &mut BTreeSet<String>) -> String {
    let base: String =
        a.name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    let base = if a.is_test && taken.contains(&base) { format!("{base}-tests") } else { base };
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

/// Single-quotes `s` for a POSIX shell.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The shell function of `run.sh` that judges one binary from its exit status and its own
/// closing line.
const VERDICT_SH: &str = r#"# A binary's verdict from its exit status and its own closing line: a custom harness's
# "NAME: N passed, M failed, K skipped" or libtest's "test result: ok. N passed; M failed; ...".
# A binary none of whose tests ran (all skipped, or every passing test said SKIPPED) is skipped,
# never passed; one without any test is empty. Prints "VERDICT PASSED FAILED SKIPPED".
verdict() {
  local rc=$1 out=$2 line p f s said
  line=$(grep -E '^([a-z_]+: [0-9]+ passed, [0-9]+ failed|test result: )' "$out" | tail -n 1)
  if [[ $line =~ ^[a-z_]+:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)? ]]; then
    p=${BASH_REMATCH[1]}; f=${BASH_REMATCH[2]}; s=${BASH_REMATCH[4]:-0}
  elif [[ $line =~ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
    p=${BASH_REMATCH[1]}; f=${BASH_REMATCH[2]}
    said=$(grep -c 'SKIPPED' "$out" || true); s=$((said < p ? said : p)); p=$((p - s))
  else
    echo "failed 0 0 0"; return
  fi
  if [ "$rc" -ne 0 ] || [ "$f" -gt 0 ]; then echo "failed $p $f $s"
  elif [ "$p" -eq 0 ] && [ "$s" -eq 0 ]; then echo "empty $p $f $s"
  elif [ "$p" -eq 0 ]; then echo "skipped $p $f $s"
  else echo "passed $p $f $s"; fi
}
"#;

/// The runner script for the bundle: `tests` are bundled test binaries, `links` are
/// (bundled name, absolute path compiled into the tests).
fn run_script(tests: &[String], links: &[(String, String)]) -> String {
    let mut s = String::from(
        r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-bundle`: runs every bundled test binary on a GPU machine.
# Arguments are passed to every test binary. Output is appended to $OUT/gpu-bundle.log when
# OUT is set. Exit status 0 only when every binary passed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LOG=/dev/null
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && LOG="$OUT/gpu-bundle.log" && : >"$LOG"; fi

# Kernels compiled where the bundle was built (gpu-bundle --kernel-cache).
if [ -f kernel-cache.sh ]; then . ./kernel-cache.sh; fi

# Tests find their helper binaries at the absolute paths cargo compiled in.
link() {
  if [ ! -e "$2" ]; then mkdir -p "$(dirname "$2")" && ln -s "$HERE/$1" "$2"; fi
}
"#,
    );
    for (name, path) in links {
        let _ = writeln!(s, "link {} {}", shell_quote(name), shell_quote(path));
    }
    s.push('\n');
    s.push_str(VERDICT_SH);
    s.push_str(
        r#"
# One GPU: the multi-rank GPU tests run with their ranks sharing it (rank r on device r % 1).
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
shared=""
if [ "${gpus:-0}" -eq 1 ] && [ -z "${WEAVE_TEST_SHARE_GPU:-}" ]; then
  export WEAVE_TEST_SHARE_GPU=1
  shared=" (one GPU: multi-rank tests ran with their ranks sharing it, WEAVE_TEST_SHARE_GPU=1)"
  echo "GPU bundle: one GPU here; the multi-rank GPU tests run with their ranks sharing it" | tee -a "$LOG"
fi

passed=0; failed=0; skipped=0; empty=0; tests_passed=0; tests_failed=0; tests_skipped=0; lines=""
run() {
  local name=$1; shift
  # WEAVE_BUNDLE_ONLY="a b": only those binaries (to split a bundle over several calls).
  if [ -n "${WEAVE_BUNDLE_ONLY:-}" ] && [[ " $WEAVE_BUNDLE_ONLY " != *" $name "* ]]; then return; fi
  local out; out=$(mktemp)
  echo "=== $name" | tee -a "$LOG"
  local start=$SECONDS
  # The fuzz seed checks read the source tree, which a GPU host does not have; they run where
  # it is (cargo xtask test). One token: the custom harnesses ignore every argument that starts
  # with a dash, and take any other as a name filter.
  "./$name" --test-threads=1 --skip=fuzzing:: "$@" 2>&1 | tee "$out" | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - start))
  local v p f s
  read -r v p f s < <(verdict "$rc" "$out")
  tests_passed=$((tests_passed + p)); tests_failed=$((tests_failed + f)); tests_skipped=$((tests_skipped + s))
  local counts="$p passed, $f failed, $s skipped"
  case $v in
    failed) failed=$((failed + 1)); lines+="  FAILED  $name (exit $rc, $counts, ${took}s)"$'\n' ;;
    skipped) skipped=$((skipped + 1)); lines+="  SKIPPED $name ($counts: nothing ran)"$'\n' ;;
    empty) empty=$((empty + 1)); lines+="  empty   $name (a binary without tests)"$'\n' ;;
    *) passed=$((passed + 1)); lines+="  passed  $name ($counts, ${took}s)"$'\n' ;;
  esac
  rm -f "$out"
}
"#,
    );
    for t in tests {
        let _ = writeln!(s, "run {} \"$@\"", shell_quote(t));
    }
    s.push_str(
        r#"
{
  echo
  printf '%s' "$lines"
  echo "GPU bundle: $passed passed, $failed failed, $skipped skipped, $empty empty binaries;" \
    "$tests_passed passed, $tests_failed failed, $tests_skipped skipped tests$shared"
} | tee -a "$LOG"
[ "$failed" -eq 0 ] && [ "$skipped" -eq 0 ]
"#,
    );
    s
}

fn human(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn build_bundle(args: &GpuBundleArgs) -> Result<(), String> {
    let root = workspace_root()?;
    let present = workspace_packages()?;
    let mut packages = Vec::new();
    for p in GPU_PACKAGES {
        if present.contains(*p) {
            packages.push(*p);
        } else {
            println!("gpu-bundle: package {p} is not in this workspace; skipping it");
        }
    }
    // Release builds embed kernels by default where NVRTC loads (kernels/build.rs): 12.7 MiB per
    // architecture in every binary would not fit the bundle, so only --embed-kernels does.
    let env: Vec<(&str, &str)> = match &args.embed_kernels {
        Some(archs) => vec![("WEAVE_BUILD_KERNELS", "1"), ("WEAVE_BUILD_KERNEL_ARCHS", archs.as_str())],
        None => vec![("WEAVE_BUILD_KERNELS", "0")],
    };
    let cargo_artifacts = |cargo_args: &[String]| cargo_artifacts_with_env(cargo_args, &env);
    let mut artifacts = Vec::new();
    if !packages.is_empty() {
        let mut cargo_args: Vec<String> = ["test", "--release", "--no-run"].map(String::from).to_vec();
        for p in &packages {
            cargo_args.extend(["-p".to_string(), p.to_string()]);
        }
        artifacts.extend(cargo_artifacts(&cargo_args)?);
    }
    // The binaries, then the examples, each built by name and all found among what cargo built.
    for (flag, kind, names) in [("--bin", "binary", &args.bins), ("--example", "example", &args.examples)] {
        if names.is_empty() {
            continue;
        }
        let mut cargo_args: Vec<String> = ["build", "--release"].map(String::from).to_vec();
        for name in names {
            cargo_args.extend([flag.to_string(), name.clone()]);
        }
        let built = cargo_artifacts(&cargo_args)?;
        for name in names {
            if !built.iter().any(|a| !a.is_test && &a.name == name) {
                return Err(format!("cargo built no {kind} named {name:?}"));
            }
        }
        artifacts.extend(built);
    }
    let mut seen = BTreeSet::new();
    artifacts.retain(|a| seen.insert(a.executable.clone()));
    // Plain binaries first, so they keep their own names (tests of the same name get `-tests`);
    // then by name and path, so that targets of one name in several packages get the same
    // bundle names build after build (cargo reports artifacts in the order they finish).
    artifacts.sort_by(|a, b| (a.is_test, &a.name, &a.executable).cmp(&(b.is_test, &b.name, &b.executable)));
    if artifacts.is_empty() {
        return Err("nothing to bundle".into());
    }

    let dir = root.join(BUNDLE_DIR);
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let (mut taken, mut tests, mut links) = (BTreeSet::new(), Vec::new(), Vec::new());
    taken.insert("run.sh".to_string());
    let mut total = 0u64;
    for a in &artifacts {
        let name = bundle_name(a, &mut taken);
        let dst = dir.join(&name);
        fs::copy(&a.executable, &dst).map_err(|e| format!("copying {}: {e}", a.executable.display()))?;
        if !args.no_strip {
            match Command::new("strip").arg("--strip-debug").arg(&dst).status() {
                Ok(s) if s.success() => {}
                Ok(s) => println!("gpu-bundle: strip {name} failed ({s}); keeping it unstripped"),
                Err(e) => println!("gpu-bundle: could not run strip ({e}); keeping {name} unstripped"),
            }
        }
        let size = fs::metadata(&dst).map(|m| m.len()).unwrap_or(0);
        total += size;
        println!("  {:<8} {name} ({})", if a.is_test { "test" } else { "binary" }, human(size));
        if a.is_test {
            tests.push(name);
        } else {
            links.push((name, a.executable.to_string_lossy().into_owned()));
        }
    }
    total += bundle_nccl(&root, &dir, !args.no_strip, &env)?;
    if args.kernel_cache {
        let worker = links.iter().find(|(name, _)| name == "gpu-worker").map(|(name, _)| dir.join(name));
        let worker = worker.ok_or("--kernel-cache needs the gpu-worker binary, which this build did not make")?;
        total += bundle_kernel_cache(&root, &dir, &worker)?;
    }
    let script = dir.join("run.sh");
    fs::write(&script, run_script(&tests, &links)).map_err(|e| format!("writing {}: {e}", script.display()))?;
    set_executable(&script)?;
    total += fs::metadata(&script).map(|m| m.len()).unwrap_or(0);
    println!(
        "gpu-bundle: {} test binaries, {} other binaries in {}; total {}",
        tests.len(),
        links.len(),
        dir.display(),
        human(total)
    );
    if total >= SIZE_LIMIT {
        return Err(format!("the bundle is {}, over the {} the device tool carries", human(total), human(SIZE_LIMIT)));
    }
    if total >= SIZE_LIMIT / 4 * 3 {
        println!("gpu-bundle: warning: the bundle is close to the {} limit", human(SIZE_LIMIT));
    }
    Ok(())
}

/// The name of the packed kernel cache in the bundle.
const KERNEL_CACHE_ARCHIVE: &str = "kernel-cache.tar.xz";

/// `kernel-cache.sh`, beside the archive: sourced by `run.sh` and `nccl/run-gpu-checks.sh`.
const KERNEL_CACHE_SCRIPT: &str = r#"# Generated by `cargo xtask gpu-bundle --kernel-cache`; sourced by run.sh and
# nccl/run-gpu-checks.sh. Unpacks the kernels compiled where the bundle was built and points
# WEAVE_KERNEL_CACHE at them, unless the caller chose a cache of its own. The directory and
# its entries are this user's alone (weave loads nothing else from a cache).
if [ -z "${WEAVE_KERNEL_CACHE:-}" ]; then
  export WEAVE_KERNEL_CACHE="${TMPDIR:-/tmp}/weave-bundle-kernel-cache-$(id -u)"
  mkdir -p -m 700 "$WEAVE_KERNEL_CACHE" &&
    tar -xJf "$(dirname "${BASH_SOURCE[0]}")/kernel-cache.tar.xz" -C "$WEAVE_KERNEL_CACHE" --no-same-owner \
      --no-same-permissions
fi
"#;

/// Compiles every kernel program of the GPU tests into `<root>/target/kernel-cache` with the
/// bundled `worker` (`gpu-worker precompile EXPORT_DIR`, which also copies their entries into a
/// fresh directory), packs that directory into `<bundle>/kernel-cache.tar.xz` and writes
/// `<bundle>/kernel-cache.sh`. Returns the bytes added.
fn bundle_kernel_cache(root: &Path, dir: &Path, worker: &Path) -> Result<u64, String> {
    let cache = root.join("target").join("kernel-cache");
    let export = root.join("target").join("kernel-cache-export");
    if export.exists() {
        fs::remove_dir_all(&export).map_err(|e| format!("removing {}: {e}", export.display()))?;
    }
    println!("gpu-bundle: compiling the GPU tests' kernels into {} (minutes on a cold cache)", cache.display());
    let out = Command::new(worker)
        .arg("precompile")
        .arg(&export)
        .env("WEAVE_KERNEL_CACHE", &cache)
        .output()
        .map_err(|e| format!("could not run {}: {e}", worker.display()))?;
    if !out.status.success() {
        return Err(format!(
            "compiling the kernels here failed ({}): {}{}\n(--kernel-cache needs NVRTC here: put the lib \
             directory of a libnvrtc.so.13 on LD_LIBRARY_PATH; .ci/run installs one with pip)",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    println!("  {}", String::from_utf8_lossy(&out.stdout).trim());
    let archive = dir.join(KERNEL_CACHE_ARCHIVE);
    let packed = Command::new("tar").arg("-cJf").arg(&archive).arg("-C").arg(&export).arg(".").status();
    if !matches!(packed, Ok(s) if s.success()) {
        return Err(format!("packing {} into {} failed ({packed:?})", export.display(), archive.display()));
    }
    let _ = fs::remove_dir_all(&export);
    let script = dir.join("kernel-cache.sh");
    fs::write(&script, KERNEL_CACHE_SCRIPT).map_err(|e| format!("writing {}: {e}", script.display()))?;
    let size = fs::metadata(&archive).map(|m| m.len()).unwrap_or(0) + KERNEL_CACHE_SCRIPT.len() as u64;
    println!("  cache    {KERNEL_CACHE_ARCHIVE} ({})", human(size));
    Ok(size)
}

/// Builds weave's libnccl.so.2 (`cargo xtask nccl`) and copies it with its GPU-host checks
/// into `<bundle>/nccl/`; with `NCCL_TESTS_SRC` set (a checkout, or a git directory whose
/// HEAD is exported), the nccl-tests source too. Returns the bytes added.
fn bundle_nccl(root: &Path, dir: &Path, strip: bool, env: &[(&str, &str)]) -> Result<u64, String> {
    let lib = crate::nccl_cmd::build(env)?;
    let out = dir.join("nccl");
    fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let dst = out.join("libnccl.so.2");
    fs::copy(&lib, &dst).map_err(|e| format!("copying {}: {e}", lib.display()))?;
    if strip {
        let _ = Command::new("strip").arg("--strip-debug").arg(&dst).status();
    }
    for f in ["run-gpu-checks.sh", "torch_check.py", "windows_check.py"] {
        fs::copy(root.join("nccl").join(f), out.join(f)).map_err(|e| format!("copying nccl/{f}: {e}"))?;
    }
    set_executable(&out.join("run-gpu-checks.sh"))?;
    // This very program, for the checks' `xtask multinode` (device buffers across nodes).
    let me = std::env::current_exe().map_err(|e| format!("finding the xtask binary: {e}"))?;
    fs::copy(&me, dir.join("xtask")).map_err(|e| format!("copying {}: {e}", me.display()))?;
    if strip {
        let _ = Command::new("strip").arg("--strip-debug").arg(dir.join("xtask")).status();
    }
    if let Some(src) = std::env::var_os("NCCL_TESTS_SRC").map(PathBuf::from) {
        let tests = out.join("nccl-tests");
        fs::create_dir_all(&tests).map_err(|e| format!("creating {}: {e}", tests.display()))?;
        let script = "if git -C \"$1\" rev-parse HEAD >/dev/null 2>&1; then git -C \"$1\" archive HEAD | tar -x -C \"$2\"; \
                      else tar --exclude=.git -C \"$1\" -cf - . | tar -x -C \"$2\"; fi";
        let ok = Command::new("sh").args(["-c", script, "sh"]).arg(&src).arg(&tests).status();
        if !matches!(ok, Ok(s) if s.success()) {
            return Err(format!("could not copy the nccl-tests source from {}", src.display()));
        }
        println!("  nccl-tests source from {}", src.display());
    }
    let size = dir_size(&out) + fs::metadata(dir.join("xtask")).map(|m| m.len()).unwrap_or(0);
    println!(
        "  nccl     nccl/ (libnccl.so.2, run-gpu-checks.sh, torch_check.py, windows_check.py) and xtask ({})",
        human(size)
    );
    Ok(size)
}

fn dir_size(p: &Path) -> u64 {
    match fs::metadata(p) {
        Ok(m) if m.is_dir() => {
            fs::read_dir(p).map(|rd| rd.filter_map(|e| e.ok()).map(|e| dir_size(&e.path())).sum()).unwrap_or(0)
        }
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).map_err(|e| format!("chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<(), String> {
    Ok(())
}

/// The workspace root: the parent of xtask's manifest directory.
pub(crate) fn workspace_root() -> Result<PathBuf, String> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).ok_or_else(|| "xtask has no parent directory".to_string())
}

/// Runs `cargo xtask gpu-bundle`.
pub(crate) fn run(args: &GpuBundleArgs) -> ExitCode {
    match build_bundle(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cargo xtask gpu-bundle: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_LINE: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/kernels#0.1.0","manifest_path":"/w/kernels/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"gpu_primitives","src_path":"/w/kernels/tests/gpu_primitives.rs","edition":"2024","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":1,"debug_assertions":false,"overflow_checks":false,"test":true},"features":[],"filenames":["/w/target/release/deps/gpu_primitives-0123"],"executable":"/w/target/release/deps/gpu_primitives-0123","fresh":true}"#;
    const BIN_LINE: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests#0.1.0","target":{"kind":["bin"],"crate_types":["bin"],"name":"rank-worker","src_path":"/w/tests/src/bin/rank-worker.rs","test":true},"profile":{"opt_level":"3","debuginfo":1,"test":false},"features":[],"filenames":["/w/target/release/rank-worker"],"executable":"/w/target/release/rank-worker","fresh":false}"#;
    const LIB_LINE: &str = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"comm_core","test":true},"profile":{"test":false},"filenames":["/w/target/release/deps/libcomm_core.rlib"],"executable":null,"fresh":true}"#;

    #[test]
    fn artifacts_are_parsed_from_cargo_json() {
        assert_eq!(
            parse_artifact(TEST_LINE),
            Some(Artifact {
                name: "gpu_primitives".into(),
                executable: "/w/target/release/deps/gpu_primitives-0123".into(),
                is_test: true
            })
        );
        assert_eq!(
            parse_artifact(BIN_LINE),
            Some(Artifact {
                name: "rank-worker".into(),
                executable: "/w/target/release/rank-worker".into(),
                is_test: false
            })
        );
        assert_eq!(parse_artifact(LIB_LINE), None, "no executable");
        assert_eq!(parse_artifact(r#"{"reason":"build-finished","success":true}"#), None);
        assert_eq!(parse_artifact("not json at all"), None);
    }

    #[test]
    fn the_workspace_packages_come_from_cargo_metadata() {
        let packages = workspace_packages().unwrap();
        for p in GPU_PACKAGES.iter().chain(&["xtask", "weave-bench"]) {
            assert!(packages.contains(*p), "{p} missing from {packages:?}");
        }
    }

    #[test]
    fn bundle_names_are_unique() {
        let mut taken = BTreeSet::from(["run.sh".to_string()]);
        let t = |name: &str, is_test| Artifact { name: name.into(), executable: PathBuf::new(), is_test };
        assert_eq!(bundle_name(&t("kernels", true), &mut taken), "kernels");
        assert_eq!(bundle_name(&t("rank-worker", false), &mut taken), "rank-worker");
        assert_eq!(bundle_name(&t("rank-worker", true), &mut taken), "rank-worker-tests");
        assert_eq!(bundle_name(&t("kernels", true), &mut taken), "kernels-tests");
        assert_eq!(bundle_name(&t("kernels", true), &mut taken), "kernels-tests-2");
        assert_eq!(bundle_name(&t("a b", true), &mut taken), "a_b");
    }

    #[test]
    fn run_script_runs_every_test_and_links_helpers() {
        let s = run_script(&["kernels".into(), "gpu_primitives".into()], &[("rank-worker".into(), "/w/it's".into())]);
        assert!(s.starts_with("#!/usr/bin/env bash\n"));
        assert!(s.contains("run 'kernels' \"$@\"\nrun 'gpu_primitives' \"$@\"\n"));
        assert!(s.contains("link 'rank-worker' '/w/it'\\''s'\n"));
        assert!(s.contains("--test-threads=1"));
        assert!(s.contains("LD_LIBRARY_PATH=/usr/local/cuda/lib64"));
        assert!(s.contains("if [ -f kernel-cache.sh ]; then . ./kernel-cache.sh; fi"));
        assert!(KERNEL_CACHE_SCRIPT.contains("/kernel-cache.tar.xz\" -C \"$WEAVE_KERNEL_CACHE\""));
        assert!(s.contains("GPU bundle: $passed passed, $failed failed, $skipped skipped, $empty empty binaries;"));
    }

    /// Runs `run.sh`'s verdict on a binary's exit status and output.
    fn verdict(rc: i32, output: &str) -> String {
        let dir = std::env::temp_dir().join(format!("weave-verdict-{}-{rc}-{}", std::process::id(), output.len()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("out"), output).unwrap();
        let script = format!("{VERDICT_SH}verdict {rc} out\n");
        let result = Command::new("bash").arg("-c").arg(script).current_dir(&dir).output().unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
        String::from_utf8(result.stdout).unwrap().trim().to_string()
    }

    #[test]
    fn a_binary_whose_tests_all_skipped_is_skipped_and_never_passed() {
        let harness_skipped =
            "test a ... SKIPPED\nSKIPPED: 1 GPU(s); these tests need 2\ngpu: 0 passed, 0 failed, 7 skipped\n";
        assert_eq!(verdict(0, harness_skipped), "skipped 0 0 7");
        assert_eq!(verdict(0, "test a ... ok\ngpu: 5 passed, 0 failed, 0 skipped\n"), "passed 5 0 0");
        assert_eq!(verdict(0, "gpu: 5 passed, 0 failed\n"), "passed 5 0 0", "the older summary");
        assert_eq!(verdict(1, "gpu_primitives: 3 passed, 1 failed, 0 skipped\n"), "failed 3 1 0");
        assert_eq!(verdict(0, "gpu_primitives: 0 passed, 0 failed, 9 skipped\n"), "skipped 0 0 9");
        let libtest = "running 4 tests\ntest result: ok. 4 passed; 0 failed; 1 ignored; 0 measured\n";
        assert_eq!(verdict(0, libtest), "passed 4 0 0");
        let libtest_saying_skipped =
            "SKIPPED: no NVRTC\nSKIPPED: no NVRTC\ntest result: ok. 2 passed; 0 failed; 0 ignored\n";
        assert_eq!(verdict(0, libtest_saying_skipped), "skipped 0 0 2");
        let one_said_it_on_its_line =
            "test a ... ok\ntest b ... SKIPPED: no compiler\ntest result: ok. 2 passed; 0 failed\n";
        assert_eq!(verdict(0, one_said_it_on_its_line), "passed 1 0 1");
        assert_eq!(verdict(0, "no closing line at all\n"), "failed 0 0 0");
        assert_eq!(verdict(0, "running 0 tests\ntest result: ok. 0 passed; 0 failed; 0 ignored\n"), "empty 0 0 0");
        assert_eq!(verdict(101, "test result: FAILED. 1 passed; 1 failed; 0 ignored\n"), "failed 1 1 0");
        assert_eq!(verdict(139, "gpu: 2 passed, 0 failed, 0 skipped\n"), "failed 2 0 0", "a crash after the summary");
    }

    #[test]
    fn arguments() {
        use clap::Parser;

        #[derive(Parser)]
        struct Line {
            #[command(flatten)]
            a: GpuBundleArgs,
        }
        let parse = |line: &[&str]| {
            Line::try_parse_from(std::iter::once("gpu-bundle").chain(line.iter().copied())).map(|l| l.a)
        };
        let e = parse(&["--example", "gpu_train_step", "--embed-kernels", "sm_90,sm_100"]).unwrap();
        assert_eq!(e.examples, ["gpu_train_step"]);
        assert_eq!(e.embed_kernels.as_deref(), Some("sm_90,sm_100"));
        assert!(parse(&["--embed-kernels", "compute_90"]).is_err());
        assert!(parse(&["--embed-kernels", "sm_90,"]).is_err());
        assert!(parse(&["--kernel-cache"]).unwrap().kernel_cache);
        let a = parse(&["--bin", "x", "--bin=y", "--no-strip"]).unwrap();
        assert_eq!((a.bins, a.no_strip, a.kernel_cache), (vec!["x".to_string(), "y".into()], true, false));
        assert!(parse(&["--bin"]).is_err());
        assert!(parse(&["--bin", "a/b"]).is_err());
        assert!(parse(&["--frob"]).is_err());
        assert!(parse(&["extra"]).is_err());
    }
}
