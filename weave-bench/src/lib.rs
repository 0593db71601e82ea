//! weave-bench: the nccl-tests-style benchmark of weave's collectives, with Open MPI (host
//! memory) or NCCL (device buffers) on the same ranks in the same run.
//!
//! The binary `weave-bench` (run as `cargo xtask bench`, or `cargo run --release -p
//! weave-bench --`) reads its command line ([`cli`]), builds its workers and drives them:
//! - on host memory (`host_run`), `bench-worker` ranks (src/bin/bench-worker.rs) through
//!   `weave_launch`, and with `--vs-mpi` the Open MPI baseline (`mpi`, `mpi_bench.c`), the
//!   two jobs taking turns per batch (`turns`); across namespace nodes with `--nodes`
//!   (`nodes`, [`node_exec`]); at several world sizes with `--ranks-sweep` (`sweep`);
//! - on GPUs (`gpu_run`), `gpu-bench` ranks (src/bin/gpu-bench.rs), NCCL beside them with
//!   `--vs-nccl`.
//!
//! Every worker prints one JSON line per size ([`record`]); the driver prints the table
//! (`table`) and, if asked, a plot (`plot`). The workers' command lines share their value
//! parsers ([`worker_args`]). `weave-bench scale-model` fits the alpha-beta model of weave's
//! plans to saved lines ([`scale_model`]).

pub mod cli;
mod gpu_run;
mod host_run;
mod mpi;
pub mod node_exec;
mod nodes;
mod plot;
pub mod record;
pub mod scale_model;
mod sweep;
mod table;
pub mod turns;
pub mod worker_args;

use std::process::ExitCode;

use weave_launch::{CancelToken, forward_signals_to};

use crate::cli::{Cli, Command};

/// Runs the command line `cli`: the benchmark, or another command. Exit status 0 when every
/// run finished with no wrong element, 1 when one failed or a result was wrong, 2 for options
/// that do not go together.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Some(Command::ScaleModel(a)) => return scale_model::run(&a),
        Some(Command::NodeExec(a)) => return node_exec::run(&a),
        None => {}
    }
    let a = match cli.bench.settle() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}\nrun `weave-bench --help` (or `cargo xtask help bench`) for usage");
            return ExitCode::from(2);
        }
    };
    let outcome = match (&a.plot_from, &a.plot) {
        (Some(log), Some(svg)) => gpu_run::plot_saved(log, svg, a.op.name()).map(|()| ExitCode::SUCCESS),
        _ => {
            let token = CancelToken::new();
            // Before any thread starts (the launcher's readers inherit the blocked signals).
            if let Err(e) = forward_signals_to(&token) {
                eprintln!("warning: {e}; Ctrl-C will stop only this command, not the ranks");
            }
            let root = host_run::workspace_root();
            let target = host_run::target_dir(&root);
            let on_gpus = a.gpu || (!a.cpu && a.nodes.is_none() && gpu_run::gpu_count().is_some_and(|n| n >= 2));
            if on_gpus {
                gpu_run::bench_gpu(&a, &root, &target, &token)
            } else {
                host_run::bench(&a, &root, &target, &token)
            }
        }
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    })
}
