//! `cargo xtask test`: provides what the tests need ([`crate::prerequisites`]), then runs every
//! test of the workspace (unit, multi-process, doc tests), compiles every example, compiles every
//! kernel with a second NVRTC, and runs the namespace-node and InfiniBand guest tests.

use std::process::{Command, ExitCode};

use crate::prerequisites::Provided;

/// Runs every test (add --long for the full collective matrix).
///
/// First it provides what the tests need, before building anything: the Debian packages of the
/// verbs bindings' build (cmake, make, clang, libclang-dev, libibverbs-dev, libnl-3-dev,
/// libnl-route-3-dev, pkg-config, python3), g++ and python3-pip, and, for the InfiniBand guest,
/// qemu-system-x86 and the guest's userland — installed with apt-get when run as root,
/// otherwise it prints the apt-get command to run and stops; then NVRTC 13.0 and 12.2 from PyPI
/// into $WEAVE_TOOLS_CACHE (default ~/.cache/weave), so the kernel tests compile every CUDA
/// kernel without a GPU. It says what it installed.
///
/// Then it runs `cargo test --workspace`: unit tests, the multi-process tests (which launch
/// ranks through the same launcher as `cargo xtask launch`), doc tests, and a compile of every
/// example. GPU tests report that they did not run when no GPU is present; they never count as
/// passed there. Then the kernels crate's tests once more with NVRTC 12.2 (what a CUDA 12
/// driver loads). Then `cargo clippy` of `collectives` without the GPU engine and with it but
/// without CUDA IPC (about a minute). Then the namespace-node tests (ignored by plain `cargo test`: they need root
/// to make network namespaces; about 40 s): the launcher's nodes, nothing left behind after a
/// killed rank or a killed launcher, a node fabric shared by several jobs, `weave-bench
/// node-exec` (mpirun's agent of bench --nodes), the collectives matrix across namespace nodes
/// 2x2 and 3x1, --rate shaping, a whole node lost of 2x2 and 4x2 with the survivors shrinking
/// and carrying on, and a hostile process on a 2x2 job's network; wherever namespaces can be
/// made; with CI set they must run. Then the InfiniBand tests in SoftRoCE guests (`cargo xtask
/// ib-vm --nodes 2`: the transport's device tests and the host matrix over verbs with 2 ranks
/// in one guest, then across two guests; about 8 minutes), wherever QEMU is installed or
/// apt-get can install it (as root); with CI set they must run. Then the loom models of the
/// lock-free core (`cargo xtask loom`, about 2 minutes with their build). Then every fuzz
/// target for a few seconds each (`cargo xtask fuzz --time 6`, about 5 minutes with its build;
/// the nightly toolchain and cargo-fuzz are installed when missing). Then the host matrix of 2
/// ranks under AddressSanitizer (`cargo xtask sanitize --ranks 2`, about 4 minutes with its
/// build).
#[derive(Debug, clap::Args)]
pub(crate) struct TestArgs {
    /// Run the full correctness matrix of the collectives (sets WEAVE_TEST_LONG=1)
    #[arg(long)]
    long: bool,
    /// Check what the tests need, print the commands that provide what is missing, but install
    /// nothing
    #[arg(long)]
    no_install: bool,
    /// Build with optimizations
    #[arg(long)]
    release: bool,
    /// Leave out the namespace-node tests (they report that they did not run)
    #[arg(long)]
    no_netns: bool,
    /// Leave out the InfiniBand guest (it reports that it did not run)
    #[arg(long)]
    no_ib: bool,
    /// Leave out the fuzz targets (it reports that they did not run)
    #[arg(long)]
    no_fuzz: bool,
    /// Leave out the matrix under AddressSanitizer (it reports that it did not run)
    #[arg(long)]
    no_sanitize: bool,
    /// Arguments for `cargo test` after its `--` (test filters): only `cargo test` runs then
    #[arg(value_name = "CARGO-TEST-ARGS", last = true)]
    extra: Vec<std::ffi::OsString>,
}

/// Runs `cargo xtask test`.
pub(crate) fn run(a: &TestArgs) -> ExitCode {
    let (long, release, extra) = (a.long, a.release, &a.extra);
    let (ib, netns, fuzz, sanitize, install) = (!a.no_ib, !a.no_netns, !a.no_fuzz, !a.no_sanitize, !a.no_install);
    let guest = ib && extra.is_empty() && (ci() || crate::ib_vm_cmd::guest_possible());
    let tools = match crate::prerequisites::provide(guest, ci(), install) {
        Ok(tools) => tools,
        Err(e) => {
            eprintln!("cargo xtask test: {e}");
            return ExitCode::from(1);
        }
    };
    let env = TestEnv { tools, release };
    let mut cmd = env.cargo();
    cmd.args(["test", "--workspace"]);
    if release {
        cmd.arg("--release");
    }
    if !extra.is_empty() {
        cmd.arg("--").args(extra);
    }
    if long {
        cmd.env("WEAVE_TEST_LONG", "1");
    }
    let everything = extra.is_empty();
    let outcome = run_cargo(&mut cmd, "cargo test")
        .and_then(|()| kernels_with_nvrtc_12(&env, everything))
        .and_then(|()| feature_builds(&env, everything))
        .and_then(|()| namespace_tests(&env, netns && everything))
        .and_then(|()| ib_guest(ib && everything))
        .and_then(|()| loom_models(everything))
        .and_then(|()| fuzz_targets(fuzz && everything))
        .and_then(|()| sanitized_matrix(sanitize && everything));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cargo xtask test: {e}");
            ExitCode::from(1)
        }
    }
}

/// How every cargo command of the test runs: with the NVRTC provided on the library path.
struct TestEnv {
    tools: Provided,
    release: bool,
}

impl TestEnv {
    /// `cargo`, with NVRTC 13 (where provided) first on `LD_LIBRARY_PATH`. Release builds with
    /// NVRTC loadable would embed every kernel for three architectures (half an hour of NVRTC on
    /// two cores); the kernel tests compile each kernel instead, so `WEAVE_BUILD_KERNELS` is 0
    /// unless set.
    fn cargo(&self) -> Command {
        let mut cmd = Command::new(cargo());
        if let Some(dir) = &self.tools.nvrtc_13 {
            cmd.env("LD_LIBRARY_PATH", prepend_path(dir));
        }
        if std::env::var_os("WEAVE_BUILD_KERNELS").is_none() {
            cmd.env("WEAVE_BUILD_KERNELS", "0");
        }
        cmd
    }
}

/// `LD_LIBRARY_PATH` with `dir` first.
fn prepend_path(dir: &std::path::Path) -> std::ffi::OsString {
    let mut dirs = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(dirs).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// Runs `cmd`; `Err` names `what` when it fails or cannot start.
fn run_cargo(cmd: &mut Command, what: &str) -> Result<(), String> {
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{what} failed ({s})")),
        Err(e) => Err(format!("could not run cargo for {what}: {e}")),
    }
}

/// The kernels crate's tests once more with NVRTC 12.2, which a CUDA 12 driver loads (weave
/// loads the NVRTC of the driver's major version): every kernel must compile with it too.
fn kernels_with_nvrtc_12(env: &TestEnv, wanted: bool) -> Result<(), String> {
    if !wanted {
        return Ok(());
    }
    let Some(dir) = &env.tools.nvrtc_12 else {
        println!("cargo xtask test: the kernels' compile with NVRTC 12 did not run (NVRTC 12 could not be installed)");
        return Ok(());
    };
    let mut cmd = env.cargo();
    cmd.args(["test", "-p", "kernels", "--lib"]);
    if env.release {
        cmd.arg("--release");
    }
    cmd.env("WEAVE_NVRTC", "libnvrtc.so.12").env("LD_LIBRARY_PATH", prepend_path(dir));
    run_cargo(&mut cmd, "the kernels' tests with NVRTC 12")
}

/// The feature sets of `collectives` that the workspace build does not cover, checked with
/// `cargo clippy -D warnings`: no GPU engine, and the GPU engine without CUDA IPC (device
/// calls over tcp, and over verbs with device memory).
const FEATURE_SETS: [&str; 3] = ["shm,tcp", "shm,tcp,cuda", "tcp,ib,cuda"];

/// Checks that `collectives` builds cleanly with each of [`FEATURE_SETS`].
fn feature_builds(env: &TestEnv, wanted: bool) -> Result<(), String> {
    if !wanted {
        return Ok(());
    }
    for features in FEATURE_SETS {
        let mut cmd = env.cargo();
        cmd.args(["clippy", "-p", "collectives", "--all-targets", "--no-default-features", "--features", features]);
        cmd.args(["--", "-D", "warnings"]);
        run_cargo(&mut cmd, &format!("collectives with the features {features}"))?;
    }
    Ok(())
}

fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The `#[ignore]`d namespace-node tests (their names hold `namespace`), when asked for and
/// possible (always under CI, where they fail if namespaces cannot be made).
fn namespace_tests(env: &TestEnv, wanted: bool) -> Result<(), String> {
    if !wanted {
        println!("cargo xtask test: the namespace-node tests did not run (--no-netns, or cargo test filters given)");
        return Ok(());
    }
    if let Err(e) = weave_launch::namespace_nodes_available(None)
        && !ci()
    {
        println!("cargo xtask test: the namespace-node tests did not run (they need root: {e})");
        return Ok(());
    }
    let targets = [
        &["-p", "weave-launch"][..],
        &["-p", "weave-bench", "--test", "node_exec"],
        &["-p", "weave-bench", "--test", "workers"],
        &["-p", "weave-tests", "--test", "collectives"],
        &["-p", "weave-tests", "--test", "elastic"],
        &["-p", "weave-tests", "--test", "hostile"],
        &["-p", "weave-nccl", "--test", "across_nodes"],
    ];
    for target in targets {
        let mut cmd = env.cargo();
        cmd.arg("test").args(target);
        if env.release {
            cmd.arg("--release");
        }
        cmd.args(["--", "--ignored", "namespace"]);
        run_cargo(&mut cmd, &format!("the namespace-node tests of {}", target[1]))?;
    }
    Ok(())
}

/// The loom models, unless cargo test filters were given.
fn loom_models(wanted: bool) -> Result<(), String> {
    if !wanted {
        println!("cargo xtask test: the loom models did not run (cargo test filters given)");
        return Ok(());
    }
    crate::loom_cmd::models(&[]).map_err(|e| format!("the loom models: {e}"))
}

/// Seconds each fuzz target runs in the test: all of them together within about 5 minutes.
const FUZZ_SECONDS: u64 = 6;

/// Every fuzz target for [`FUZZ_SECONDS`], when asked for; a finding fails the test.
fn fuzz_targets(wanted: bool) -> Result<(), String> {
    if !wanted {
        println!("cargo xtask test: the fuzz targets did not run (--no-fuzz, or cargo test filters given)");
        return Ok(());
    }
    match crate::fuzz_cmd::fuzz(FUZZ_SECONDS, &[], false) {
        Ok(true) => Ok(()),
        Ok(false) => Err("a fuzz target found something (its input is in fuzz/artifacts)".into()),
        Err(e) => Err(format!("the fuzz targets: {e}")),
    }
}

/// World sizes of the matrix under AddressSanitizer in the test: the 2-rank one (4 ranks take
/// as long again; `cargo xtask sanitize` runs both by default).
const SANITIZED_RANKS: &[usize] = &[2];

/// The host matrix under AddressSanitizer, when asked for; a report fails the test.
fn sanitized_matrix(wanted: bool) -> Result<(), String> {
    if !wanted {
        println!(
            "cargo xtask test: the matrix under AddressSanitizer did not run (--no-sanitize, or cargo test filters given)"
        );
        return Ok(());
    }
    match crate::sanitize_cmd::sanitize(SANITIZED_RANKS) {
        Ok(true) => Ok(()),
        Ok(false) => Err("the matrix under AddressSanitizer failed or reported something (see above)".into()),
        Err(e) => Err(format!("the matrix under AddressSanitizer: {e}")),
    }
}

/// The InfiniBand guest, when asked for and possible (always under CI).
fn ib_guest(wanted: bool) -> Result<(), String> {
    if !wanted {
        println!("cargo xtask test: the InfiniBand guest tests did not run (--no-ib, or cargo test filters given)");
        return Ok(());
    }
    if !ci() && !crate::ib_vm_cmd::guest_possible() {
        println!(
            "cargo xtask test: the InfiniBand guest tests did not run (no qemu-system-x86_64, and no apt-get run as \
             root to install it)"
        );
        return Ok(());
    }
    let single = crate::ib_vm_cmd::stage_and_run(&[2, 4], false, &[]);
    let both = single.and_then(|s| if s == ExitCode::SUCCESS { crate::ib_vm_cmd::stage_and_run_pair() } else { Ok(s) });
    match both {
        Ok(status) if status == ExitCode::SUCCESS => Ok(()),
        Ok(status) => Err(format!("the InfiniBand guest failed ({status:?})")),
        Err(e) => Err(format!("the InfiniBand guest: {e}")),
    }
}
