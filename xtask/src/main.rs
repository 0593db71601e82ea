//! `cargo xtask <command>`: developer tasks for weave.
//!
//! Each command lives in its own module with its options as a clap `Args` struct (whose doc
//! comment is the command's help) and a `run` that takes them; add it to [`Task`] to make it
//! reachable. `bench` and `scale-model` pass their arguments to `weave-bench`.

mod bench_cmd;
mod fuzz_cmd;
mod gpu_bundle_cmd;
mod ib_vm_cmd;
mod launch_cmd;
mod loom_cmd;
mod nccl_cmd;
mod prerequisites;
mod sanitize_cmd;
mod test_cmd;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer tasks for weave.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", subcommand_required = true, arg_required_else_help = true)]
struct Xtask {
    #[command(subcommand)]
    task: Task,
}

/// Every command, in the order `help` lists them.
#[derive(Debug, Subcommand)]
enum Task {
    GpuBundle(gpu_bundle_cmd::GpuBundleArgs),
    Fuzz(fuzz_cmd::FuzzArgs),
    IbVm(ib_vm_cmd::IbVmArgs),
    Launch(launch_cmd::LaunchArgs),
    Loom(loom_cmd::LoomArgs),
    Multinode(launch_cmd::MultinodeArgs),
    Nccl(nccl_cmd::NcclArgs),
    Sanitize(sanitize_cmd::SanitizeArgs),
    Test(test_cmd::TestArgs),
    /// nccl-tests-style benchmark (weave-bench; --vs-mpi: Open MPI too); `cargo xtask help
    /// bench` prints its options
    #[command(disable_help_flag = true)]
    Bench(bench_cmd::Passed),
    /// The alpha-beta model of the plans, checked against measured points (weave-bench
    /// scale-model)
    #[command(disable_help_flag = true)]
    ScaleModel(bench_cmd::Passed),
}

fn main() -> ExitCode {
    // `help bench` is weave-bench's help, which clap here does not know.
    let args: Vec<OsString> = std::env::args_os().collect();
    if let [_, help, topic] = &args[..]
        && help == "help"
        && (topic == "bench" || topic == "scale-model")
    {
        let command: &[&str] = if topic == "bench" { &[] } else { &["scale-model"] };
        return bench_cmd::forward(command, vec!["--help".into()]);
    }
    match Xtask::parse_from(args).task {
        Task::GpuBundle(a) => gpu_bundle_cmd::run(&a),
        Task::Fuzz(a) => fuzz_cmd::run(&a),
        Task::IbVm(a) => ib_vm_cmd::run(&a),
        Task::Launch(a) => launch_cmd::run(a),
        Task::Loom(a) => loom_cmd::run(&a),
        Task::Multinode(a) => launch_cmd::run_multinode(a),
        Task::Nccl(a) => nccl_cmd::run(&a),
        Task::Sanitize(a) => sanitize_cmd::run(&a),
        Task::Test(a) => test_cmd::run(&a),
        Task::Bench(a) => bench_cmd::forward(&[], a.args),
        Task::ScaleModel(a) => bench_cmd::forward(&["scale-model"], a.args),
    }
}
