//! `cargo xtask test`: runs every test of the workspace (unit, multi-process, doc tests) and
//! compiles every example.

use std::process::{Command, ExitCode};

use crate::args::{Arg, Args, UsageError};

/// One line for the command list of `cargo xtask help`.
pub(crate) const SUMMARY: &str = "run every test (add --long for the full collective matrix)";

/// The help text of `cargo xtask test`.
pub(crate) const USAGE: &str = "\
usage: cargo xtask test [--long] [--release] [--no-netns] [--no-ib] [-- CARGO-TEST-ARGS...]

Runs `cargo test --workspace`: unit tests, the multi-process tests (which launch ranks through
the same launcher as `cargo xtask launch`), doc tests, and a compile of every example. GPU
tests report that they did not run when no GPU is present; they never count as passed there.
Then the namespace-node tests (ignored by plain `cargo test`: they need root to make network
namespaces; about 30 s): the launcher's nodes, nothing left behind after a killed rank or a
killed launcher, a node fabric shared by several jobs, `cargo xtask node-exec` (mpirun's agent
of bench --nodes), the collectives matrix across namespace nodes 2x2 and 3x1, and --rate
shaping; wherever namespaces can be made; with CI set they must run.
Then the InfiniBand tests in SoftRoCE guests (`cargo xtask ib-vm --nodes 2`: the transport's
device tests and the host matrix over verbs with 2 ranks in one guest, then across two guests;
about 8 minutes), wherever QEMU is installed
or apt-get can install it (as root); with CI set they must run.

options:
  --long       run the full correctness matrix of the collectives (sets WEAVE_TEST_LONG=1)
  --release    build with optimizations
  --no-netns   leave out the namespace-node tests (they report that they did not run)
  --no-ib      leave out the InfiniBand guest (it reports that it did not run)
  -h, --help   print this help
";

/// Runs the command.
pub(crate) fn run(args: Args) -> ExitCode {
    let mut long = false;
    let mut release = false;
    let mut ib = true;
    let mut netns = true;
    let mut extra = Vec::new();
    let read = crate::read_args(args, "test", USAGE, |arg, _| {
        match arg {
            Arg::Flag(f) if f == "--long" => long = true,
            Arg::Flag(f) if f == "--release" => release = true,
            Arg::Flag(f) if f == "--no-ib" => ib = false,
            Arg::Flag(f) if f == "--no-netns" => netns = false,
            Arg::Flag(f) => return Err(UsageError(format!("unknown option {f:?}"))),
            Arg::Positional(p) => extra.push(p),
            Arg::Separator => {}
        }
        Ok(())
    });
    if let Some(exit) = read {
        return exit;
    }
    let mut cmd = Command::new(cargo());
    cmd.args(["test", "--workspace"]);
    if release {
        cmd.arg("--release");
    }
    if !extra.is_empty() {
        cmd.arg("--").args(&extra);
    }
    if long {
        cmd.env("WEAVE_TEST_LONG", "1");
    }
    match cmd.status() {
        Ok(s) if s.success() => match namespace_tests(netns && extra.is_empty(), release) {
            code if code == ExitCode::SUCCESS => ib_guest(ib && extra.is_empty()),
            code => code,
        },
        Ok(s) => {
            eprintln!("cargo xtask test: cargo test failed ({s})");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("cargo xtask test: could not run cargo: {e}");
            ExitCode::from(1)
        }
    }
}

fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The `#[ignore]`d namespace-node tests (their names hold `namespace`), when asked for and
/// possible (always under CI, where they fail if namespaces cannot be made).
fn namespace_tests(wanted: bool, release: bool) -> ExitCode {
    if !wanted {
        println!("cargo xtask test: the namespace-node tests did not run (--no-netns, or cargo test filters given)");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = weave_launch::namespace_nodes_available(None)
        && !ci()
    {
        println!("cargo xtask test: the namespace-node tests did not run (they need root: {e})");
        return ExitCode::SUCCESS;
    }
    let targets = [
        &["-p", "weave-launch"][..],
        &["-p", "xtask", "--test", "node_exec"],
        &["-p", "weave-tests", "--test", "collectives"],
    ];
    for target in targets {
        let package = target[1];
        let mut cmd = Command::new(cargo());
        cmd.arg("test").args(target);
        if release {
            cmd.arg("--release");
        }
        cmd.args(["--", "--ignored", "namespace"]);
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("cargo xtask test: the namespace-node tests of {package} failed ({s})");
                return ExitCode::from(1);
            }
            Err(e) => {
                eprintln!("cargo xtask test: could not run cargo: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}

/// The InfiniBand guest, when asked for and possible (always under CI).
fn ib_guest(wanted: bool) -> ExitCode {
    if !wanted {
        println!("cargo xtask test: the InfiniBand guest tests did not run (--no-ib, or cargo test filters given)");
        return ExitCode::SUCCESS;
    }
    if !ci() && !crate::ib_vm_cmd::guest_possible() {
        println!(
            "cargo xtask test: the InfiniBand guest tests did not run (no qemu-system-x86_64, and no apt-get run as \
             root to install it)"
        );
        return ExitCode::SUCCESS;
    }
    let single = crate::ib_vm_cmd::stage_and_run(&[2, 4], false, &[]);
    let both = single.and_then(|s| if s == ExitCode::SUCCESS { crate::ib_vm_cmd::stage_and_run_pair() } else { Ok(s) });
    match both {
        Ok(status) => status,
        Err(e) => {
            eprintln!("cargo xtask test: the InfiniBand guest: {e}");
            ExitCode::from(1)
        }
    }
}
