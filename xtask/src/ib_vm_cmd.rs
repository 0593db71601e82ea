//! `cargo xtask ib-vm`: the InfiniBand tests on a real verbs device — SoftRoCE in a QEMU guest,
//! since no machine here has an HCA.
//!
//! Builds the transport's test binary and a `collectives-worker` with the feature `ib`, stages
//! them with the guest scripts of `transport-ib/vm/` in `target/ib-vm/run`, and boots one guest
//! with `transport-ib/vm/softroce-guest.sh`, which runs there: the transport's tests with the
//! device tests included, then the host correctness matrix over verbs alone for each world
//! size asked for (and, with `--bench`, the micro bench against perftest). With `--nodes 2`
//! also two guests joined by a virtual wire, one rank each: the same matrix across them. The
//! exit status is the guests' worst.

use std::path::Path;
use std::process::{Command, ExitCode};

use crate::gpu_bundle_cmd::{cargo_artifacts, shell_quote, workspace_root};
use crate::prerequisites::{on_path, running_as_root};

/// Runs the InfiniBand tests in a QEMU guest with SoftRoCE.
///
/// Runs the InfiniBand transport on a real verbs device: SoftRoCE (rdma_rxe) in a QEMU guest
/// (software emulation, no KVM needed), set up on first use (Debian packages, the Debian 12
/// generic kernel unpacked into target/ib-vm; about a minute). In the guest: transport-ib's
/// tests including those that need a device (TEST-FILTERS narrow them), with flags as
/// immediates and again as atomics (WEAVE_IB_FLAG), then the host correctness matrix over verbs
/// alone (WEAVE_TRANSPORTS=ib) with each world size of --ranks. Exits with the guest's status.
/// With --nodes 2, then two guests (one vCPU each) joined by a virtual wire (UDP on 127.0.0.1),
/// rxe0 on each one's eth0, run the matrix with one rank per guest.
#[derive(Debug, clap::Args)]
pub(crate) struct IbVmArgs {
    /// World sizes of the matrix over ib, separated by commas (0 skips it)
    #[arg(long, value_name = "N,...", default_value = "2", value_delimiter = ',')]
    ranks: Vec<usize>,
    /// 1, or 2: also the two-guest run
    #[arg(long, default_value = "1", value_parser = clap::value_parser!(u8).range(1..=2))]
    nodes: u8,
    /// Also run the micro bench against perftest's ib_write_bw / ib_write_lat
    #[arg(long)]
    bench: bool,
    /// Filters for transport-ib's tests
    #[arg(value_name = "TEST-FILTERS", last = true)]
    filters: Vec<String>,
}

/// Runs `cargo xtask ib-vm`.
pub(crate) fn run(a: &IbVmArgs) -> ExitCode {
    let ranks: Vec<usize> = a.ranks.iter().copied().filter(|&n| n > 0).collect();
    if let Err(e) =
        crate::prerequisites::provide_packages(&crate::prerequisites::packages(true), "cargo xtask ib-vm", true)
    {
        eprintln!("cargo xtask ib-vm: {e}");
        return ExitCode::from(1);
    }
    let result = stage_and_run(&ranks, a.bench, &a.filters)
        .and_then(|status| if a.nodes == 2 && status == ExitCode::SUCCESS { stage_and_run_pair() } else { Ok(status) });
    match result {
        Ok(status) => status,
        Err(e) => {
            eprintln!("cargo xtask ib-vm: {e}");
            ExitCode::from(1)
        }
    }
}

/// The matrix across two guests, one rank each; `Ok(status)` is the worse guest's.
pub(crate) fn stage_and_run_pair() -> Result<ExitCode, String> {
    let root = workspace_root()?;
    let vm = root.join("transport-ib/vm");
    let run = root.join("target/ib-vm/pair");
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).map_err(|e| format!("create {}: {e}", run.display()))?;
    stage_ib_worker(&run)?;
    let script = "#!/bin/sh\n# Written by cargo xtask ib-vm --nodes 2: rank $WEAVE_GUEST of 2, one per guest.\n\
        RANK=$WEAVE_GUEST LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 \\\n  \
        WEAVE_TRANSPORTS=ib WEAVE_TIMEOUT=120 ./collectives-worker matrix\n";
    std::fs::write(run.join("test.sh"), script).map_err(|e| format!("write test.sh: {e}"))?;
    guest_status(Command::new(vm.join("softroce-guest.sh")).arg("--pair").arg(&run))
}

/// Builds `collectives-worker` with the feature `ib` and copies it into `run`.
fn stage_ib_worker(run: &Path) -> Result<(), String> {
    let worker =
        cargo_artifacts(&strings(&["build", "-p", "weave-tests", "--features", "ib", "--bin", "collectives-worker"]))?
            .into_iter()
            .find(|a| a.name == "collectives-worker")
            .ok_or("cargo built no collectives-worker")?;
    copy(&worker.executable, &run.join("collectives-worker"))
}

/// Runs the guest script; its exit status as ours.
fn guest_status(command: &mut Command) -> Result<ExitCode, String> {
    let status = command.status().map_err(|e| format!("run softroce-guest.sh: {e}"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::from(1),
    })
}

/// Runs the guest with `ranks` world sizes of the matrix; `Ok(status)` is the guest's.
pub(crate) fn stage_and_run(ranks: &[usize], bench: bool, filters: &[String]) -> Result<ExitCode, String> {
    let root = workspace_root()?;
    let vm = root.join("transport-ib/vm");
    let run = root.join("target/ib-vm/run");
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).map_err(|e| format!("create {}: {e}", run.display()))?;

    let tests = cargo_artifacts(&strings(&["test", "-p", "transport-ib", "--no-run"]))?
        .into_iter()
        .find(|a| a.is_test && a.name == "transport_ib")
        .ok_or("cargo built no test binary for transport-ib")?;
    copy(&tests.executable, &run.join("ib-tests"))?;
    stage_ib_worker(&run)?;
    copy(&vm.join("matrix.sh"), &run.join("matrix.sh"))?;
    let mut script = String::from("#!/bin/sh\n# Written by cargo xtask ib-vm.\n");
    // Both ways a flag travels (transport-ib's `flags` module): the default, then atomics. The
    // fuzz seeds' check reads the source tree, which the guest lacks (it ran on the host).
    let filters = filters.iter().map(|f| shell_quote(f)).collect::<Vec<_>>().join(" ");
    let tests = format!("./ib-tests --include-ignored --test-threads=1 --skip fuzzing:: {filters} || exit 1\n");
    script.push_str(&tests);
    script.push_str(&format!("WEAVE_IB_FLAG=atomic {tests}"));
    if !ranks.is_empty() {
        let worlds: Vec<String> = ranks.iter().map(ToString::to_string).collect();
        script.push_str(&format!("WORLDS='{}' sh ./matrix.sh || exit 1\n", worlds.join(" ")));
    }
    if bench {
        let example =
            cargo_artifacts(&strings(&["build", "--release", "-p", "transport-ib", "--example", "write_bench"]))?
                .into_iter()
                .find(|a| a.name == "write_bench")
                .ok_or("cargo built no write_bench")?;
        copy(&example.executable, &run.join("write_bench"))?;
        copy(&vm.join("bench.sh"), &run.join("bench.sh"))?;
        script.push_str("sh ./bench.sh || exit 1\n");
    }
    std::fs::write(run.join("test.sh"), script).map_err(|e| format!("write test.sh: {e}"))?;
    guest_status(Command::new(vm.join("softroce-guest.sh")).arg(&run))
}

/// Whether this machine can run the guest: QEMU is installed, or can be (Debian's apt-get, run
/// as root).
pub(crate) fn guest_possible() -> bool {
    on_path("qemu-system-x86_64") || (on_path("apt-get") && running_as_root())
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(ToString::to_string).collect()
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map(drop).map_err(|e| format!("copy {} to {}: {e}", from.display(), to.display()))
}
