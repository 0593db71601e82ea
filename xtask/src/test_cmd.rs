//! `cargo xtask test`: runs every test of the workspace (unit, multi-process, doc tests) and
//! compiles every example.

use std::process::{Command, ExitCode};

use crate::args::{Arg, Args};

/// One line for the command list of `cargo xtask help`.
pub(crate) const SUMMARY: &str = "run every test (add --long for the full collective matrix)";

/// The help text of `cargo xtask test`.
pub(crate) const USAGE: &str = "\
usage: cargo xtask test [--long] [--release] [--no-ib] [-- CARGO-TEST-ARGS...]

Runs `cargo test --workspace`: unit tests, the multi-process tests (which launch ranks through
the same launcher as `cargo xtask launch`), doc tests, and a compile of every example. GPU
tests report that they did not run when no GPU is present; they never count as passed there.
Then the InfiniBand tests in SoftRoCE guests (`cargo xtask ib-vm --nodes 2`: the transport's
device tests and the host matrix over verbs with 2 ranks in one guest, then across two guests;
about 8 minutes), wherever QEMU is installed
or apt-get can install it (as root); with CI set they must run.

options:
  --long       run the full correctness matrix of the collectives (sets WEAVE_TEST_LONG=1)
  --release    build with optimizations
  --no-ib      leave out the InfiniBand guest (it reports that it did not run)
  -h, --help   print this help
";

/// Runs the command.
pub(crate) fn run(mut args: Args) -> ExitCode {
    let mut long = false;
    let mut release = false;
    let mut ib = true;
    let mut extra = Vec::new();
    loop {
        match args.next() {
            Ok(None) => break,
            Ok(Some(Arg::Flag(f))) if f == "--long" => long = true,
            Ok(Some(Arg::Flag(f))) if f == "--release" => release = true,
            Ok(Some(Arg::Flag(f))) if f == "--no-ib" => ib = false,
            Ok(Some(Arg::Flag(f))) if f == "-h" || f == "--help" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            Ok(Some(Arg::Flag(f))) => {
                eprintln!("error: unknown option {f:?}\nrun `cargo xtask help test` for usage");
                return ExitCode::from(2);
            }
            Ok(Some(Arg::Positional(p))) => extra.push(p),
            Ok(Some(Arg::Separator)) => {}
            Err(e) => {
                eprintln!("error: {e}\nrun `cargo xtask help test` for usage");
                return ExitCode::from(2);
            }
        }
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
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
        Ok(s) if s.success() => ib_guest(ib && extra.is_empty()),
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

/// The InfiniBand guest, when asked for and possible (always under CI).
fn ib_guest(wanted: bool) -> ExitCode {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false");
    if !wanted {
        println!("cargo xtask test: the InfiniBand guest tests did not run (--no-ib, or cargo test filters given)");
        return ExitCode::SUCCESS;
    }
    if !ci && !crate::ib_vm_cmd::guest_possible() {
        println!(
            "cargo xtask test: the InfiniBand guest tests did not run (no qemu-system-x86_64, and no apt-get run as \
             root to install it)"
        );
        return ExitCode::SUCCESS;
    }
    let single = crate::ib_vm_cmd::stage_and_run(&[2], false, &[]);
    let both = single.and_then(|s| if s == ExitCode::SUCCESS { crate::ib_vm_cmd::stage_and_run_pair() } else { Ok(s) });
    match both {
        Ok(status) => status,
        Err(e) => {
            eprintln!("cargo xtask test: the InfiniBand guest: {e}");
            ExitCode::from(1)
        }
    }
}
