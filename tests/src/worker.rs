//! The entry point of the worker binaries (`rank-worker`, `collectives-worker`, `gpu-worker`):
//! one rank runs one named scenario and reports it the way the integration tests read it, a
//! line `OK SCENARIO rank R: detail` on stdout and exit status 0, or `FAIL SCENARIO rank R:
//! error` on stderr and exit status 1.

use comm_core::{Error, Result};

/// Runs the scenario the command line names (`WORKER SCENARIO [ARG]`): calls
/// `scenario(name, arg)` (`arg` is empty when not given), prints the outcome with this rank
/// (`RANK`) and exits with its status.
pub fn run(scenario: impl FnOnce(&str, &str) -> Result<String>) -> ! {
    install_subscriber();
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_default();
    let arg = args.next().unwrap_or_default();
    let rank = std::env::var("RANK").unwrap_or_default();
    match scenario(&name, &arg) {
        Ok(detail) => {
            println!("OK {name} rank {rank}: {detail}");
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("FAIL {name} rank {rank}: {e}");
            std::process::exit(1);
        }
    }
}

/// The error of a scenario name the worker does not know.
pub fn unknown_scenario(name: &str) -> Error {
    Error::invalid(format!("unknown scenario {name:?}"))
}

/// weave's diagnostics on stderr, filtered by `WEAVE_DEBUG` (every worker binary calls this
/// first); a malformed value is reported and the worker goes on without them.
pub fn install_subscriber() {
    if let Err(e) = comm_core::diagnostics::install_subscriber_from_env() {
        eprintln!("{e}");
    }
}
