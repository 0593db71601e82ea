//! `weave-bench`: see the crate documentation, or `weave-bench --help`.

use std::process::ExitCode;

use clap::Parser;
use weave_bench::cli::Cli;

fn main() -> ExitCode {
    weave_bench::run(Cli::parse())
}
